"""Stopping a run early without losing it: SIGTERM, Ctrl-C (SIGINT) and the live viewer's Stop.

Clusters end a job with SIGTERM and a grace period before SIGKILL (Kubernetes, SLURM, spot
instances); a user ends one with Ctrl-C. Either way the run finishes the step it is in, every
rank agrees on the step to stop at, and that step is written: the checkpoint first (what
`--resume` continues from), then the model, marked as a stopped run. No trained step is lost.
The process exits 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a shell
reports a process the signal ended. The viewer's Stop goes the same way and exits 0.

A second signal while that is being written quits at once (`QuitNow`, raised by the handler):
the writes are atomic, so the last complete checkpoint stays. The same request delivered twice
within REPEAT_WINDOW_SECONDS counts once: a cluster may signal every process of a job while
torchrun passes the signal on to its ranks too (SLURM does), and that is one request, not two.

Agreeing across ranks without a deadlock: the handler only sets a flag, and every rank shows
its flag to the others in one small all-gather at the same steps (every `every` steps, and
once when the loop ends). A rank that got the signal and one that did not therefore make the
same collectives and reach the same decision at the same step; no rank waits in a collective
the others will not make. benchmarks/stop_agreement.py measures what it costs.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import Optional

from turbogs.distributed.world import World

SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_WINDOW_SECONDS = 1.0
VIEWER = "viewer"
_VIEWER_CODE = -1.0  # a rank's flag in the all-gather: 0 none, a signal's number, or this


def signal_exit_code(name: str) -> int:
    """128 + the signal's number: what a shell reports for a process that signal ended."""
    return 128 + signal.Signals[name]


class QuitNow(KeyboardInterrupt):
    """A second signal while a stopped run is being written: leave at once. A KeyboardInterrupt,
    so that no `except Exception` holds it up; the command line prints it as one line and exits
    with its exit_code."""

    def __init__(self, signum: int):
        name = signal.Signals(signum).name
        super().__init__(f"second {name} while saving: quit at once; the last complete checkpoint is kept")
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class StopRequest:
    """What the ranks agreed on: why the run stops, which rank asked first, and the step at
    which that rank noticed it (the ranks then stop at the next step where they compare)."""

    reason: str  # "SIGTERM", "SIGINT" or VIEWER
    rank: int = 0
    noticed_at: int = 0

    @property
    def by_signal(self) -> bool:
        return self.reason != VIEWER

    def announce(self, step: int, world_size: int) -> str:
        """The line rank 0 prints when every rank stops at `step`."""
        if not self.by_signal:
            return f"stopped from the viewer at step {step}; saving a checkpoint and the model"
        where = "" if world_size == 1 else f" (rank {self.rank}, at step {self.noticed_at}): every rank stops"
        return (f"{self.reason}{where} at step {step}; saving a checkpoint and the model "
                "(a second signal quits at once)")


class StopSignals:
    """While active (a `with` block in the main thread), SIGTERM and SIGINT ask the run to stop
    instead of ending the process: the first sets `received`; a later one, past the repeat
    window, raises QuitNow wherever the main thread is. Elsewhere than in the main thread (where
    Python cannot set handlers) it does nothing and the signals keep their usual effect."""

    def __init__(self, repeat_window: float = REPEAT_WINDOW_SECONDS):
        self.repeat_window = repeat_window
        self.received: Optional[int] = None  # the first signal's number
        self._received_at = 0.0
        self._previous = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                previous = signal.signal(signum, self._handle)
                self._previous[signum] = signal.SIG_DFL if previous is None else previous
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        # Runs in the main thread between two bytecodes: only flags and raising, no I/O (a print
        # here could re-enter a print the main thread was in the middle of).
        if self.received is None:
            self.received, self._received_at = signum, time.monotonic()
        elif time.monotonic() - self._received_at > self.repeat_window:
            raise QuitNow(signum)


class StopAgreement:
    """Every rank's stop flag (a signal, or rank 0's viewer) turned into one decision that every
    rank reaches at the same step. One process decides at every step, for free; several ranks
    compare flags every `every` steps (one all-gather of two numbers per rank)."""

    def __init__(self, world: World, signals: StopSignals, viewer=None, every: int = 1):
        self.world, self.signals, self.viewer, self.every = world, signals, viewer, every
        self._noticed_at: Optional[int] = None  # the step at which this rank first had a request

    def signalled(self) -> bool:
        """Whether this process got a signal (a paused viewer lets go of the loop then)."""
        return self.signals.received is not None

    def check(self, step: int, final: bool = False) -> Optional[StopRequest]:
        """The agreed request, at a step where the ranks compare (every step on one process;
        `final`: the loop has ended, every rank asks once more), else None."""
        reason = self._local_reason()
        if reason is not None and self._noticed_at is None:
            self._noticed_at = step
        if self.world.size == 1:
            return None if reason is None else StopRequest(reason, 0, step)
        if step % self.every and not final:
            return None
        code = 0.0 if reason is None else _VIEWER_CODE if reason == VIEWER else float(signal.Signals[reason])
        flags = self.world.gather_floats([code, float(self._noticed_at or 0)])
        asked = [(rank, code, noticed) for rank, (code, noticed) in enumerate(flags) if code]
        if not asked:
            return None
        # A signal decides the exit code, so it outranks the viewer; then the lowest rank.
        rank, code, noticed = min(asked, key=lambda entry: (entry[1] == _VIEWER_CODE, entry[0]))
        reason = VIEWER if code == _VIEWER_CODE else signal.Signals(int(code)).name
        return StopRequest(reason, rank, int(noticed))

    def _local_reason(self) -> Optional[str]:
        if self.signals.received is not None:
            return signal.Signals(self.signals.received).name
        if self.viewer is not None and self.viewer.stop_requested:
            return VIEWER
        return None
