"""Shared test set-up: CUDA-only tests are skipped, with a reason, where torch sees no GPU."""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Tiny tensors on a 2-core machine run many times faster on one thread; the commands the tests
# start (whose --threads defaults to every core) too: they read OMP_NUM_THREADS.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run benchmarks/gpu_build.sh on one)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def shared_capture() -> Path:
    """The real 23-image COLMAP capture beside the repo (CI lays ../shared next to the clone)."""
    return Path(os.environ.get("TURBOGS_TEST_COLMAP", REPO.parent / "shared" / "data" / "test_colmap"))
