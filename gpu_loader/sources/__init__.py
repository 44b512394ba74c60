"""gpu_loader.sources (see README.md in this folder)."""
