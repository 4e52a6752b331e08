"""Reading several device values at once, where the step must know them on the host.

On a GPU, bringing values to the host waits for the device's queue to drain, and `.tolist()`
on a small tensor is the cheapest way to bring many at once (one wait, not one per value).
But on the CPU `.tolist()` runs no aten op, so the step audit (turbogs/bench/audit.py), which
counts ops, would not see it. Such batched reads go through `values()`, which counts them.
"""

from __future__ import annotations

from typing import List

import torch

_reads = 0


def values(tensor: torch.Tensor) -> List:
    """`tensor.tolist()`, counted as one host read."""
    global _reads
    _reads += 1
    return tensor.tolist()


def reads_so_far() -> int:
    """How many reads `values` has made in this process (the audit takes differences)."""
    return _reads
