"""The ranks of a data-parallel run, and the few collectives the trainer needs.

Why data-parallel, and why this shape (docs/SCALING.md): every rank holds all the Gaussians
and renders different training views; one all-reduce of a flat buffer per step sums the
gradients and the density statistics, so every rank steps, grows and prunes identically.
Nothing here is home-made networking: it is torch.distributed (NCCL on CUDA, gloo on CPU),
started by torchrun or by `turbogs train --nproc N` (turbogs/distributed/launch.py), which set RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.

A single process is a `World` of size 1: every collective returns its input untouched, so the
single-GPU step pays nothing for this module.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
from typing import List, NoReturn, Optional, Sequence

import torch

from turbogs.errors import TurboGSError

# Set in the ranks' environment by `turbogs train --nproc` (turbogs/distributed/launch.py), which reports a
# rank that died itself.
LAUNCHED_BY_TURBOGS = "TURBOGS_NPROC_LAUNCHER"


class PeerStopped(TurboGSError):
    """A rank stops because every rank stops for the same reason, which rank 0 reports: the
    command line prints nothing for it on the other ranks (one message, not one per rank)."""

    quiet = True


class World:
    """This process's place among the ranks. `size == 1`: a plain single-process run."""

    def __init__(self, rank: int = 0, size: int = 1, local_rank: int = 0, backend: Optional[str] = None):
        self.rank, self.size, self.local_rank, self.backend = rank, size, local_rank, backend

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints, the model and results, and shows the progress bar."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, size={self.size}, backend={self.backend})"

    def stop_all(self, message: str) -> TurboGSError:
        """The error to raise when every rank stops for the same reason at the same step:
        rank 0 reports it, the others stop quietly (one message, not one per rank)."""
        return TurboGSError(message) if self.is_main else PeerStopped(message)

    # --- collectives (no-ops on one process) -------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place: the sum (or "max") over the ranks, the same bits on every rank."""
        if self.size > 1:
            reduce_op = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}[op]
            self._collective(torch.distributed.all_reduce, tensor, op=reduce_op)
        return tensor

    def reduce_sum_and_max(self, summed: torch.Tensor, maxed: torch.Tensor) -> None:
        """In place: `summed` summed and `maxed` maximised over the ranks (1-D float32), the
        same bits on every rank, in one exchange of messages where the backend makes that cheaper.

        Why: on gloo (the CPU) every collective pays round trips however small it is, and its
        all-reduce and all-gather take several times longer than sending the buffer to the
        other rank and receiving theirs (benchmarks/gloo_collectives.py). So on gloo every rank
        gathers the buffers, both parts in one, by `all_gather`'s exchange, and adds them up
        itself, in rank order, so that every rank gets the same bits. That sends each buffer to
        every other rank, more than a ring all-reduce for many ranks, less time for the few a
        CPU run has. NCCL's collectives cost microseconds: GPUs keep the all-reduces."""
        if self.size == 1:
            return
        if self.backend != "gloo":
            self.all_reduce(summed, "sum")
            if maxed.numel():
                self.all_reduce(maxed, "max")
            return
        ranks = self.all_gather(torch.cat([summed, maxed]) if maxed.numel() else summed)
        count = summed.numel()
        total = ranks[0][:count] + ranks[1][:count]  # in rank order: every rank adds the same numbers the same way
        peak = torch.maximum(ranks[0][count:], ranks[1][count:])
        for other in ranks[2:]:
            total += other[:count]
            peak = torch.maximum(peak, other[count:])
        summed.copy_(total)
        maxed.copy_(peak)

    def all_gather(self, tensor: torch.Tensor) -> List[torch.Tensor]:
        """Every rank's `tensor` (same shape on every rank), in rank order (this rank's entry is
        `tensor` itself).

        On gloo, by sending `tensor` to every other rank and receiving theirs (one message each
        way per pair) rather than gloo's all-gather: between two ranks the exchange takes a
        fraction of the all-gather's time for the step's flat buffer (benchmarks/gloo_collectives.py,
        two ranks). Each rank sends W - 1 copies: for many ranks a ring would send less."""
        if self.size == 1:
            return [tensor]
        gathered = [torch.empty_like(tensor) for _ in range(self.size)]
        if self.backend != "gloo":
            self._collective(torch.distributed.all_gather, gathered, tensor)
            return gathered
        gathered[self.rank] = tensor
        peers = [rank for rank in range(self.size) if rank != self.rank]
        operations = ([torch.distributed.P2POp(torch.distributed.isend, tensor, peer) for peer in peers]
                      + [torch.distributed.P2POp(torch.distributed.irecv, gathered[peer], peer) for peer in peers])
        self._collective(lambda: [work.wait() for work in torch.distributed.batch_isend_irecv(operations)])
        return gathered

    def broadcast_float(self, value: float) -> float:
        """Rank 0's `value` on every rank (one read: used only where ranks must agree on a
        host number, e.g. the elapsed time of a run with a time budget)."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self._device())
        self._collective(torch.distributed.broadcast, tensor, src=0)
        return float(tensor.item())

    def gather_floats(self, values: Sequence[float]) -> List[List[float]]:
        """Every rank's few host numbers (as many on every rank), in rank order: one small
        all-gather, e.g. the ranks' stop flags, compared at the same steps on every rank."""
        if self.size == 1:
            return [list(values)]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._device())
        return [gathered.tolist() for gathered in self.all_gather(tensor)]

    def agree(self, failure: Optional[TurboGSError], group=None) -> None:
        """After a setup phase every rank went through: raise on every rank if any rank failed.
        Rank 0 reports the first failure (its own, or "rank r: ..."); the others stop quietly.
        `group`: a process group of `waiting_group`, for a phase longer than the run's timeout."""
        if self.size == 1:
            if failure is not None:
                raise failure
            return
        errors: List[Optional[str]] = [None] * self.size
        self._collective(torch.distributed.all_gather_object, errors, None if failure is None else str(failure),
                         group=group)
        failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
        if not failed:
            return
        rank, message = failed[0]
        raise self.stop_all(message if rank == 0 else f"rank {rank}: {message}")

    def check_same(self, values: torch.Tensor, what: str) -> None:
        """Raise on every rank if the ranks hold different `values` (bit for bit): the
        parameters' checksum compared every few steps, so a rank that drifted is caught."""
        if self.size == 1:
            return
        gathered = torch.stack(self.all_gather(values.detach().to(torch.float64).reshape(-1))).cpu()
        differs = [rank for rank in range(1, self.size) if not torch.equal(gathered[rank], gathered[0])]
        if differs:
            message = (f"ranks disagree on {what}: rank {differs[0]} holds {gathered[differs[0]].tolist()}, "
                       f"rank 0 {gathered[0].tolist()}; a rank computed differently (mixed library versions "
                       "or devices?); the last checkpoint resumes with --resume")
            raise self.stop_all(message)

    def waiting_group(self, minutes: float):
        """A gloo group of every rank whose collectives wait `minutes` (the run's own wait, 30 min,
        is for a step; rank 0's SfM on a few hundred photos can take longer). Every rank must
        create it, before the phase it waits for; None on one process."""
        if self.size == 1:
            return None
        return self._collective(torch.distributed.new_group, backend="gloo",
                                timeout=datetime.timedelta(minutes=minutes))

    def barrier(self) -> None:
        if self.size > 1:
            self._collective(torch.distributed.barrier)

    def close(self) -> None:
        if self.size > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # --- internals ---------------------------------------------------------------------
    def _device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def _collective(self, function, *args, **kwargs):
        """Run one collective; a rank that died or left turns into one clear error."""
        try:
            return function(*args, **kwargs)
        except RuntimeError as exc:  # gloo and NCCL report a lost peer as RuntimeError (DistBackendError)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            message = (f"rank {self.rank}: lost contact with the other ranks ({reason[:200]}); another rank "
                       "stopped or died; the last checkpoint resumes with --resume")
            # Under `--nproc` the launcher names the rank that died, in one line; under torchrun
            # (several machines) this rank's own message is what the user sees.
            raise (PeerStopped if os.environ.get(LAUNCHED_BY_TURBOGS) else TurboGSError)(message) from None


LOCAL = World()


def launched_by_torchrun() -> bool:
    """Whether this process is one of several ranks started by torchrun or `--nproc`."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def exit_rank(code: int) -> NoReturn:
    """End a rank's process with `code` once its work is done: Python's exit handlers run and
    the output is flushed, but libtorch's C++ teardown is skipped. Why: at interpreter exit a
    gloo rank can abort (SIGABRT, "terminate called without an active exception", no Python
    frame) when a C++ thread of the process group is still joinable as its object is destroyed,
    even after destroy_process_group; CI saw it twice in ~940 tests, in a `--nproc 2` run and in
    an mp.spawn worker, each after its work was done. The launcher would report that rank as
    crashed. mp.spawn workers (tests, benchmarks) end through here too."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def join(device_type: str, timeout_minutes: float = 30.0) -> World:
    """Join the process group the launcher set up (env:// rendezvous), or a World of one.
    `timeout_minutes`: how long a collective waits for a slow rank before failing (a paused
    live viewer on rank 0 keeps the others waiting, so the trainer passes a long one then)."""
    if not launched_by_torchrun():
        return LOCAL
    backend = "nccl" if device_type == "cuda" else "gloo"
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():
            raise TurboGSError(f"rank {rank}: needs GPU {local_rank} of this machine, which has "
                               f"{torch.cuda.device_count()}: start at most one rank per GPU")
        torch.cuda.set_device(local_rank)
    try:
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    except (RuntimeError, ValueError) as exc:
        raise TurboGSError(f"rank {rank}: could not join the other {size - 1} ranks ({str(exc).splitlines()[0]})") from None
    return World(rank, size, local_rank, backend)


def parameter_checksum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[2 * len(tensors) + 1] float64 on the tensors' device: each tensor's sum and sum of
    magnitudes, and the row count; any drift between ranks changes it."""
    parts = []
    for tensor in tensors:
        values = tensor.detach().to(torch.float64)
        parts += [values.sum(), values.abs().sum()]
    rows = float(tensors[0].shape[0]) if tensors else 0.0
    return torch.stack(parts + [torch.tensor(rows, dtype=torch.float64, device=parts[0].device)])
