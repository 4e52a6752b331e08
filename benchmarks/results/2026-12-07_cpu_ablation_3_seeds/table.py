"""The tables of README.md from the bench.json files: python table.py (run in this folder).

Seeds 0 and 1 of turbo and of Adam are in ../2026-12-07_cpu_ablation_8_captures/ (there named x2len1L4 and
adamx2: the same settings, run before they became the preset), the rest here. A part's change is the variant's
final test PSNR (or SSIM) minus turbo's of the same capture and seed; a capture's entry is the mean over its
seeds; the mean over captures is followed by each complete seed's own mean over captures."""
import collections
import glob
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = [(HERE, {}), (HERE.parent / "2026-12-07_cpu_ablation_8_captures", {"x2len1L4": "turbo", "adamx2": "adam"})]
CAPTURES = ["fox", "lego", "test_colmap", "phone", "forward", "masks", "exposure", "synthetic"]
VARIANTS = [("nosparse", "error-guided sparse tiles (`no-sparse`)"), ("noncc", "the NCC term (`no-ncc`)"),
            ("density3dgs", "error-driven density (`density-3dgs`)"), ("adam", "the hybrid: Adam instead (`optimizer-adam`)"),
            ("ncc03", "NCC at 0.03 instead of 0.1"), ("hybsh0", "the hybrid also on sh0")]


def load() -> dict:
    results = collections.defaultdict(dict)
    for root, renames in SOURCES:
        for path in glob.glob(str(root / "*" / "*" / "bench.json")):
            capture, run = Path(path).parts[-3:-1]
            name, seed = run.rsplit("_s", 1)
            if renames:
                if name not in renames:
                    continue
                name = renames[name]
            final = next(iter(json.loads(Path(path).read_text())["presets"].values()))["points"][-1]
            results[(capture, int(seed))][name] = (final["psnr"], final["ssim"])
    return results


def main() -> None:
    results, seeds = load(), range(5)
    for metric, k, fmt in (("PSNR (dB)", 0, "{:+.2f}"), ("SSIM", 1, "{:+.3f}")):
        print(f"\n### test {metric}\n")
        print("| part taken out | " + " | ".join(CAPTURES) + " | mean (each seed's) | captures it costs |")
        print("|---|" + "---:|" * (len(CAPTURES) + 2))
        row = ["turbo"]
        for capture in CAPTURES:
            values = [results[(capture, s)]["turbo"][k] for s in seeds if "turbo" in results.get((capture, s), {})]
            row.append(" / ".join(("{:.2f}" if k == 0 else "{:.3f}").format(v) for v in values) or "-")
        print("| " + " | ".join(row) + " | | |")
        for variant, label in VARIANTS:
            row, capture_means, per_seed = [label], [], collections.defaultdict(list)
            for capture in CAPTURES:
                changes = {s: results[(capture, s)][variant][k] - results[(capture, s)]["turbo"][k] for s in seeds
                           if variant in results.get((capture, s), {}) and "turbo" in results[(capture, s)]}
                for s, change in changes.items():
                    per_seed[s].append(change)
                if not changes:
                    row.append("-")
                    continue
                capture_means.append(statistics.mean(changes.values()))
                each = " (" + " / ".join(fmt.format(c) for c in changes.values()) + ")" if len(changes) > 1 else ""
                row.append(fmt.format(capture_means[-1]) + each)
            if not capture_means:
                continue
            complete = [statistics.mean(c) for _, c in sorted(per_seed.items()) if len(c) == len(CAPTURES)]
            spread = " (" + " / ".join(fmt.format(m) for m in complete) + ")" if len(complete) > 1 else ""
            row += [f"**{fmt.format(statistics.mean(capture_means))}**{spread}",
                    f"{sum(m < 0 for m in capture_means)} of {len(capture_means)}"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
