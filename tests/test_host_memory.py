"""device.keep_freed_memory: a CPU training step must not page-fault its tensors in again.

Each case runs in a fresh interpreter: malloc's settings are per process, and the test process
itself may already have them (every CPU command applies them)."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turbogs.errors import TurboGSError

DEMO = Path(__file__).resolve().parents[1] / "scenes" / "demo"

# Train the demo capture (turbo preset, one thread) for 10 steps, then print the minor page
# faults a step over the next 10. With the torch twins: their compositing allocates the most
# (the native CPU kernels allocate far less, so fault less either way).
FAULTS_PER_STEP = """
import resource, sys, tempfile, torch
from turbogs import kernels
from turbogs.device import keep_freed_memory
applied = keep_freed_memory() if sys.argv[2] == "tuned" else None
torch.set_num_threads(1)
kernels.use_torch_twins(True)
from turbogs.training.config import get_preset
from turbogs.data.load import load_scene
from turbogs.training.trainer import SessionOptions, Trainer
with tempfile.TemporaryDirectory() as out:
    trainer = Trainer(load_scene(sys.argv[1]), get_preset("turbo").for_run(steps=400),
                      SessionOptions(out_dir=out, progress=False, log=lambda message: None))
    for _ in range(10):
        trainer.timed_step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        trainer.timed_step()
    print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def faults_per_step(mode: str):
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_STEP, str(DEMO), mode], capture_output=True, text=True,
                         check=True)
    applied, count = out.stdout.split()
    return applied, float(count)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only (Linux)")
def test_training_steps_reuse_their_memory_without_page_faults():
    applied, tuned = faults_per_step("tuned")
    _, default = faults_per_step("default")
    assert applied == "True"
    # glibc's defaults: each step's tensors, freed at the top of the heap, go back to the
    # kernel (trimmed) and are faulted in again by the next step: thousands of pages a step
    assert default > 1000, default
    assert tuned < default / 10, (tuned, default)  # tuned: the same heap memory step after step


def test_cpu_commands_apply_it(monkeypatch):
    """pick_device (every command that computes) tunes malloc for the CPU, not for CUDA runs."""
    from turbogs import device

    calls = []
    monkeypatch.setattr(device, "keep_freed_memory", lambda: calls.append(1) or True)
    assert device.pick_device("cpu").type == "cpu"
    assert calls == [1]
    if torch.cuda.is_available():
        assert device.pick_device("cuda").type == "cuda"
    else:
        with pytest.raises(TurboGSError):
            device.pick_device("cuda")
    assert calls == [1]
