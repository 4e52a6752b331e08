"""What a SIGTERM costs a training run: the steps lost (the goal is 0) and the time to exit.

    python benchmarks/preemption.py SCENE [-r 8] [--nproc 1] [--trials 5] [--steps 3000] [--window 20,60]

Each trial starts `turbogs train SCENE --steps N` (turbo preset, checkpoints every 60 s as by
default), sends it SIGTERM at a random moment of the --window (seconds after training started:
after every process of the run catches SIGTERM, which it does from its first training step on,
as /proc/PID/status shows; the signal goes to the process the user started, the launcher with
--nproc 2), and reads back:
- the step the run stopped at (its own line) and the newest checkpoint's step, read from the
  file: the steps lost are their difference;
- the steps a kill at the same moment would have lost: since the last periodic checkpoint;
- with several ranks, the steps trained after the signal reached a rank (they stop together at
  the next step where they compare stop flags);
- the seconds from the signal to the line that says it stopped (the step in progress, the
  agreement), to the saved model (the checkpoint and the model written), and to the exit of the
  process (which includes the Python interpreter's own exit).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from turbogs.formats.model_folder import latest_iteration  # noqa: E402
from turbogs.training import checkpoint  # noqa: E402

STOP_LINE = re.compile(r"^SIG\w+(?: \(rank \d+, at step (\d+)\): every rank stops)? at step (\d+); saving")


def catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def training_started(pid: int, nproc: int) -> bool:
    """Whether the run's processes (the launcher and its ranks, or the one process) all catch
    SIGTERM: the ranks do from their first training step on."""
    try:
        tree, todo = [], [pid]
        while todo:
            tree.append(todo.pop())
            for task in Path(f"/proc/{tree[-1]}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        runs = [p for p in tree if b"turbogs" in Path(f"/proc/{p}/cmdline").read_bytes()]
        return len(runs) == (nproc + 1 if nproc > 1 else 1) and all(catches_sigterm(p) for p in runs)
    except (OSError, StopIteration):  # a process came or went while we looked
        return False


def trial(args, out: Path, delay: float) -> dict:
    command = [sys.executable, "-m", "turbogs", "train", args.scene, "--out", str(out), "--steps", str(args.steps),
               "--quiet", "--nproc", str(args.nproc), *(["-r", str(args.resolution)] if args.resolution else [])]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = []  # (seconds since start, line)
    started = time.perf_counter()

    def read():
        for line in process.stdout:
            lines.append((time.perf_counter() - started, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not training_started(process.pid, args.nproc):
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    periodic = []  # the periodic checkpoints' steps, as they appear
    deadline = time.perf_counter() + delay
    while time.perf_counter() < deadline:
        periodic = [step for step, _ in checkpoint.list_checkpoints(out)]
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before the signal"
    signalled = time.perf_counter() - started
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=600)
    exited = time.perf_counter() - started
    reader.join(timeout=10)
    stop = next((t, STOP_LINE.match(line)) for t, line in lines if STOP_LINE.match(line))
    saved = next(t for t, line in lines if line.startswith("stopped (SIGTERM)"))
    stopped_at = int(stop[1].group(2))
    newest = checkpoint.list_checkpoints(out)[0]
    state = checkpoint.read_checkpoint(newest[1], newest[0])
    return {"exit_code": process.returncode, "stopped_at": stopped_at, "checkpoint": state["step"],
            "model": latest_iteration(out), "lost": stopped_at - state["step"],
            "lost_to_a_kill": stopped_at - max([0, *[s for s in periodic if s <= stopped_at]]),
            "after_signal": stopped_at - int(stop[1].group(1)) if stop[1].group(1) else None,
            "to_stop_line": stop[0] - signalled, "to_saved": saved - signalled, "to_exit": exited - signalled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scene")
    parser.add_argument("-r", "--resolution", type=int)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--window", default="20,60", help="the signal comes between these seconds of training")
    parser.add_argument("--seed", type=int, default=0, help="of the random signal times")
    parser.add_argument("--out", help="keep the model folders here (default: a temporary folder)")
    args = parser.parse_args()
    moments, (earliest, latest) = random.Random(args.seed), map(float, args.window.split(","))
    delays = [moments.uniform(earliest, latest) for _ in range(args.trials)]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.out or scratch)
        for index, delay in enumerate(delays):
            rows.append({"signal_after_s": round(delay, 1), **trial(args, root / f"trial_{index}", delay)})
            print(rows[-1], flush=True)
    print(f"\n`python benchmarks/preemption.py {' '.join(sys.argv[1:])}`\n")
    print("| trial | signal (s into training) | exit code | stopped at step | checkpoint | model | steps lost | a kill would lose | "
          "steps after the signal | s to the stop line | s to saved | s to exit |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for index, row in enumerate(rows):
        after = "" if row["after_signal"] is None else row["after_signal"]
        print(f"| {index} | {row['signal_after_s']} | {row['exit_code']} | {row['stopped_at']} | {row['checkpoint']} | {row['model']} | "
              f"{row['lost']} | {row['lost_to_a_kill']} | {after} | {row['to_stop_line']:.2f} | "
              f"{row['to_saved']:.2f} | {row['to_exit']:.2f} |")
    for key in ("to_stop_line", "to_saved", "to_exit"):
        values = [row[key] for row in rows]
        print(f"{key}: median {statistics.median(values):.2f} s, range {min(values):.2f}-{max(values):.2f} s")
    print(f"steps lost: {sorted({row['lost'] for row in rows})}; "
          f"a kill at the same moments: {[row['lost_to_a_kill'] for row in rows]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
