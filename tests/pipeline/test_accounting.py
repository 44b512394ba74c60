"""Random pipelines: every item is delivered once, skipped, or recorded as failed; never lost."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_loader.pipeline import SKIP, PipelineBuilder

stage_st = st.tuples(
    st.integers(min_value=1, max_value=6),  # concurrency
    st.sampled_from(["input", "completion"]),
    st.sampled_from(["plain", "generator"]),
)


def make_op(index: int, kind: str, fail_mod: int, skip_mod: int) -> Any:
    # Each stage tags the value so failures and skips are decided per stage and value.
    def decide(x: int) -> Any:
        if random.random() < 0.3:
            time.sleep(0.0002)
        if (x + index) % fail_mod == 0:
            raise ValueError(f"stage {index} rejects {x}")
        if (x * 7 + index) % skip_mod == 0:
            return SKIP
        return x

    def plain(x: int) -> Any:
        return decide(x)

    def gen(x: int) -> Any:
        out = decide(x)
        if out is not SKIP:
            yield out

    return plain if kind == "plain" else gen


@settings(max_examples=25, deadline=None)
@given(
    stages=st.lists(stage_st, min_size=1, max_size=3),
    n=st.integers(min_value=0, max_value=120),
    fail_mod=st.integers(min_value=3, max_value=13),
    skip_mod=st.integers(min_value=3, max_value=13),
)
def test_every_item_is_accounted_for(
    stages: list[tuple[int, str, str]], n: int, fail_mod: int, skip_mod: int
) -> None:
    builder = PipelineBuilder().add_source(range(n))
    for i, (conc, order, kind) in enumerate(stages):
        builder.pipe(
            make_op(i, kind, fail_mod, skip_mod),
            concurrency=conc,
            output_order=order,  # type: ignore[arg-type]
            name=f"s{i}",
        )
    p = builder.add_sink(2).build()
    with p:
        out = list(p)
    # Replay the decisions sequentially: the expected survivors, failures and skips.
    alive, failed, skipped = list(range(n)), Counter[str](), Counter[str]()
    for i in range(len(stages)):
        survivors = []
        for x in alive:
            if (x + i) % fail_mod == 0:
                failed[f"s{i}"] += 1
            elif (x * 7 + i) % skip_mod == 0:
                skipped[f"s{i}"] += 1
            else:
                survivors.append(x)
        alive = survivors
    assert sorted(out) == alive
    if all(order == "input" for _, order, _ in stages):
        assert out == alive
    assert Counter(r.stage for r in p.failures()) == failed
    stats = {s.name: s for s in p.stats().stages}
    for i, (_, _, kind) in enumerate(stages):
        name = f"s{i}"
        assert stats[name].failures == failed[name]
        if kind == "plain":  # a generator yielding nothing is not a SKIP
            assert stats[name].skipped == skipped[name]
