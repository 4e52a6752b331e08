"""The training clock: how many seconds the steps took, GPU work included, without making
the host wait for the GPU every step.

On the CPU a step's work is done when its Python call returns, so `time.perf_counter()`
around it is the answer. On CUDA the call returns once the work is queued; waiting for it
with `torch.cuda.synchronize()` after every step would drain the queue and leave the GPU idle
while the host prepares the next step. This clock instead records a
CUDA event when a stretch of steps starts and one after each step, and counts the host's
seconds meanwhile, as an estimate (the schedules need a figure every step). When the
trainer reads its figures anyway (progress-bar refresh, checkpoints, the end: one wait
there already), `settle()` waits for the last event and returns how far the host estimate
was from the GPU's own time for the stretch, so the total is the GPU-measured one.
"""

from __future__ import annotations

import time
from typing import Optional

import torch


class StepClock:
    """`start()` and `stop()` around each step; `stop()` returns the step's seconds (on CUDA, the
    host's estimate); `settle()` returns the correction to add to the sum of those so far."""

    def __init__(self, device: torch.device, events: Optional[type] = None):
        self.events = events if events is not None else (torch.cuda.Event if device.type == "cuda" else None)
        self._started = 0.0
        self._first = self._last = None  # the stretch's first and last events (CUDA)
        self._estimated = 0.0  # host seconds counted for the stretch so far

    def start(self) -> None:
        if self.events is not None and self._first is None:
            self._first = self.events(enable_timing=True)
            self._first.record()
        self._started = time.perf_counter()

    def stop(self) -> float:
        seconds = time.perf_counter() - self._started
        if self.events is not None:
            if self._last is None:
                self._last = self.events(enable_timing=True)
            self._last.record()  # re-recorded each step: it marks the stretch's last step
            self._estimated += seconds
        return seconds

    def settle(self) -> float:
        """The GPU's seconds for the steps since the last settle minus the host estimate counted
        for them (0 on the CPU): one wait, for the last step's event."""
        if self.events is None or self._first is None or self._last is None:
            return 0.0
        self._last.synchronize()
        measured = self._first.elapsed_time(self._last) / 1000.0
        correction = measured - self._estimated
        self._first = self._last = None
        self._estimated = 0.0
        return correction


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a clock read after it includes that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work, device: torch.device) -> float:
    """Wall seconds of `work()`, the GPU work it queued included."""
    synchronize(device)
    started = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - started
