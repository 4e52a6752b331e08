"""What a bench run means: time to a PSNR, the speedups between presets, and bench.md."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

PSNR_TOLERANCE_DB = 0.1  # "reached b's final PSNR" means within this much of it


# --- the speedup maths --------------------------------------------------------------


def time_to_psnr(points: Sequence[dict], threshold: float) -> Optional[float]:
    """Training seconds at which the PSNR curve first reaches `threshold`, interpolating
    linearly between evaluation points; None if it never does."""
    points = sorted((p for p in points if p.get("psnr") is not None), key=lambda p: p["seconds"])
    if not points:
        return None
    if points[0]["psnr"] >= threshold:
        return float(points[0]["seconds"])
    for before, after in zip(points, points[1:]):
        if before["psnr"] < threshold <= after["psnr"]:
            share = (threshold - before["psnr"]) / (after["psnr"] - before["psnr"])
            return float(before["seconds"] + share * (after["seconds"] - before["seconds"]))
    return None


def speedups(points_by_preset: Dict[str, Sequence[dict]], tolerance: float = PSNR_TOLERANCE_DB) -> Dict[str, dict]:
    """For each ordered pair (a, b): the time a needs to come within `tolerance` of b's
    final PSNR, the time b itself first got there, and b's time / a's time (> 1: a is faster).

    Also b's whole run time over a's time (`speedup_vs_run`): how much sooner a has what b
    ends with. The first ratio is stricter but unstable when b's curve is not monotone (a
    densification burst can touch the final level early and then fall back); the second is
    the question "how much less time for the same result"."""
    result: Dict[str, dict] = {}
    for a, points_a in points_by_preset.items():
        result[a] = {}
        for b, points_b in points_by_preset.items():
            if a == b:
                continue
            finals = [p["psnr"] for p in points_b if p.get("psnr") is not None]
            if not finals:
                result[a][b] = None
                continue
            target = finals[-1]
            seconds = time_to_psnr(points_a, target - tolerance)
            reference = time_to_psnr(points_b, target - tolerance)
            run_seconds = max(p["seconds"] for p in points_b)
            # Both at 0 s (the starting point is already within tolerance): no ratio.
            ratio = reference / seconds if seconds and reference is not None else None
            ratio_vs_run = run_seconds / seconds if seconds else None
            result[a][b] = {"target_psnr": target, "threshold_psnr": target - tolerance, "seconds": seconds,
                            "reference_seconds": reference, "speedup": ratio,
                            "reference_run_seconds": run_seconds, "speedup_vs_run": ratio_vs_run}
    return result


# --- the markdown report ------------------------------------------------------------


def fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _megabytes(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def markdown_report(result: dict) -> str:
    mode = result["mode"]
    sizing = (f"{mode['steps']} steps per preset (schedules scaled to them)" if "steps" in mode
              else f"a time budget of {mode['budget_seconds']:g} s of training per preset (schedules follow it)")
    if mode.get("preset_steps"):
        sizing += "; " + ", ".join(f"{name} runs {steps} steps instead" for name, steps in mode["preset_steps"].items())
    machine = result["machine"]
    where = machine.get("gpu") or f"{machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads"
    settings = result.get("settings") or []
    lines = [
        f"# TurboGS bench: {result.get('scene_name') or Path(result['scene']).name}",
        "",
        f"- command: `{result['command']}`",
        f"- device: {result['device']} ({where}); torch {machine['torch']}, {machine['platform']}",
        f"- scene: {result['scene']}, {result['train_views']} train / {result['test_views']} test views, "
        f"{result['image_size'][0]}x{result['image_size'][1]} px",
        f"- run: {sizing}; evaluation, set-up and file writes are not counted as training time",
        "- settings on every preset: " + (", ".join(f"`{item}`" for item in settings) if settings
                                          else "none (the presets as they are)"),
        "",
        "| preset | PSNR (dB) | SSIM | LPIPS | train time (s) | steps | steps/s | Gaussians | peak Gaussians "
        "| peak memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in result["presets"].items():
        final = entry["points"][-1]
        lines.append(
            f"| {name} | {fmt(final.get('psnr'), '.2f')} | {fmt(final.get('ssim'), '.4f')} | "
            f"{fmt(final.get('lpips'), '.4f')} | {entry['train_seconds']:.1f} | {entry['steps']} | "
            f"{fmt(entry['steps_per_second'], '.2f')} | {entry['num_gaussians']} | "
            f"{fmt(entry.get('peak_gaussians'), 'd')} | {_megabytes(entry['peak_memory_bytes'])} |"
        )
    memory = {entry["memory_measure"] for entry in result["presets"].values()}
    lines += ["", f"Peak memory: {', '.join(sorted(memory))} (growth over the memory in use before the preset)."]

    pairs = [(a, b, s) for a, row in result["speedup"].items() for b, s in row.items() if s is not None]
    if pairs:
        lines += [
            "",
            f"## Time to reach the other preset's final PSNR (within {result['psnr_tolerance_db']} dB)",
            "",
            "The reference's time is when it *first* came within the tolerance of its own final PSNR;",
            "its run is all of its training. Speedup = reference's time / preset's time; vs run =",
            "reference's run / preset's time (how much sooner the preset has what the reference ends with).",
            "",
            "| preset | reference | target PSNR (dB) | preset's time (s) | reference's time (s) | speedup "
            "| reference's run (s) | speedup vs run |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for a, b, s in pairs:
            speedup = ("never reached" if s["seconds"] is None
                       else "-" if s["speedup"] is None else f"{s['speedup']:.2f}x")
            vs_run = "-" if s.get("speedup_vs_run") is None else f"{s['speedup_vs_run']:.2f}x"
            lines.append(f"| {a} | {b} | {s['target_psnr']:.2f} | {fmt(s['seconds'], '.1f')} | "
                         f"{fmt(s['reference_seconds'], '.1f')} | {speedup} | "
                         f"{fmt(s.get('reference_run_seconds'), '.1f')} | {vs_run} |")

    counted = {name: entry for name, entry in result["presets"].items() if entry.get("gaussian_counts")}
    if counted:
        lines += ["", "## Gaussian count over the run", "",
                  "Every step that densified or changed the count is in bench.json (`gaussian_counts`).", "",
                  "| preset | start | peak | final | such steps | last one (step) |", "|---|---:|---:|---:|---:|---:|"]
        for name, entry in counted.items():
            events = entry["gaussian_counts"]
            lines.append(f"| {name} | {events[0]['num_gaussians']} | {entry['peak_gaussians']} | "
                         f"{entry['num_gaussians']} | {len(events) - 1} | "
                         f"{events[-1]['step'] if len(events) > 1 else '-'} |")

    lines += ["", "## Evaluation points", "", "| preset | train time (s) | step | PSNR (dB) | SSIM | Gaussians |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, entry in result["presets"].items():
        for p in entry["points"]:
            lines.append(f"| {name} | {p['seconds']:.2f} | {p['step']} | {fmt(p.get('psnr'), '.2f')} | "
                         f"{fmt(p.get('ssim'), '.4f')} | {p['num_gaussians']} |")
    return "\n".join(lines) + "\n"
