// Device helpers shared by the kernels: deterministic in-block sums and the launch macro.
// Include from .cu files only.
#pragma once

#include <cuda_runtime.h>

// Kernel launch. A macro so that tests can run the kernels on the CPU: cuda/cpu_emulation.h
// defines it first, as a loop that runs every block's threads as std::threads.
#ifndef TURBOGS_LAUNCH
#define TURBOGS_LAUNCH(kernel, grid, block, stream, ...) kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

namespace turbogs {

// Segmented sum of N values per thread over segments of `seg` consecutive slots (seg a
// power of two dividing nthreads). A fixed tree order, not atomics: the same inputs
// always give the same sums. Every thread of the block owns exactly one slot in
// [0, nthreads) and must call this (it synchronizes). On return `v` holds the sums of
// the thread's segment. `shared` must hold N * nthreads floats.
template <int N>
__device__ void segmented_sum(float* shared, float (&v)[N], int slot, int seg, int nthreads) {
    for (int j = 0; j < N; ++j) shared[j * nthreads + slot] = v[j];
    __syncthreads();
    for (int stride = seg >> 1; stride > 0; stride >>= 1) {
        if ((slot & (seg - 1)) < stride) {
            for (int j = 0; j < N; ++j) shared[j * nthreads + slot] += shared[j * nthreads + slot + stride];
        }
        __syncthreads();
    }
    const int head = slot & ~(seg - 1);
    for (int j = 0; j < N; ++j) v[j] = shared[j * nthreads + head];
    __syncthreads();  // the caller may reuse `shared` right away
}

// Sum over a whole block of blockDim.x threads (a power of two), N values per thread.
template <int N>
__device__ void block_sum(float* shared, float (&v)[N]) {
    segmented_sum<N>(shared, v, (int)threadIdx.x, (int)blockDim.x, (int)blockDim.x);
}

}  // namespace turbogs
