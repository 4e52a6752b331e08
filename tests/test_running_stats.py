"""RunningStats, the bar's device-side figures, against a plain Python loop over the same steps:
the smoothed loss and PSNR (a NaN PSNR or a skipped step changes no figure; a figure's first
value starts it), and the skipped-step counts read at each refresh."""

import math
import random

import pytest
import torch

from turbogs.training.running_stats import RunningStats


def python_reference(steps, refresh_every):
    """(loss, psnr, skipped, bad_streak, longest) at each refresh, by a loop over floats."""
    smoothed = [math.nan, math.nan]
    skipped = streak = longest = 0
    out = []
    for i, (loss, psnr, ok) in enumerate(steps, 1):
        if not ok:
            skipped, streak = skipped + 1, streak + 1
            longest = max(longest, streak)
        else:
            streak = 0
            for k, value in enumerate((loss, psnr)):
                if not math.isnan(value):
                    smoothed[k] = value if math.isnan(smoothed[k]) else smoothed[k] + 0.1 * (value - smoothed[k])
        if i % refresh_every == 0:
            out.append((*smoothed, skipped, streak, longest))
            skipped, longest = 0, streak
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_running_stats_match_a_python_loop(seed):
    rng = random.Random(seed)
    steps = []
    for i in range(200):
        psnr = math.nan if (i < 3 or rng.random() < 0.1) else rng.uniform(10, 30)  # the first values missing
        steps.append((rng.uniform(0, 1), psnr, rng.random() > (0.6 if 50 < i < 70 else 0.1)))
    stats, got = RunningStats(), []
    for i, (loss, psnr, ok) in enumerate(steps, 1):
        stats.update(torch.tensor(loss), torch.tensor(psnr), {}, torch.tensor(ok))
        if i % 7 == 0:
            skipped_before = stats.skipped_steps
            longest = stats.refresh()
            got.append((stats.loss, stats.psnr, stats.skipped_steps - skipped_before, stats.bad_streak, longest))
    expected = python_reference(steps, 7)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g[:2] == pytest.approx(e[:2], rel=1e-5)
        assert g[2:] == e[2:]
    assert max(e[4] for e in expected) >= 3  # the test saw real streaks


def test_running_stats_resume_from_checkpoint_figures():
    stats = RunningStats(loss=0.5, psnr=20.0, bad_streak=2)
    stats.update(torch.tensor(1.5), torch.tensor(30.0), {}, torch.tensor(False))
    assert stats.refresh() == 3 and stats.bad_streak == 3 and stats.skipped_steps == 1
    assert (stats.loss, stats.psnr) == (0.5, 20.0)  # a skipped step changes no figure
    stats.update(torch.tensor(1.5), torch.tensor(30.0), {}, torch.tensor(True))
    assert stats.refresh() == 3 and stats.bad_streak == 0  # the longest since the last read: the old streak
    assert (stats.loss, stats.psnr) == pytest.approx((0.6, 21.0))
