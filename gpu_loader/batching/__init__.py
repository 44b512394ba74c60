"""gpu_loader.batching (see README.md in this folder)."""
