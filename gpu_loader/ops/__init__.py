"""gpu_loader.ops: transform specs and the CPU decode + transform path (see README.md)."""

from gpu_loader.ops._backend import CpuBackend, cpu_backend
from gpu_loader.ops._decode import DEFAULT_MAX_PIXELS, DecodedImage, DecodeError, decode, probe_size
from gpu_loader.ops._load import load_into
from gpu_loader.ops._transform import transform_into
from gpu_loader.ops._transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CropParams,
    EvalTransform,
    OutputDtype,
    TrainTransform,
)

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CpuBackend",
    "CropParams",
    "DecodeError",
    "DecodedImage",
    "EvalTransform",
    "OutputDtype",
    "TrainTransform",
    "cpu_backend",
    "decode",
    "load_into",
    "probe_size",
    "transform_into",
]
