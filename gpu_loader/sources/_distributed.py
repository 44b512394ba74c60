"""Which shard of the data this process reads: ``(rank, world_size)``."""

from __future__ import annotations

import os
import sys


def resolve_distributed(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` from, in order: the arguments, an initialised
    ``torch.distributed`` process group, the ``RANK``/``WORLD_SIZE`` variables that
    torchrun sets, else ``(0, 1)``.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(
                f"pass both `rank` and `world_size` or neither (to detect them), "
                f"got rank={rank!r}, world_size={world_size!r}"
            )
        return _validated(rank, world_size, "the arguments")
    from_torch = _from_torch_distributed()
    if from_torch is not None:
        return _validated(*from_torch, "torch.distributed")
    return _from_environment()


def _from_torch_distributed() -> tuple[int, int] | None:
    # A process group can only be initialised after torch was imported, so looking in
    # sys.modules is exact and never pays torch's import time for a CPU-only user.
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def _from_environment() -> tuple[int, int]:
    rank_s, world_s = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank_s is None and world_s is None:
        return 0, 1
    if rank_s is None or world_s is None:
        raise ValueError(
            f"found only one of RANK={rank_s!r} and WORLD_SIZE={world_s!r} in the environment; "
            "set both (torchrun does) or pass rank= and world_size= explicitly"
        )
    try:
        rank, world_size = int(rank_s), int(world_s)
    except ValueError:
        raise ValueError(
            f"RANK={rank_s!r} and WORLD_SIZE={world_s!r} in the environment must be integers"
        ) from None
    return _validated(rank, world_size, "the RANK/WORLD_SIZE environment variables")


def _validated(rank: int, world_size: int, source: str) -> tuple[int, int]:
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` from {source} must be an int, got {value!r}")
    if world_size < 1:
        raise ValueError(f"`world_size` from {source} must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(
            f"`rank` from {source} must be in [0, {world_size}) for world_size={world_size}, "
            f"got {rank}"
        )
    return rank, world_size
