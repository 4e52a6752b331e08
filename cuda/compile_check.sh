#!/usr/bin/env bash
# Compile every kernel in cuda/ for sm_90 with nvcc alone (no torch, no GPU needed).
#
# The .cu files take raw pointers and a cudaStream_t, so they must build on a CPU-only
# machine; only cuda/bindings.cpp needs a CUDA build of torch. Exits non-zero when nvcc
# is missing or any file fails to compile. Objects go to a temporary folder.
# Usage: cuda/compile_check.sh   (NVCC=/path/to/nvcc to choose the compiler)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvcc="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$nvcc" ]]; then
    echo "compile_check: nvcc is not on PATH" >&2
    exit 2
fi

# The toolkit root, as nvcc itself resolves it (nvcc may be a wrapper script): its TOP.
cuda_root="$("$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)"
if [[ -z "$cuda_root" || ! -d "$cuda_root/include" ]]; then
    echo "compile_check: cannot find the CUDA include folder of $nvcc" >&2
    exit 2
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

shopt -s nullglob
sources=("$here"/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then
    echo "compile_check: no .cu files in $here" >&2
    exit 2
fi

failed=0
for src in "${sources[@]}"; do
    name="$(basename "$src" .cu)"
    if "$nvcc" -arch=sm_90 -std=c++17 -O3 --Werror all-warnings -I"$here" -I"$cuda_root/include" \
        -c "$src" -o "$out/$name.o"; then
        echo "ok      $name.cu"
    else
        echo "FAILED  $name.cu" >&2
        failed=1
    fi
done
exit "$failed"
