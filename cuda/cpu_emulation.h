// Run the kernels of cuda/*.cu on the CPU, for tests on machines without a GPU.
//
// Include this header first, then the .cu files, and compile the result as C++20 with
// g++ (see tests/test_turbo_cuda.py). Every block runs as blockDim.x std::threads that meet
// at a std::barrier in __syncthreads(); blocks run one after another, so __shared__
// arrays become function statics. Pointers are host pointers and streams are ignored.
// This checks the kernels' indexing, reductions and formulas against the torch twins;
// it says nothing about their speed or about GPU-only details (warps, memory model).
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_runtime.h>  // for dim3 / uint3 / cudaStream_t only; no CUDA call is made

#undef __global__
#undef __device__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __launch_bounds__(...)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

namespace turbogs_emulation {

inline thread_local uint3 thread_index;
inline thread_local uint3 block_index;
inline dim3 block_dim;
inline std::barrier<>* block_barrier = nullptr;
inline std::mutex atomic_mutex;

// Run `kernel()` as `grid` blocks of `block` threads.
template <class Kernel>
void launch(unsigned grid, unsigned block, Kernel kernel) {
    block_dim = dim3(block, 1, 1);
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> barrier((std::ptrdiff_t)block);
        block_barrier = &barrier;
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned t = 0; t < block; ++t) {
            threads.emplace_back([&, t, b] {
                thread_index = uint3{t, 0, 0};
                block_index = uint3{b, 0, 0};
                kernel();
            });
        }
        for (auto& thread : threads) thread.join();
        block_barrier = nullptr;
    }
}

}  // namespace turbogs_emulation

#define threadIdx turbogs_emulation::thread_index
#define blockIdx turbogs_emulation::block_index
#define blockDim turbogs_emulation::block_dim

inline void __syncthreads() { turbogs_emulation::block_barrier->arrive_and_wait(); }

inline float atomicAdd(float* address, float value) {
    std::lock_guard<std::mutex> lock(turbogs_emulation::atomic_mutex);
    const float old = *address;
    *address = old + value;
    return old;
}

#define TURBOGS_LAUNCH(kernel, grid, block, stream, ...) \
    turbogs_emulation::launch((unsigned)(grid), (unsigned)(block), [&] { kernel(__VA_ARGS__); })

// C entry points for ctypes: the launchers of turbo_kernels.h with host pointers.
#include "turbo_kernels.h"

extern "C" {

inline turbogs::TileLossParams emulation_params(int height, int width, int tile_size, int ssim_patch,
                                                int ncc_patch, float lambda_ssim, float lambda_ncc,
                                                float ncc_eps, float ncc_std_ref, float ssim_c1,
                                                float ssim_c2) {
    return turbogs::TileLossParams{height, width, tile_size, ssim_patch, ncc_patch, lambda_ssim,
                                   lambda_ncc, ncc_eps, ncc_std_ref, ssim_c1, ssim_c2};
}

void emu_memory_update(float* errors_row, int64_t num_tiles, const int64_t* tile_ids, const float* tile_errors,
                       int64_t k, float decay) {
    turbogs::launch_memory_update(errors_row, num_tiles, tile_ids, tile_errors, k, decay, nullptr);
}

void emu_view_sample_keys(const float* errors, const int64_t* tile_counts, int64_t num_views, int64_t max_tiles,
                          float view_floor, const float* uniforms, float* scratch, float* keys) {
    turbogs::launch_view_sample_keys(errors, tile_counts, num_views, max_tiles, view_floor, uniforms, scratch, keys,
                                     nullptr);
}

void emu_tile_sample_keys(const float* errors_row, int64_t num_tiles, float gamma, float tile_floor,
                          const float* uniforms, float* keys) {
    turbogs::launch_tile_sample_keys(errors_row, num_tiles, gamma, tile_floor, uniforms, keys, nullptr);
}

void emu_tile_loss_forward(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                           int64_t k, int height, int width, int tile_size, int ssim_patch, int ncc_patch,
                           float lambda_ssim, float lambda_ncc, float ncc_eps, float ncc_std_ref, float ssim_c1,
                           float ssim_c2, float* tile_loss, float* tile_weight) {
    turbogs::launch_tile_loss_forward(
        render, gt, mask, tile_ids, k,
        emulation_params(height, width, tile_size, ssim_patch, ncc_patch, lambda_ssim, lambda_ncc, ncc_eps,
                         ncc_std_ref, ssim_c1, ssim_c2),
        tile_loss, tile_weight, nullptr);
}

void emu_tile_loss_backward(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                            int64_t k, int height, int width, int tile_size, int ssim_patch, int ncc_patch,
                            float lambda_ssim, float lambda_ncc, float ncc_eps, float ncc_std_ref, float ssim_c1,
                            float ssim_c2, const float* tile_scale, float* grad_render) {
    turbogs::launch_tile_loss_backward(
        render, gt, mask, tile_ids, k,
        emulation_params(height, width, tile_size, ssim_patch, ncc_patch, lambda_ssim, lambda_ncc, ncc_eps,
                         ncc_std_ref, ssim_c1, ssim_c2),
        tile_scale, grad_render, nullptr);
}

}  // extern "C"
