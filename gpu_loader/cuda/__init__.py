"""Everything that touches a GPU. Importing this package touches no device and needs no GPU package."""

from gpu_loader.cuda._device import cuda_available

__all__ = ["cuda_available"]
