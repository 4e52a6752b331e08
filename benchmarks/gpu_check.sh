#!/usr/bin/env bash
# The GPU check: build the CUDA code, run the CUDA tests and a side-by-side bench on a
# bare GPU machine (an H200 with torch+CUDA, nvcc, ninja, numpy, opencv, tqdm, pytest,
# jaxtyping, rich and packaging, but no network and none of gsplat, plyfile, viser).
# Everything else comes from the git-ignored .carry/ folder that benchmarks/prepare_carry.sh
# fills: wheels in .carry/wheels, the test scene in .carry/test_colmap.
#
#   bash benchmarks/gpu_check.sh             on the GPU machine; logs and results in $OUT
#   bash benchmarks/gpu_check.sh --dry-run   (or DRY_RUN=1) every phase on this CPU machine,
#                                            with stand-ins for the CUDA ones
#   bash benchmarks/gpu_check.sh --check-carry
#                                            only the carry check of the wheels (exit 1 if
#                                            something is missing or cannot install there)
#   bash benchmarks/gpu_check.sh --list-missing
#                                            print the requirements the carried wheels need
#                                            that neither the GPU machine nor .carry has
#
# Phases: environment, carry, install, builds (gsplat and turbogs._C, in parallel),
# cuda tests, bench, step cost, outputs. Each has its own time limit, a failed phase does
# not stop the next, and the whole run ends within GPU_CHECK_DEADLINE_S (470 s): a phase
# gets at most what is left minus what it keeps for the later ones (the builds keep 230 s
# for bench, step cost and outputs, so slow builds squeeze the tests, not the bench). The summary at the end says pass/fail/skip per phase; the exit
# code is 1 if any phase failed.
#
# What comes back from $OUT (at most 8 files, 2 folders deep): gpu_check.log, pytest.log,
# bench/bench.json, bench/bench.md, bench/psnr_vs_time.png, bench/step_cost.json,
# bench/profile.txt.
#
# Settings (environment): CARRY_DIR (.carry), OUT (a temp folder when unset), SITE_DIR
# (/tmp/site; a temp folder in a dry run), PRESETS (turbo,3dgs: those that exist are run; PRESET+ABLATION and PRESET@STEPS allowed:
# turbo,3dgs@7000 is issue 4's GPU target, turbo's budget against 3dgs at 7k steps),
# BENCH_SECONDS (60), BENCH_RESOLUTION (2), STEP_COST_GAUSSIANS (300000),
# DRY_RUN_STEPS (20), DRY_RUN_RESOLUTION (8), GPU_CHECK_DEADLINE_S (470).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

# What the bare GPU machine has (normalized distribution names): the packages it was
# given, and what torch, pytest, rich and jaxtyping need to be installed at all.
H200_HAS="torch numpy opencv-python-headless tqdm pytest jaxtyping rich packaging ninja
  typing-extensions filelock sympy mpmath networkx jinja2 markupsafe fsspec setuptools triton
  iniconfig pluggy pygments markdown-it-py mdurl wadler-lindig"
# The top-level wheels the project needs there (setup.py's install_requires it lacks).
CARRY_REQUIRES="gsplat==1.5.3 plyfile viser==1.1.1"
# The GPU machine's Python, for requirement markers and wheel tags.
TARGET_PYTHON=3.12

# --- the carry check, in Python: wheel METADATA against what the machine has ---------

# Prints one line per unmet requirement ("name<spec>  (needed by X)") and per wheel that
# cannot install on the target; exit 1 if there is any. --names prints bare requirement
# strings only (for prepare_carry.sh to download).
carry_report() {
  python3 - "$1" "${2:-}" <<'PY'
import sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
import os

wheel_dir, mode = Path(sys.argv[1]), sys.argv[2]
present = set(canonicalize_name(n) for n in os.environ["H200_HAS"].split())
top = [Requirement(r) for r in os.environ["CARRY_REQUIRES"].split()]
py = os.environ["TARGET_PYTHON"]
environment = default_environment()
environment.update(python_version=py, python_full_version=py + ".0", sys_platform="linux",
                   platform_system="Linux", platform_machine="x86_64", os_name="posix",
                   implementation_name="cpython", platform_python_implementation="CPython", extra="")
cp = "cp" + py.replace(".", "")

def installable(tags) -> bool:
    for tag in tags:
        interpreter_ok = tag.interpreter in ("py3", "py" + cp[2:], cp) or (
            tag.abi == "abi3" and tag.interpreter.startswith("cp3") and int(tag.interpreter[3:]) <= int(cp[3:]))
        abi_ok = tag.abi in ("none", "abi3", cp)
        platform_ok = tag.platform == "any" or (tag.platform.startswith("manylinux") and tag.platform.endswith("x86_64"))
        if interpreter_ok and abi_ok and platform_ok:
            return True
    return False

carried, problems = {}, []
for wheel in sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []:
    name, version, _, tags = parse_wheel_filename(wheel.name)
    if not installable(tags):
        problems.append(f"{wheel.name}: not installable on CPython {py} manylinux x86_64")
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        fields = Parser().parsestr(z.read(metadata).decode("utf-8"))
    carried[name] = (version, [Requirement(r) for r in fields.get_all("Requires-Dist") or []])

missing, queue, expanded = [], [(r, "the project") for r in top], set()
while queue:
    requirement, needed_by = queue.pop(0)
    if requirement.marker is not None and not requirement.marker.evaluate(environment):
        continue
    name = canonicalize_name(requirement.name)
    if name in present or name.startswith("nvidia-"):
        continue
    if name not in carried:
        missing.append((requirement, needed_by, None))
        continue
    version, requires = carried[name]
    if not requirement.specifier.contains(version, prereleases=True):
        missing.append((requirement, needed_by, version))
    if name not in expanded:
        expanded.add(name)
        queue += [(r, f"{name} {version}") for r in requires]

if mode == "--names":
    for requirement, _, _ in missing:
        print(f"{requirement.name}{requirement.specifier}")
else:
    print(f"{len(carried)} wheels in {wheel_dir}; the GPU machine is taken to have: {' '.join(sorted(present))}")
    for name in sorted(carried):
        print(f"  carried  {name} {carried[name][0]}")
    for requirement, needed_by, version in missing:
        found = f"carried {version} does not match" if version else "not carried"
        print(f"  MISSING  {requirement.name}{requirement.specifier}  (needed by {needed_by}; {found})")
    for problem in problems:
        print(f"  BAD      {problem}")
    unused = sorted(set(carried) - expanded)
    if unused:
        print(f"  (not needed by anything: {' '.join(unused)})")
sys.exit(1 if missing or problems else 0)
PY
}
export H200_HAS CARRY_REQUIRES TARGET_PYTHON

case "${1:-}" in
  --list-missing) carry_report "${CARRY_DIR:-.carry}/wheels" --names; exit 0 ;;
  --check-carry) carry_report "${CARRY_DIR:-.carry}/wheels"; exit $? ;;
esac

# --- settings ------------------------------------------------------------------------

DRY_RUN=${DRY_RUN:-0}
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
CARRY=${CARRY_DIR:-.carry}
[[ -d $CARRY ]] && CARRY=$(cd "$CARRY" && pwd)
SCENE=$CARRY/test_colmap
OUT=${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}
mkdir -p "$OUT/bench"
OUT=$(cd "$OUT" && pwd)
if [[ $DRY_RUN == 1 && -z ${SITE_DIR:-} ]]; then
  SITE=$(mktemp -d /tmp/gpu_check_site.XXXXXX)
  trap 'rm -rf "$SITE"' EXIT  # a dry run leaves nothing installed behind
else
  SITE=${SITE_DIR:-/tmp/site}
fi
mkdir -p "$SITE"
DEADLINE_S=${GPU_CHECK_DEADLINE_S:-470}
LOG=$OUT/gpu_check.log
: >"$LOG"
export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}
export TURBOGS_TEST_COLMAP=$SCENE  # the tests' real capture (../shared is not on the GPU machine)
export PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
export REPO SITE OUT SCENE LOG DRY_RUN
# The same arch list in every process: torch's JIT loader rewrites the build file from it,
# and a different one would rebuild gsplat in the bench.
export TORCH_CUDA_ARCH_LIST=9.0

say() { echo "$*" | tee -a "$LOG"; }
RESULTS=()
FAILED=0

# run_phase NAME LIMIT_S RESERVE_S FUNCTION: run FUNCTION (its output to the log) within
# min(LIMIT_S, time left before the deadline minus RESERVE_S kept for later phases).
run_phase() {
  local name=$1 limit=$2 reserve=$3 fn=$4
  local left=$((DEADLINE_S - SECONDS - reserve))
  if ((left < 10)); then
    RESULTS+=("SKIP  $name: out of time")
    say "=== $name: skipped, out of time"
    return
  fi
  ((limit > left)) && limit=$left
  say "=== $name (limit ${limit}s, at ${SECONDS}s)"
  local start=$SECONDS rc
  timeout -k 5 "$limit" bash -c "$fn" >>"$LOG" 2>&1
  rc=$?
  record "$name" "$rc" $((SECONDS - start)) "$limit"
}

record() {  # NAME RC SECONDS LIMIT; rc 99 means "skipped on purpose"
  local name=$1 rc=$2 took=$3 limit=$4
  if ((rc == 0)); then
    RESULTS+=("PASS  $name (${took}s)")
  elif ((rc == 99)); then
    RESULTS+=("SKIP  $name (see the log)")
  elif ((rc == 124 || rc == 137)); then
    RESULTS+=("FAIL  $name: timed out after ${limit}s")
    FAILED=1
  else
    RESULTS+=("FAIL  $name: exit $rc after ${took}s")
    FAILED=1
  fi
  say "--- $name: ${RESULTS[-1]}"
}

# --- phases (each runs in its own bash, so they are exported functions) --------------

phase_environment() {
  echo "repo $REPO, carry $CARRY, site $SITE, out $OUT, dry run $DRY_RUN"
  python3 --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
  if [[ $DRY_RUN == 1 ]]; then
    echo "dry run: no nvidia-smi / nvcc needed"
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || return 1
    nvcc --version | tail -n 2
    python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'"
  fi
  nproc
}

phase_carry() {
  [[ -d $CARRY/wheels ]] || { echo "no $CARRY/wheels: run benchmarks/prepare_carry.sh and carry .carry"; return 1; }
  carry_report "$CARRY/wheels" || return 1
  [[ -d $SCENE/images && -d $SCENE/sparse ]] || { echo "the scene $SCENE lacks images/ or sparse/"; return 1; }
  echo "scene $SCENE: $(ls "$SCENE/images" | wc -l) images"
}

phase_install() {
  if [[ $DRY_RUN == 1 ]]; then
    # This machine's Python may differ from the GPU machine's: install the wheels as for
    # that one, into a folder kept off the path (this machine's own packages stand in).
    local wheel_site
    wheel_site=$(mktemp -d /tmp/gpu_check_wheels.XXXXXX)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$wheel_site" \
      --python-version "$TARGET_PYTHON" --implementation cp --only-binary=:all: \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 "$CARRY"/wheels/*.whl || return 1
    echo "dry run: the wheels install for CPython $TARGET_PYTHON ($(ls "$wheel_site" | wc -l) entries in $wheel_site)"
    rm -rf "$wheel_site"
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/wheels/*.whl || return 1
  fi
  # turbogs as an editable install into the same folder: it maps turbogs.viewer to viewer/.
  # PYTHONPATH entries do not read .pth files, so a sitecustomize makes $SITE a site folder.
  TURBOGS_NO_CUDA=1 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" -e "$REPO" \
    || return 1
  cat >"$SITE/sitecustomize.py" <<EOF
# Written by benchmarks/gpu_check.sh: read the .pth files of this --target folder.
import os, site
site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
EOF
  python3 -c "
import gsplat, plyfile, viser, turbogs.viewer, turbogs.cli
from importlib.metadata import version
print('imports ok:', ', '.join(f'{m.__name__} {version(m.__name__)} from {m.__file__}' for m in (gsplat, plyfile, viser)))"
}

build_gsplat() {
  MAX_JOBS=16 python3 -c "
import time
started = time.time()
from gsplat.cuda._backend import _C
assert _C is not None, 'gsplat found no CUDA toolkit'
print('gsplat._C built in', round(time.time() - started), 's:', _C.__file__)"
}

build_turbogs() {
  MAX_JOBS=8 python3 -c "
import importlib.util, time
started = time.time()
spec = importlib.util.spec_from_file_location('turbogs_cuda_build', 'cuda/build.py')
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
module = build.load_jit()
print('turbogs._C built in', round(time.time() - started), 's:', module.__file__)
from turbogs.kernels import turbo_cuda as _cuda
assert _cuda.available(), 'turbogs.kernels.turbo_cuda cannot use the built module'"
}

phase_builds() {
  if [[ $DRY_RUN == 1 ]]; then
    echo "dry run: CUDA builds skipped (no GPU); checking that both entry points exist"
    python3 -c "
import importlib.util
assert importlib.util.find_spec('gsplat.cuda._backend'), 'gsplat.cuda._backend not found'
print('gsplat.cuda._backend found')" || return 1
    python3 -c "
import importlib.util
spec = importlib.util.spec_from_file_location('b', 'cuda/build.py'); b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b); assert callable(b.load_jit); print('cuda/build.py: load_jit found')" || return 1
    return 99
  fi
  local logs=/tmp/gpu_check_builds
  mkdir -p $logs
  build_gsplat >$logs/gsplat.log 2>&1 &
  local gsplat_pid=$!
  build_turbogs >$logs/turbogs.log 2>&1 &
  local turbogs_pid=$!
  wait $turbogs_pid; local turbogs_rc=$?
  wait $gsplat_pid; local gsplat_rc=$?
  echo "--- turbogs._C build (exit $turbogs_rc), last lines:"; tail -n 30 $logs/turbogs.log
  echo "--- gsplat build (exit $gsplat_rc), last lines:"; tail -n 30 $logs/gsplat.log
  ((turbogs_rc == 0 && gsplat_rc == 0))
}

phase_tests() {
  # -m cuda: the CUDA-marked tests (on a CPU machine all of them skip, but collection runs).
  python3 -m pytest -m cuda -q -p no:cacheprovider --continue-on-collection-errors -rs tests >"$OUT/pytest.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/pytest.log"
  return $rc
}

# The bench through the CLI once it is wired there, else through its own module.
if python3 -m turbogs.cli bench --help >/dev/null 2>&1; then
  BENCH="python3 -m turbogs.cli bench"
else
  BENCH="python3 -m turbogs.bench"
fi
export BENCH

bench_presets() {  # those of $PRESETS that exist, comma-separated
  python3 -c "
import os
from turbogs.bench import split_steps
from turbogs.config import get_preset
from turbogs.errors import TurboGSError
def exists(name):  # a preset, PRESET+ABLATION, or either @STEPS
    try:
        return get_preset(split_steps(name)[0]) is not None
    except TurboGSError:
        return False
wanted = os.environ.get('PRESETS', 'turbo,3dgs').split(',')
missing = [p for p in wanted if not exists(p)]
if missing:
    import sys; print('presets not defined (skipped):', ', '.join(missing), file=sys.stderr)
print(','.join(p for p in wanted if exists(p)))"
}

phase_bench() {
  local presets
  presets=$(bench_presets) || return 1
  [[ -n $presets ]] || { echo "none of the presets exists"; return 1; }
  if [[ $DRY_RUN == 1 ]]; then
    presets=$(echo "$presets" | sed 's/@[0-9]*//g')  # a dry run keeps every preset to DRY_RUN_STEPS
    $BENCH "$SCENE" --presets "$presets" -r "${DRY_RUN_RESOLUTION:-8}" --steps "${DRY_RUN_STEPS:-20}" \
      --eval-points 2 --device cpu --quiet --out "$OUT/bench"
  else
    $BENCH "$SCENE" --presets "$presets" -r "${BENCH_RESOLUTION:-2}" \
      --budget-seconds "${BENCH_SECONDS:-60}" --device cuda --quiet --out "$OUT/bench"
  fi
}

phase_step_cost() {
  if [[ $DRY_RUN == 1 ]]; then
    $BENCH "$SCENE" --presets 3dgs -r "${DRY_RUN_RESOLUTION:-8}" --step-cost --step-cost-repeats 2 \
      --step-cost-profile --device cpu --out "$OUT/bench"
  else
    $BENCH "$SCENE" --presets 3dgs -r "${BENCH_RESOLUTION:-2}" --step-cost --step-cost-repeats 9 \
      --step-cost-gaussians "${STEP_COST_GAUSSIANS:-300000}" --step-cost-profile --device cuda --out "$OUT/bench"
  fi
}

phase_outputs() {
  python3 - <<'PY'
import json, os, sys
import cv2
out = os.environ["OUT"]
problems = []
for name in ("gpu_check.log", "pytest.log", "bench/bench.json", "bench/bench.md", "bench/psnr_vs_time.png",
             "bench/step_cost.json", "bench/profile.txt"):
    path = os.path.join(out, name)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        problems.append(f"{name} missing or empty")
if not problems:
    bench = json.load(open(os.path.join(out, "bench/bench.json")))
    for preset, entry in bench["presets"].items():
        if len(entry["points"]) < 2 or entry["points"][-1]["psnr"] is None:
            problems.append(f"bench.json: preset {preset} has no evaluated training")
        print(f"{preset}: {entry['points'][-1]['psnr']:.2f} dB after {entry['train_seconds']} s, {entry['steps']} steps")
    image = cv2.imread(os.path.join(out, "bench/psnr_vs_time.png"))
    if image is None:
        problems.append("psnr_vs_time.png does not decode")
    cost = json.load(open(os.path.join(out, "bench/step_cost.json")))
    print("step cost:", ", ".join(f"{f['fraction']:.0%} {f['seconds_per_step'] * 1e3:.2f} ms" for f in cost["fractions"]))
for problem in problems:
    print("problem:", problem)
sys.exit(1 if problems else 0)
PY
}

export -f carry_report phase_environment phase_carry phase_install build_gsplat build_turbogs phase_builds \
  phase_tests bench_presets phase_bench phase_step_cost phase_outputs
export CARRY

# --- the run -------------------------------------------------------------------------

say "gpu_check $(date -u +%FT%TZ) dry_run=$DRY_RUN deadline=${DEADLINE_S}s"
#          name         limit  reserve  function
run_phase "environment"   30      0  phase_environment
run_phase "carry"         30      0  phase_carry
run_phase "install"      120      0  phase_install
run_phase "builds"       300    230  phase_builds
run_phase "cuda tests"   150    200  phase_tests
run_phase "bench"        240     40  phase_bench
run_phase "step cost"     90     10  phase_step_cost
run_phase "outputs"       20      0  phase_outputs

say ""
say "=== summary ($SECONDS s; logs and results in $OUT)"
for line in "${RESULTS[@]}"; do say "$line"; done
exit $FAILED
