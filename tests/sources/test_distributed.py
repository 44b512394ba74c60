"""resolve_distributed: arguments, torch.distributed, RANK/WORLD_SIZE, default; a real gloo run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from gpu_loader.sources import Sampler, resolve_distributed


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def _fake_dist(rank: int, world_size: int, initialized: bool = True) -> types.ModuleType:
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: initialized  # type: ignore[attr-defined]
    dist.get_rank = lambda: rank  # type: ignore[attr-defined]
    dist.get_world_size = lambda: world_size  # type: ignore[attr-defined]
    return dist


def test_default_is_single_process() -> None:
    assert resolve_distributed() == (0, 1)


def test_arguments_win_over_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setitem(sys.modules, "torch.distributed", _fake_dist(2, 8))
    assert resolve_distributed(0, 2) == (0, 2)


def test_initialised_process_group_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setitem(sys.modules, "torch.distributed", _fake_dist(2, 8))
    assert resolve_distributed() == (2, 8)
    monkeypatch.setitem(sys.modules, "torch.distributed", _fake_dist(2, 8, initialized=False))
    assert resolve_distributed() == (1, 4)


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert resolve_distributed() == (3, 4)
    assert Sampler(10, seed=0).world_size == 4
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match=r"RANK/WORLD_SIZE.*\[0, 4\)"):
        resolve_distributed()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="must be integers"):
        resolve_distributed()
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="only one of"):
        resolve_distributed()


def test_a_process_group_started_after_the_sampler_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Built before init_process_group (no torchrun variables): rank 0 of 1, which every
    # rank would be, each reading the whole dataset. Iterating then must say so.
    detected, explicit = Sampler(10), Sampler(10, rank=0, world_size=1)
    detected.check_distributed()  # no process group yet: nothing to compare
    monkeypatch.setitem(sys.modules, "torch.distributed", _fake_dist(1, 2))
    with pytest.raises(RuntimeError, match=r"rank 0 of 1 .* now says rank 1 of 2"):
        detected.check_distributed()
    explicit.check_distributed()  # the caller chose: left alone
    Sampler(10).check_distributed()  # built after: agrees


@pytest.mark.parametrize(
    ("rank", "world_size", "error", "match"),
    [
        (0, None, ValueError, "both"),
        (None, 2, ValueError, "both"),
        (0, 0, ValueError, "world_size"),
        (-1, 2, ValueError, "rank"),
        (2, 2, ValueError, "rank"),
        (0.0, 1, TypeError, "rank"),
    ],
)
def test_bad_arguments(rank: object, world_size: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        resolve_distributed(rank, world_size)  # type: ignore[arg-type]


WORKER = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from gpu_loader.sources import Sampler

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    try:
        s = Sampler(101, seed=5)  # rank and world size come from the process group
        s.set_epoch(2)
        with open(out, "w") as f:
            json.dump({"rank": s.rank, "world_size": s.world_size, "indices": s.indices().tolist()}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_gloo_processes_agree_with_explicit_ranks(tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["MASTER_ADDR"] = "127.0.0.1"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(r), str(port), str(outs[r])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert [p.returncode for p in procs] == [0, 0], logs
    for r, out in enumerate(outs):
        got = json.loads(out.read_text())
        explicit = Sampler(101, seed=5, rank=r, world_size=2)
        explicit.set_epoch(2)
        assert (got["rank"], got["world_size"]) == (r, 2)
        assert got["indices"] == explicit.indices().tolist()
