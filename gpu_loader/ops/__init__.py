"""gpu_loader.ops (see README.md in this folder)."""
