"""A time budget (`init` building and running a model): when its seconds pass, the running step is interrupted with
`OutOfTime` naming it. SIGALRM interrupts between bytecodes (Unix, main thread); elsewhere the budget is checked as each
step starts. `OutOfTime` is a BaseException, so an `except Exception` taking a model's failure for its limit lets it pass.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class OutOfTime(BaseException):
    """The budget ran out while `step` ran."""

    def __init__(self, step: str, seconds: float) -> None:
        super().__init__(f"{step} did not finish within {seconds:g} s")
        self.step, self.seconds = step, seconds


_active: TimeBudget | None = None


class TimeBudget:
    """`with TimeBudget(seconds, first):` bounds the block; `step(name)` inside it names the work running
    (`first`: the work before any step is named)."""

    def __init__(self, seconds: float, first: str) -> None:
        self.seconds, self.step = seconds, first
        self._deadline = 0.0
        self._alarm = False

    def __enter__(self) -> TimeBudget:
        global _active
        self._deadline = time.monotonic() + self.seconds
        self._alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
        if self._alarm:
            self._previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, max(self.seconds, 1e-6))  # 0 would set no timer
        self._outer, _active = _active, self
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
        _active = self._outer

    def _expire(self, signum: int, frame: object) -> None:
        raise OutOfTime(self.step, self.seconds)


@contextmanager
def step(name: str) -> Iterator[TimeBudget | None]:
    """Name the work the active budget bounds while the block runs (no budget active: nothing bounds it)."""
    budget = _active
    if budget is None:
        yield None
        return
    if time.monotonic() >= budget._deadline:
        raise OutOfTime(name, budget.seconds)
    outer, budget.step = budget.step, name
    try:
        yield budget
    finally:
        budget.step = outer
