#!/usr/bin/env bash
# Device call 1 of 2: install, compile, and run the CUDA tests on a bare GPU machine (an
# H200 with torch+CUDA, nvcc, ninja, numpy, opencv, tqdm, pytest, jaxtyping, rich and
# packaging, but no network and none of gsplat, plyfile, viser). Wheels and the test scene
# come from the git-ignored .carry/ that benchmarks/prepare_carry.sh fills. Call 2,
# benchmarks/gpu_check.sh, must follow at once so that it finds this call's builds in .gpu/.
#
#   bash benchmarks/gpu_build.sh             on the GPU machine; logs in $OUT
#   bash benchmarks/gpu_build.sh --dry-run   every phase on this CPU machine, the CUDA
#                                            builds replaced by checks of their entry points
#
# Phases: environment (versions), carry, install, builds (gsplat and turbogs._C in
# parallel, MAX_JOBS=16, TORCH_CUDA_ARCH_LIST=9.0), cuda tests (the two CUDA test files
# only). The whole call ends within GPU_BUILD_DEADLINE_S (360 s); a phase that times out
# loses only itself, and a build cut short resumes where it stopped in the next call
# (see build_gsplat). Files back from $OUT: build.log, versions.txt, pytest_cuda.log.
#
# Settings (environment): CARRY_DIR (.carry), GPU_DIR (.gpu), OUT (a temp folder when
# unset), GPU_BUILD_DEADLINE_S (360), GPU_BUILD_SKIP_TESTS (0; gpu_check.sh sets it when it
# has to build on a machine that call 1 did not prepare).
source "$(dirname "$0")/gpu_common.sh"
DEADLINE_S=${GPU_BUILD_DEADLINE_S:-360}
LOG=$OUT/build.log
: >"$LOG"
export LOG

phase_environment() {
  {
    echo "repo $REPO, carry $CARRY, gpu dir $GPU_DIR, out $OUT, dry run $DRY_RUN"
    python3 --version
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
    g++ --version | head -n 1
    if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else echo "nvcc: not found"; fi
    if [[ $DRY_RUN == 1 ]]; then
      echo "dry run: no GPU needed"
    else
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || return 1
      python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'" || return 1
    fi
    echo "cpus $(nproc)"
  } | tee "$OUT/versions.txt"
}

phase_carry() {
  [[ -d $CARRY/wheels ]] || { echo "no $CARRY/wheels: run benchmarks/prepare_carry.sh and carry .carry"; return 1; }
  carry_report "$CARRY/wheels" || return 1
  [[ -d $SCENE/images && -d $SCENE/sparse ]] || { echo "the scene $SCENE lacks images/ or sparse/"; return 1; }
  echo "scene $SCENE: $(ls "$SCENE/images" | wc -l) images"
}

phase_install() {
  rm -rf "$SITE"
  mkdir -p "$SITE"
  if [[ $DRY_RUN == 1 ]]; then
    # This machine's Python may differ from the GPU machine's: install the wheels as for
    # that one, into a folder kept off the path (this machine's own packages stand in).
    local wheel_site
    wheel_site=$(mktemp -d /tmp/gpu_build_wheels.XXXXXX)
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
  cat >"$SITE/sitecustomize.py" <<PY
# Written by benchmarks/gpu_build.sh: read the .pth files of this --target folder.
import os, site
site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
PY
  python3 -c "
import gsplat, plyfile, viser, turbogs.viewer, turbogs.cli
from importlib.metadata import version
print('imports ok:', ', '.join(f'{m.__name__} {version(m.__name__)} from {m.__file__}' for m in (gsplat, plyfile, viser)))"
}

# gsplat builds itself on first import, but when its .so is missing it first deletes the
# whole build folder: a build cut short by a timeout would start from nothing every time.
# Importing it with shutil.rmtree disabled keeps the finished objects, and ninja compiles
# only what is missing. The flags are gsplat's own, so later imports load the same build.
build_gsplat() {
  MAX_JOBS=16 python3 -c "
import shutil, time
started = time.time()
remove_tree = shutil.rmtree
shutil.rmtree = lambda *args, **kwargs: None  # keep an interrupted build's objects
try:
    from gsplat.cuda._backend import _C
finally:
    shutil.rmtree = remove_tree
assert _C is not None, 'gsplat found no CUDA toolkit'
print('gsplat._C ready in', round(time.time() - started), 's:', _C.__file__)"
}

build_turbogs() {
  MAX_JOBS=8 python3 -c "
import importlib.util, os, time
from pathlib import Path
started = time.time()
lock = Path(os.environ['TURBOGS_BUILD_DIR']) / 'lock'
lock.unlink(missing_ok=True)  # left by a build cut short; torch would wait on it forever
spec = importlib.util.spec_from_file_location('turbogs_cuda_build', 'cuda/build.py')
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
module = build.load_jit()
print('turbogs._C ready in', round(time.time() - started), 's:', module.__file__)"
}

phase_builds() {
  if [[ $DRY_RUN == 1 ]]; then
    echo "dry run: CUDA builds skipped (no GPU); checking what they rely on"
    python3 -c "
import importlib.util
from importlib.metadata import version
spec = importlib.util.find_spec('gsplat.cuda._backend')
assert spec, 'gsplat.cuda._backend not found'
source = open(spec.origin).read()
# build_gsplat relies on this: gsplat wipes its build folder when the .so is missing.
assert 'shutil.rmtree(build_dir)' in source, 'gsplat no longer removes its build folder: revisit build_gsplat'
print('gsplat', version('gsplat'), 'backend found; it removes its build folder before a fresh build')" || return 1
    python3 -c "
import importlib.util
spec = importlib.util.spec_from_file_location('b', 'cuda/build.py'); b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b); assert callable(b.load_jit); print('cuda/build.py: load_jit found, build dir', b.default_build_dir())" \
      || return 1
    return 99
  fi
  mkdir -p "$TORCH_EXTENSIONS_DIR" "$TURBOGS_BUILD_DIR"
  build_gsplat >"$GPU_DIR/gsplat_build.log" 2>&1 &
  local gsplat_pid=$!
  build_turbogs >"$GPU_DIR/turbogs_build.log" 2>&1 &
  local turbogs_pid=$!
  wait $turbogs_pid; local turbogs_rc=$?
  wait $gsplat_pid; local gsplat_rc=$?
  echo "--- turbogs._C build (exit $turbogs_rc), last lines:"; tail -n 30 "$GPU_DIR/turbogs_build.log"
  echo "--- gsplat build (exit $gsplat_rc), last lines:"; tail -n 30 "$GPU_DIR/gsplat_build.log"
  ((turbogs_rc == 0 && gsplat_rc == 0))
}

phase_tests() {
  # Only the CUDA tests (on a CPU machine they are collected and skip).
  python3 -m pytest -m cuda -q -p no:cacheprovider -rs tests/test_render_cuda.py tests/test_turbo_cuda.py \
    >"$OUT/pytest_cuda.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/pytest_cuda.log"
  return $rc
}

export -f phase_environment phase_carry phase_install build_gsplat build_turbogs phase_builds phase_tests

say "gpu_build $(date -u +%FT%TZ) dry_run=$DRY_RUN deadline=${DEADLINE_S}s"
#          name         limit  reserve  function
run_phase "environment"   30      0  phase_environment
run_phase "carry"         30      0  phase_carry
run_phase "install"       90     90  phase_install
run_phase "builds"       300     60  phase_builds
if [[ ${GPU_BUILD_SKIP_TESTS:-0} == 1 ]]; then
  RESULTS+=("SKIP  cuda tests (GPU_BUILD_SKIP_TESTS=1)")
else
  run_phase "cuda tests"   150      0  phase_tests
fi
summary
exit $FAILED
