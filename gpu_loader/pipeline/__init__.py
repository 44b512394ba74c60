"""gpu_loader.pipeline (see README.md in this folder)."""
