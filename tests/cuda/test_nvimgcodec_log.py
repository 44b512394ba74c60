"""nvImageCodec's own log stays off: the loader reports each bad file with its key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A fresh process each: nvImageCodec reads its log level once, at import.
SCRIPT = """
import os, sys
from gpu_loader.cuda._nvimgcodec import NvImageCodecDecoder
decoder = NvImageCodecDecoder(device_id=None)
jpeg = bytes.fromhex("ffd8ffe000104a46494600010100000100010000") + bytes(40)
print(decoder.decode([memoryview(jpeg)], None))
print("env:", os.environ.get("PYNVIMGCODEC_VERBOSITY"))
"""


def run(env_level: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYNVIMGCODEC_VERBOSITY"}
    if env_level is not None:
        env["PYNVIMGCODEC_VERBOSITY"] = env_level
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_file_nvimgcodec_cannot_parse_prints_nothing_and_leaves_the_env_alone() -> None:
    done = run(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[None]", "env: None"]  # failed; the variable is gone
    assert "ERROR" not in done.stderr and "WARNING" not in done.stderr, done.stderr


@pytest.mark.parametrize("level", ["1", "2"])
def test_a_level_the_user_set_is_kept(level: str) -> None:
    done = run(level)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[None]", f"env: {level}"]
    assert "[ERROR]" in done.stderr  # nvImageCodec's own line, as the user asked
