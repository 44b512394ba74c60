"""Per-position status of one epoch, and its compact (run-length) serialisation.

Not locked: the batcher that owns a ledger holds its lock around every call.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from typing import Any

from gpu_loader.batching._plan import BatchPlan

NOT_STARTED = 0
STARTED = 1
READY = 2  # completed with an item, held by the batcher
DELIVERED = 3
FAILED = 4

STATE_FORMAT = "gpu_loader.batching/1"

# Runs of one status byte, found by the C regex engine: state_dict() of a 1.2M-position
# epoch stays in the milliseconds, where a Python loop would take a large fraction of a second.
_RUN = {
    code: re.compile(re.escape(bytes([code])) + b"+") for code in (NOT_STARTED, DELIVERED, FAILED)
}
_NAMES = {NOT_STARTED: "never started", STARTED: "started", READY: "completed"}
_NAMES |= {DELIVERED: "delivered", FAILED: "failed"}

_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxother = 80
_BRIEF.maxlist = _BRIEF.maxdict = 8


def brief(value: object) -> str:
    """``repr(value)``, cut short for an error message: an edited state's field of a
    million characters was repeated whole in its refusal (QA66)."""
    return _BRIEF.repr(value)


class Ledger:
    """Which positions are started, ready, delivered or failed; the low and high marks."""

    def __init__(self, plan: BatchPlan) -> None:
        self.plan = plan
        self.status = bytearray(plan.num_kept)
        self.completed = 0  # READY + DELIVERED + FAILED
        self.started = 0  # positions ever started (completed ones included)
        self.delivered = 0
        self.failed = 0
        self.highwater = 0  # 1 + the highest position started or completed
        self._low = 0

    @property
    def done(self) -> bool:
        """Every kept position is completed (ready, delivered or failed)."""
        return self.completed == len(self.status)

    def low(self) -> int:
        """The smallest position not completed yet (``num_kept`` when none)."""
        status, low = self.status, self._low
        # Amortised O(1): only `undeliver` takes a position back, and it lowers `_low`.
        while low < len(status) and status[low] >= READY:
            low += 1
        self._low = low
        return low

    def start(self, position: int) -> None:
        self.plan.check_position(position)
        current = self.status[position]
        if current != NOT_STARTED:
            raise ValueError(
                f"position {position} was already {_NAMES[current]}; each position is "
                "started once per epoch (after a resume, start only remaining_positions())"
            )
        self.status[position] = STARTED
        self.started += 1
        self.highwater = max(self.highwater, position + 1)

    def complete(self, position: int, *, ok: bool) -> None:
        """Mark a position ready (``ok``) or failed; an unstarted one counts as started."""
        self.plan.check_position(position)
        current = self.status[position]
        if current >= READY:
            raise ValueError(
                f"position {position} was already {_NAMES[current]}; a position completes "
                "exactly once per epoch (check for a duplicate or a resumed position)"
            )
        if current == NOT_STARTED:
            self.started += 1
        self.status[position] = READY if ok else FAILED
        self.completed += 1
        self.failed += not ok
        self.highwater = max(self.highwater, position + 1)

    def deliver(self, position: int) -> None:
        self.status[position] = DELIVERED
        self.delivered += 1

    def undeliver(self, position: int) -> None:
        """Undo `complete` and `deliver` of a position, if both were done: the loader's
        record of a batch an interrupt stopped on its way to the training loop."""
        if self.status[position] != DELIVERED:
            return
        self.status[position] = NOT_STARTED
        self.delivered -= 1
        self.completed -= 1
        self.started -= 1
        self._low = min(self._low, position)

    def remaining(self) -> list[int]:
        """Positions never started, ascending: what a resumed epoch still has to start."""
        if not self.started:  # a fresh epoch (every one but a resumed): all of them
            return list(range(len(self.status)))
        return [p for start, stop in self.runs(NOT_STARTED) for p in range(start, stop)]

    def runs(self, code: int) -> list[list[int]]:
        """``[[start, stop], ...]`` half-open ranges of positions with status ``code``."""
        return [[m.start(), m.end()] for m in _RUN[code].finditer(self.status)]

    def failed_positions(self) -> list[int]:
        """The positions marked failed, in order."""
        if FAILED not in self.status:  # a byte search: the usual case, at once
            return []
        return [p for start, stop in self.runs(FAILED) for p in range(start, stop)]

    def to_state(self, mode: str, batches: int) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "mode": mode,
            "num_samples": self.plan.num_samples,
            "batch_size": self.plan.batch_size,
            "drop_last": self.plan.drop_last,
            "batches": batches,
            "delivered": self.runs(DELIVERED),
            "failed": self.runs(FAILED),
        }

    def load_state(self, state: Mapping[str, Any], mode: str) -> int:
        """Mark the delivered and failed positions of ``state``; return its batch count."""
        if self.started:
            raise RuntimeError(
                "load_state_dict() needs a fresh batcher: positions were already started"
            )
        expected = {
            "format": STATE_FORMAT,
            "mode": mode,
            "num_samples": self.plan.num_samples,
            "batch_size": self.plan.batch_size,
            "drop_last": self.plan.drop_last,
        }
        for key, want in expected.items():
            got = state.get(key)
            if got != want:
                raise ValueError(
                    f"state_dict field {key!r} is {brief(got)} but this batcher needs {want!r}; "
                    "resume with the same batching mode, dataset size, batch_size and drop_last"
                )
        batches = state.get("batches")
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
            raise ValueError(
                f"state_dict field 'batches' must be an int >= 0, got {brief(batches)}"
            )
        for key, code in (("delivered", DELIVERED), ("failed", FAILED)):
            for start, stop in _ranges(state.get(key), key, len(self.status)):
                for position in range(start, stop):
                    if self.status[position] != NOT_STARTED:
                        raise ValueError(f"state_dict lists position {position} twice")
                    self.status[position] = code
                count = stop - start
                self.started += count
                self.completed += count
                self.highwater = max(self.highwater, stop)
                if code == DELIVERED:
                    self.delivered += count
                else:
                    self.failed += count
        # Each batch holds 1 to batch_size samples; past those, only a distributed epoch's
        # padding batches, up to its batch count. A count out of these bounds made a rank
        # yield more batches than len(loader), and the ranks would fall out of step (QA).
        least = -(-self.delivered // self.plan.batch_size)
        most = max(self.delivered, self.plan.num_batches)
        if not least <= batches <= most:
            raise ValueError(
                f"state_dict field 'batches' is {batches} but {self.delivered} delivered "
                f"samples in batches of at most {self.plan.batch_size} make {least} to {most}"
            )
        # Not checked: that the batches left can hold the samples left. States saved after
        # on_error="raise" stopped an epoch failed it (QA70): a batch cut short by the
        # failure reached the loop before the error, and the failure is not recorded, so
        # that it runs again. The loader no longer hands such a batch over (9979dbf), but
        # that every state it writes now passes has not been shown.
        return batches


def _ranges(value: object, key: str, limit: int) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise ValueError(f"state_dict field {key!r} must be a list of [start, stop] ranges")
    out = []
    for pair in value:
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        if not ok or not 0 <= pair[0] <= pair[1] <= limit:
            raise ValueError(
                f"state_dict field {key!r} holds {brief(pair)}; expected [start, stop] with "
                f"0 <= start <= stop <= {limit}"
            )
        out.append((pair[0], pair[1]))
    return out
