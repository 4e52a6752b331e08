#!/usr/bin/env bash
# Device call 2 of 2: the side-by-side bench, the step cost and a profile on the GPU,
# using what call 1 (benchmarks/gpu_build.sh) installed and compiled into .gpu/. Run it right
# after call 1, on the still-warm machine. If the machine is a fresh one after all, the
# "ready" phase installs and builds first (without the CUDA tests).
#
#   bash benchmarks/gpu_check.sh             on the GPU machine; logs and results in $OUT
#   bash benchmarks/gpu_check.sh --dry-run   every phase on this CPU machine, on the CPU
#
# Phases: ready, bench, step cost, outputs, within GPU_CHECK_DEADLINE_S (300 s). Each
# writes into $OUT as soon as it ends, so a timeout loses only the phase that was running.
# Files back from $OUT (at most 8, 2 folders deep): check.log, bench/bench.json,
# bench/bench.md, bench/psnr_vs_time.png, bench/step_cost.json, bench/profile.txt.
#
# Settings (environment): CARRY_DIR (.carry), GPU_DIR (.gpu), OUT, PRESETS (turbo,3dgs@7000:
# turbo's time budget against vanilla 3DGS at 7k steps; those that exist are run; PRESET+ABLATION
# and PRESET@STEPS allowed), BENCH_SECONDS (45), BENCH_RESOLUTION (2), STEP_COST_GAUSSIANS
# (300000), DRY_RUN_STEPS (20), DRY_RUN_RESOLUTION (8), GPU_CHECK_DEADLINE_S (300).
source "$(dirname "$0")/gpu_common.sh"
DEADLINE_S=${GPU_CHECK_DEADLINE_S:-300}
LOG=$OUT/check.log
: >"$LOG"
mkdir -p "$OUT/bench"
export LOG PRESETS=${PRESETS:-turbo,3dgs@7000}

phase_ready() {
  if [[ -f $SITE/sitecustomize.py ]] && { [[ $DRY_RUN == 1 ]] || built; }; then
    echo "call 1's install and builds found in $GPU_DIR"
    return 0
  fi
  echo "no install or build from call 1 in $GPU_DIR: installing and building now"
  GPU_BUILD_SKIP_TESTS=1 OUT=$GPU_DIR/build_out bash benchmarks/gpu_build.sh $([[ $DRY_RUN == 1 ]] && echo --dry-run)
}

built() {  # both CUDA modules load without compiling anything
  ls "$TORCH_EXTENSIONS_DIR"/gsplat_cuda/gsplat_cuda*.so "$TURBOGS_BUILD_DIR"/turbogs_C*.so >/dev/null 2>&1
}

bench_presets() {  # those of $PRESETS that exist, comma-separated
  python3 -c "
import os, sys
from turbogs.bench.race import split_steps
from turbogs.training.config import get_preset
from turbogs.errors import TurboGSError
def exists(name):  # a preset, PRESET+ABLATION, or either @STEPS
    try:
        return get_preset(split_steps(name)[0]) is not None
    except TurboGSError:
        return False
wanted = os.environ['PRESETS'].split(',')
missing = [p for p in wanted if not exists(p)]
if missing:
    print('presets not defined (skipped):', ', '.join(missing), file=sys.stderr)
print(','.join(p for p in wanted if exists(p)))"
}

phase_bench() {
  local presets
  presets=$(bench_presets) || return 1
  [[ -n $presets ]] || { echo "none of the presets exists"; return 1; }
  if [[ $DRY_RUN == 1 ]]; then
    presets=$(echo "$presets" | sed 's/@[0-9]*//g')  # a dry run keeps every preset to DRY_RUN_STEPS
    python3 -m turbogs bench "$SCENE" --presets "$presets" -r "${DRY_RUN_RESOLUTION:-8}" \
      --steps "${DRY_RUN_STEPS:-20}" --eval-points 2 --device cpu --quiet --out "$OUT/bench"
  else
    python3 -m turbogs bench "$SCENE" --presets "$presets" -r "${BENCH_RESOLUTION:-2}" \
      --budget-seconds "${BENCH_SECONDS:-45}" --device cuda --quiet --out "$OUT/bench"
  fi
}

phase_step_cost() {
  if [[ $DRY_RUN == 1 ]]; then
    python3 -m turbogs bench "$SCENE" --presets turbo -r "${DRY_RUN_RESOLUTION:-8}" --step-cost \
      --step-cost-repeats 2 --step-cost-profile --device cpu --out "$OUT/bench"
  else
    python3 -m turbogs bench "$SCENE" --presets turbo -r "${BENCH_RESOLUTION:-2}" --step-cost \
      --step-cost-repeats 9 --step-cost-gaussians "${STEP_COST_GAUSSIANS:-300000}" --step-cost-profile \
      --device cuda --out "$OUT/bench"
  fi
}

phase_outputs() {
  python3 - <<'PY'
import json, os, sys
import cv2
out = os.environ["OUT"]
problems = []
for name in ("check.log", "bench/bench.json", "bench/bench.md", "bench/psnr_vs_time.png",
             "bench/step_cost.json", "bench/profile.txt"):
    path = os.path.join(out, name)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        problems.append(f"{name} missing or empty")
if not problems:
    bench = json.load(open(os.path.join(out, "bench/bench.json")))
    print("backend:", bench.get("backend"))
    for preset, entry in bench["presets"].items():
        if len(entry["points"]) < 2 or entry["points"][-1]["psnr"] is None:
            problems.append(f"bench.json: preset {preset} has no evaluated training")
            continue
        print(f"{preset}: {entry['points'][-1]['psnr']:.2f} dB after {entry['train_seconds']} s, {entry['steps']} steps, "
              f"{entry['steps_per_second']} steps/s, peak {entry['peak_memory_bytes']} B")
    print("speedup:", json.dumps(bench.get("speedup")))
    if cv2.imread(os.path.join(out, "bench/psnr_vs_time.png")) is None:
        problems.append("psnr_vs_time.png does not decode")
    cost = json.load(open(os.path.join(out, "bench/step_cost.json")))
    print("step cost:", ", ".join(f"{f['fraction']:.0%} {f['seconds_per_step'] * 1e3:.2f} ms" for f in cost["fractions"]))
for problem in problems:
    print("problem:", problem)
sys.exit(1 if problems else 0)
PY
}

export -f phase_ready built bench_presets phase_bench phase_step_cost phase_outputs

say "gpu_check $(date -u +%FT%TZ) dry_run=$DRY_RUN deadline=${DEADLINE_S}s presets=$PRESETS"
#          name         limit  reserve  function
run_phase "ready"        240    120  phase_ready
run_phase "bench"        200     50  phase_bench
run_phase "step cost"     60      5  phase_step_cost
run_phase "outputs"       20      0  phase_outputs
summary
exit $FAILED
