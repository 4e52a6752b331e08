#!/usr/bin/env bash
# Sourced by benchmarks/gpu_build.sh (device call 1) and benchmarks/gpu_check.sh (call 2):
# the settings both calls share, the carry check, and the phase runner.
#
# The two calls run one right after the other on the same (still warm) GPU machine, which
# keeps git-ignored folders of the repository between calls. So everything call 1 installs
# and compiles goes to $GPU_DIR (.gpu/, git-ignored): call 2 finds it there, and a call
# that timed out in the middle of a build resumes it instead of starting over.
#
#   .gpu/site/               the carried wheels and an editable turbogs (PYTHONPATH)
#   .gpu/torch_extensions/   gsplat's JIT build (TORCH_EXTENSIONS_DIR)
#   .gpu/turbogs_build/      turbogs._C's JIT build (TURBOGS_BUILD_DIR)
#
# Both scripts also answer --check-carry (exit 1 if the carried wheels miss something the
# bare machine lacks) and --list-missing (the requirements still to download; used by
# benchmarks/prepare_carry.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
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
OUT=${OUT:-$(mktemp -d /tmp/gpu_out.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
GPU_DIR=${GPU_DIR:-$REPO/.gpu}
mkdir -p "$GPU_DIR"
GPU_DIR=$(cd "$GPU_DIR" && pwd)
SITE=$GPU_DIR/site
export TORCH_EXTENSIONS_DIR=$GPU_DIR/torch_extensions TURBOGS_BUILD_DIR=$GPU_DIR/turbogs_build
export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}
export TURBOGS_TEST_COLMAP=$SCENE  # the tests' real capture (../shared is not on the GPU machine)
export PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# The same arch list in every process: torch's JIT loader writes it into the build file, and
# a different one would rebuild gsplat in the bench.
export TORCH_CUDA_ARCH_LIST=9.0
export REPO CARRY SCENE OUT GPU_DIR SITE DRY_RUN

RESULTS=()
FAILED=0

say() { echo "$*" | tee -a "$LOG"; }

# run_phase NAME LIMIT_S RESERVE_S FUNCTION: run FUNCTION (its output appended to $LOG, in
# $OUT, as it comes) within min(LIMIT_S, time left before DEADLINE_S minus RESERVE_S kept
# for later phases).
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

summary() {
  say ""
  say "=== summary ($SECONDS s; logs and results in $OUT)"
  for line in "${RESULTS[@]}"; do say "$line"; done
}

export -f carry_report
