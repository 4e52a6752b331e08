"""The device a command computes on: `pick_device`, its CPU threads (`cpu_threads`), and on
the CPU a malloc that keeps freed memory inside the process, so that a CPU training step stops
page-faulting.

Why: a step on the CPU allocates and frees the same few hundred tensors every time, and glibc's
malloc gives the freed top of its heap back to the kernel as soon as more than its trim
threshold (128 KiB at start; at most 64 MiB) of it is free, and serves blocks over its mmap
threshold with an mmap of their own, unmapped on free. So every step faults its memory in
again and the kernel zero-fills each page: about 6,800 minor page faults a step on the demo's
turbo preset (tests/test_host_memory.py), 10% of the run's time spent in the kernel.

PyTorch's CPU performance guide answers this by swapping in jemalloc or tcmalloc. glibc's own
knobs (mallopt, the same as its MALLOC_*_ environment variables) do it without a new
dependency: a 256 MiB trim threshold with a 64 MiB top pad keeps what a step freed for the
next one, and a 32 MiB mmap threshold (the largest glibc takes) sends blocks up to that size
to the heap. Measured on the demo, turbo, one thread (`/usr/bin/time python -m turbogs train
scenes/demo --preset turbo --steps 200`, two runs each way): 661k-726k -> 88k-89k minor faults,
1.9-2.3 -> 0.44-0.49 s in the kernel, the same wall time on an idle machine (17.7 -> 17.8 s,
18.8 -> 18.5 s), peak resident memory 409 -> 415-417 MB; with a second process on the other
core (the old and new code side by side, three pairs) 10-15% more views a second, the faults
being dearer when two processes fault at once. Captures whose steps allocate little gain
nothing (test_colmap at -r 8, 3dgs: 80k-90k faults a run either way). The cost: up to about
320 MB of freed memory (the trim threshold and top pad) stays with the process. Only glibc
has these knobs: with any other C library, or off Linux, this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

from turbogs.errors import TurboGSError

# glibc's <malloc.h> option numbers.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
_MIB = 1 << 20
SETTINGS = ((M_MMAP_THRESHOLD, 32 * _MIB), (M_TRIM_THRESHOLD, 256 * _MIB), (M_TOP_PAD, 64 * _MIB))


def keep_freed_memory() -> bool:
    """Tune this process's malloc as above; whether it took (False off glibc). Safe to call
    more than once; it changes where memory comes from, never what a computation gives."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        libc.gnu_get_libc_version  # glibc only: musl and others have no such symbol
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(option, value) == 1 for option, value in SETTINGS)


def cpu_threads(requested: Optional[int] = None) -> int:
    """The torch threads of this process: `--threads N` (the whole run's: the ranks of a
    multi-rank run on one machine, LOCAL_WORLD_SIZE, each take their part, at least one), else
    $OMP_NUM_THREADS when set (this process's own, as OpenMP reads it; `--nproc` sets it to each
    rank's share of the cores, torchrun to 1), else every core this process may run on.

    Why all cores: the native CPU kernels run the tiles in parallel, with results that do not
    depend on the thread count. Only the
    torch twins' many small ops ran fastest on one thread, the old default. On a machine whose
    cores other processes keep busy, more threads than free cores wait on each other at every
    parallel op: there, ask for fewer (OMP_NUM_THREADS=1 or --threads 1)."""
    ranks = _int_env("LOCAL_WORLD_SIZE") or 1
    if requested is not None:
        return max(1, requested // ranks)
    return _int_env("OMP_NUM_THREADS") or max(1, available_cores() // ranks)


def _int_env(name: str) -> int:
    """A positive integer from the environment, else 0."""
    try:
        return max(0, int(os.environ.get(name, "")))
    except ValueError:
        return 0


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def pick_device(name: str, threads: Optional[int] = None):
    """The torch device for --device, and the CPU thread count (`cpu_threads`)."""
    import torch

    torch.set_num_threads(cpu_threads(threads))
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise TurboGSError("--device cuda: no CUDA GPU is visible to torch (is this a CPU build of torch?)")
    if name == "cpu":  # the CPU path's tensors come from malloc: keep them from page-faulting (keep_freed_memory below)
        keep_freed_memory()
    return torch.device(name)
