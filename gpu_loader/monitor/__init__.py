"""gpu_loader.monitor (see README.md in this folder)."""
