// Launchers of the TurboGS kernels: raw device pointers, sizes and a stream; no torch.
//
// cuda/bindings.cpp wraps them for Python (turbogs._C). The semantics of every launcher
// are those of its twin in turbogs/turbo/_torch_impl.py, the test oracle.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace turbogs {

// Constants shared with turbogs/turbo/_torch_impl.py (same names there).
constexpr float UNSEEN_KEY = 1000.0f;  // key offset of never-rendered views/tiles
constexpr float TINY = 1e-20f;         // keeps log(weight) finite
constexpr float U_MIN = 1e-12f;        // uniforms are clamped to [U_MIN, U_MAX]
constexpr float U_MAX = 0.99999994f;   // the largest float below 1

// --- error memory (error_memory.cu) ----------------------------------------------------

// errors_row[t] <- x on the first observation (+inf before), else decay*e + (1-decay)*x,
// for t = tile_ids[i], x = tile_errors[i]; ids outside [0, num_tiles) and non-finite x
// are skipped. tile_ids must be unique.
void launch_memory_update(float* errors_row, int64_t num_tiles, const int64_t* tile_ids,
                          const float* tile_errors, int64_t k, float decay, cudaStream_t stream);

// keys[v] for v < num_views from errors [num_views, max_tiles] and tile_counts [num_views].
// scratch: 2 * num_views floats of device memory.
void launch_view_sample_keys(const float* errors, const int64_t* tile_counts, int64_t num_views,
                             int64_t max_tiles, float view_floor, const float* uniforms, float* scratch,
                             float* keys, cudaStream_t stream);

// keys[t] for t < num_tiles from one view's row of errors.
void launch_tile_sample_keys(const float* errors_row, int64_t num_tiles, float gamma, float tile_floor,
                             const float* uniforms, float* keys, cudaStream_t stream);

// --- sparse tile loss (tile_loss.cu) ---------------------------------------------------

struct TileLossParams {
    int height, width;    // image size in pixels
    int tile_size;        // power of two, <= 32 (one thread per tile pixel)
    int ssim_patch;       // power of two dividing tile_size
    int ncc_patch;        // power of two dividing tile_size
    float lambda_ssim, lambda_ncc;
    float ncc_eps, ncc_std_ref;
    float ssim_c1, ssim_c2;
};

// Per sampled tile i: tile_loss[i] = L_i and tile_weight[i] = N_i (its counted-pixel weight).
// render, gt: [H, W, 3] float32; mask: [H, W] float32 or nullptr; tile_ids: [k] int64.
void launch_tile_loss_forward(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                              int64_t k, TileLossParams params, float* tile_loss, float* tile_weight,
                              cudaStream_t stream);

// grad_render [H, W, 3] (zeroed by the caller) += tile_scale[i] * dL_i / d render for the
// pixels of each sampled tile; tile_scale[i] is dLoss/dL_i.
void launch_tile_loss_backward(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                               int64_t k, TileLossParams params, const float* tile_scale, float* grad_render,
                               cudaStream_t stream);

}  // namespace turbogs
