#!/usr/bin/env bash
# Fill the git-ignored .carry/ folder with what benchmarks/gpu_build.sh and gpu_check.sh need on a GPU
# machine that has no network: run it here (a CPU machine that reaches PyPI), then send
# .carry along with the working tree (the device tool's `carry: [".carry"]`).
#
#   .carry/wheels/       gsplat 1.5.3, plyfile, viser 1.1.1 and every dependency of theirs
#                        that the GPU machine lacks, as CPython 3.12 manylinux x86_64 wheels
#   .carry/test_colmap/  the 23-image COLMAP test capture (images/ and sparse/)
#
# Which dependencies: each downloaded wheel's METADATA (Requires-Dist) is read, and what
# neither the GPU machine has (H200_HAS in gpu_common.sh) nor .carry holds is downloaded,
# until nothing is missing (gpu_build.sh --list-missing does the reading).
#
# Settings (environment): CARRY_DIR (.carry), SCENE_SRC (../shared/data/test_colmap).
# The whole working tree that travels is limited to 64 MiB; the size is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=${CARRY_DIR:-.carry}
SCENE_SRC=${SCENE_SRC:-../shared/data/test_colmap}
TOP_LEVEL="gsplat==1.5.3 plyfile viser==1.1.1"  # as CARRY_REQUIRES in gpu_common.sh

download() {  # exact wheels for the GPU machine's Python, whatever this machine runs
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$CARRY/wheels" "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

[[ -d $SCENE_SRC/images && -d $SCENE_SRC/sparse ]] || { echo "no COLMAP capture at $SCENE_SRC" >&2; exit 1; }
mkdir -p "$CARRY/wheels"
rm -f "$CARRY"/wheels/*.whl  # exactly what this run resolves, nothing stale

echo "downloading $TOP_LEVEL"
# shellcheck disable=SC2086
download $TOP_LEVEL
for round in 1 2 3 4 5 6 7 8; do
  mapfile -t missing < <(CARRY_DIR=$CARRY bash benchmarks/gpu_build.sh --list-missing)
  ((${#missing[@]} == 0)) && break
  echo "round $round: downloading ${missing[*]}"
  download "${missing[@]}"
done
still_missing=$(CARRY_DIR=$CARRY bash benchmarks/gpu_build.sh --list-missing)
if [[ -n $still_missing ]]; then
  echo "dependencies still missing after 8 rounds: $still_missing" >&2
  exit 1
fi

echo "copying $SCENE_SRC -> $CARRY/test_colmap"
rm -rf "$CARRY/test_colmap"
mkdir -p "$CARRY/test_colmap"
cp -r "$SCENE_SRC/images" "$SCENE_SRC/sparse" "$CARRY/test_colmap/"
chmod -R u+w "$CARRY/test_colmap"  # the source is read-only; the run caches downscaled images here

echo
ls -l "$CARRY/wheels" | awk 'NR > 1 { printf "  %8.1f KiB  %s\n", $5 / 1024, $9 }'
carry_bytes=$(du -sb "$CARRY" | cut -f1)
tree_bytes=$( { git ls-files -z --cached --others --exclude-standard 2>/dev/null || true; } \
  | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
awk -v carry="$carry_bytes" -v tree="$tree_bytes" 'BEGIN {
  printf "carry: %.1f MiB; working tree without ignored files: %.1f MiB; together %.1f of 64 MiB\n",
    carry / 1048576, tree / 1048576, (carry + tree) / 1048576 }'
