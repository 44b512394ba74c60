"""The demo's one-sentence reading of its own figures."""

from __future__ import annotations

from gpu_loader.demo import _reading


def test_a_waiting_loop_names_the_step_that_would_keep_up() -> None:
    text = _reading(rate=800.0, stall=0.6, batch_size=64, step_s=0.02)
    assert "consumes 3,200 samples/s (64 per 20 ms)" in text
    assert "delivered 800/s" in text and "about 80 ms or more (--step-ms)" in text


def test_a_loop_that_did_not_wait_says_the_step_set_the_pace() -> None:
    text = _reading(rate=600.0, stall=0.01, batch_size=64, step_s=0.1)
    assert "kept up" in text and "640 samples/s" in text


def test_nothing_to_read_without_a_step_or_a_rate() -> None:
    assert _reading(rate=900.0, stall=0.9, batch_size=64, step_s=0.0) == ""
    assert _reading(rate=0.0, stall=0.0, batch_size=64, step_s=0.02) == ""
