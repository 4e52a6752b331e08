"""A fixed seed gives the same model twice: both presets, bit for bit, in one process.

Why not figures written down once: another CPU rounds the last bits differently and training
amplifies it (an AMD machine's turbo checksum differed from an Intel one's in the 7th digit), so
the two runs compared here run on the same machine, one after the other. A refactor is checked
the same way against the code before it: `python benchmarks/refactor_identity.py --base REF`.
"""

import importlib.util

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("refactor_identity", REPO / "benchmarks" / "refactor_identity.py")
identity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(identity)


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(identity.RUNS))
def test_a_seeded_run_gives_the_same_bits_twice(preset, tmp_path):
    first = identity.train(REPO, preset, identity.RUNS[preset], tmp_path / "first")
    second = identity.train(REPO, preset, identity.RUNS[preset], tmp_path / "second")
    assert first["gaussians"] > 1000  # it densified: every part of the step ran
    assert first == second
