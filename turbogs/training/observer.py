"""The trainer's seam for tools that watch its own work (`turbogs bench --step-audit`).

The trainer wraps the parts of a step that are not its own code, render() and the backward
passes, in these context managers, and reports density control's stats. By default they do
nothing; turbogs/bench/audit.py counts ops outside them.
"""

from __future__ import annotations

import contextlib


class StepObserver:
    def render(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def density(self, stats: dict) -> None:
        pass
