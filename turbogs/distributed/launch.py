"""`turbogs train --nproc N`: N local ranks through torch.distributed's own elastic launcher.

The launcher is torchrun's (`torch.distributed.launcher.api.elastic_launch`), not ours: it
picks a free port, sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, starts
`python -m turbogs train ...` N times, and stops every rank when one dies. Across machines,
run `torchrun --nnodes M --nproc_per_node N -m turbogs train ...` on each one instead; the
workers are the same.

What the user sees when something fails: a rank's own error (bad input, divergence) is printed
once, by rank 0, and the exit code is 2; a rank that dies (killed, crashed) is named in one
line, and the last checkpoint stays resumable with --resume (rank 0 writes it atomically).

SIGTERM and Ctrl-C: the launcher passes the signal on to every rank (torch's agent sends it to
each rank's process group; the ranks run in sessions of their own, so a terminal's Ctrl-C
reaches them through the launcher only, once). The ranks stop at a step they agree on, rank 0
saves it (turbogs/training/stop.py), and they exit 128 + the signal's number, which the
launcher passes on. The agent waits TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (30) for that before
it kills the ranks; a second signal to the launcher sends the ranks SIGTERM, which makes them
quit at once.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

from turbogs.device import available_cores
from turbogs.distributed.world import LAUNCHED_BY_TURBOGS
from turbogs.errors import TurboGSError

# Exit codes of a rank that has said why it ended: 2, an error (rank 0 prints it for every rank);
# 128 + SIGINT's or SIGTERM's number, a run stopped on that signal and saved, as a shell reports it.
SAID_WHY = (2, 128 + signal.SIGINT, 128 + signal.SIGTERM)


def strip_nproc(argv: List[str]) -> List[str]:
    """The command line without `--nproc N` / `--nproc=N` (the workers must not launch again)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return kept


def run_ranks(nproc: int, argv: List[str], checkpoints: str) -> int:
    """Run `turbogs <argv>` as `nproc` ranks on this machine; the exit code of the run.
    `checkpoints` names where a resumable checkpoint lives, for the message when a rank dies."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The launcher logs every worker start and stop at WARNING; the user wants one line.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # Each rank's share of the cores (device.cpu_threads reads it; --threads overrides it).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, available_cores() // nproc)))
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"turbogs-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.1,
                          start_method="spawn")
    os.environ[LAUNCHED_BY_TURBOGS] = "1"  # the ranks leave naming a dead rank to this process
    try:
        elastic_launch(config, sys.executable)("-m", "turbogs", *argv)
    except SignalException as exc:  # the launcher got it, passed it on, and the ranks have stopped
        return 128 + exc.sigval
    except ChildFailedError as exc:
        culprit = rank_that_died(exc.failures)
        if culprit is None:  # the ranks said why: the lowest such rank's exit code is the run's
            return next(failure.exitcode for _, failure in sorted(exc.failures.items()) if failure.exitcode in SAID_WHY)
        rank, failure = culprit
        how = f"died (exit code {failure.exitcode})"
        if failure.exitcode < 0 and -failure.exitcode in signal.valid_signals():
            how = f"was killed by {signal.Signals(-failure.exitcode).name}"
        raise TurboGSError(f"rank {rank} (pid {failure.pid}) {how}; the other ranks were stopped. "
                           f"The last checkpoint in {checkpoints} continues with --resume") from None
    return 0


def rank_that_died(failures: Dict[int, Any]) -> Optional[Tuple[int, Any]]:
    """(rank, failure) of the rank to name when the launcher reports failed ranks, or None when
    a rank has said why itself. A rank that ended with exit code 2 has printed its reason
    (rank 0 speaks for every rank), as has one that stopped on a signal and saved the run (130,
    143); the launcher then stops the others with SIGTERM, so those SIGTERMs are not a cause.
    A rank that died any other way (a signal, a crash) could not say why, and the others only
    saw it vanish: the earliest such rank is named; a SIGTERM counts only when nothing else
    explains the stop (the user stopped a rank)."""
    said_why = any(failure.exitcode in SAID_WHY for failure in failures.values())
    died = sorted((failure.exitcode == -signal.SIGTERM, failure.timestamp, rank, failure)
                  for rank, failure in failures.items()
                  if failure.exitcode not in SAID_WHY and not (said_why and failure.exitcode == -signal.SIGTERM))
    if not died:
        return None
    *_, rank, failure = died[0]
    return rank, failure
