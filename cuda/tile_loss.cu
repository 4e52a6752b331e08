// Fused sparse tile loss: L1 + lambda_ssim * (1 - SSIM) + lambda_ncc * NCC term, forward
// and backward, one thread block per sampled tile and one thread per tile pixel.
//
// Twin: tile_loss_per_tile in turbogs/turbo/_torch_impl.py (the definitions are in
// turbogs/turbo/losses.py). Only the sampled tiles' pixels are read; all the others may
// hold garbage. The backward pass recomputes the block statistics instead of storing them.
#include <math.h>

#include <type_traits>

#include "device_common.h"
#include "turbo_kernels.h"

namespace turbogs {
namespace {

constexpr int kMaxValues = 9;  // most values reduced at once (second moments: 3 x 3)

// Weighted first and centred second moments of one block, per channel (population stats).
struct Moments {
    float n;  // weight sum
    float mu_r[3], mu_g[3], var_r[3], var_g[3], cov[3];
};

// Slot of pixel (ly, lx) when each patch x patch block occupies consecutive slots.
__device__ __forceinline__ int block_slot(int ly, int lx, int tile_size, int patch) {
    const int blocks_per_row = tile_size / patch;
    const int block = (ly / patch) * blocks_per_row + lx / patch;
    return block * patch * patch + (ly % patch) * patch + (lx % patch);
}

__device__ __forceinline__ float safe_div(float num, float den) { return den > 0.0f ? num / den : 0.0f; }

__device__ Moments block_moments(float* shared, const float (&r)[3], const float (&g)[3], float w, int slot,
                                 int seg, int nthreads) {
    Moments m;
    float first[7] = {w, w * r[0], w * r[1], w * r[2], w * g[0], w * g[1], w * g[2]};
    segmented_sum<7>(shared, first, slot, seg, nthreads);
    m.n = first[0];
    float dr[3], dg[3];
    for (int c = 0; c < 3; ++c) {
        m.mu_r[c] = safe_div(first[1 + c], m.n);
        m.mu_g[c] = safe_div(first[4 + c], m.n);
        dr[c] = r[c] - m.mu_r[c];
        dg[c] = g[c] - m.mu_g[c];
    }
    float second[9];
    for (int c = 0; c < 3; ++c) {
        second[c] = w * dr[c] * dr[c];
        second[3 + c] = w * dg[c] * dg[c];
        second[6 + c] = w * dr[c] * dg[c];
    }
    segmented_sum<9>(shared, second, slot, seg, nthreads);
    for (int c = 0; c < 3; ++c) {
        m.var_r[c] = safe_div(second[c], m.n);
        m.var_g[c] = safe_div(second[3 + c], m.n);
        m.cov[c] = safe_div(second[6 + c], m.n);
    }
    return m;
}

// TS = p.tile_size, a template parameter so that shared memory is sized statically.
template <int TS, bool kBackward>
__global__ void __launch_bounds__(TS * TS)
    tile_loss_kernel(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                     TileLossParams p, float* tile_loss, float* tile_weight, const float* tile_scale,
                     float* grad_render) {
    constexpr int nthreads = TS * TS;
    __shared__ float shared[kMaxValues * nthreads];
    const int ts = TS;
    const int tid = threadIdx.x;
    const int ly = tid / ts, lx = tid % ts;
    const int64_t tile = blockIdx.x;

    // This thread's pixel; ids outside the grid are empty tiles.
    const int64_t tiles_x = (p.width + ts - 1) / ts;
    const int64_t tiles_y = (p.height + ts - 1) / ts;
    const int64_t id = tile_ids[tile];
    const bool in_grid = id >= 0 && id < tiles_x * tiles_y;
    const int64_t y = in_grid ? (id / tiles_x) * ts + ly : 0;
    const int64_t x = in_grid ? (id % tiles_x) * ts + lx : 0;
    const bool valid = in_grid && y < p.height && x < p.width;
    const int64_t pix = y * p.width + x;

    float w = 0.0f;
    float r[3] = {0.0f, 0.0f, 0.0f}, g[3] = {0.0f, 0.0f, 0.0f};
    if (valid) {
        const float m = mask != nullptr ? mask[pix] : 1.0f;
        if (m > 0.0f) {  // uncounted pixels may hold NaN: never load them
            w = m;
            for (int c = 0; c < 3; ++c) {
                r[c] = render[pix * 3 + c];
                g[c] = gt[pix * 3 + c];
            }
        }
    }

    // SSIM of this pixel's ssim_patch block, per channel, and dS_c / d r_c (times n / w).
    const Moments s = block_moments(shared, r, g, w, block_slot(ly, lx, ts, p.ssim_patch),
                                    p.ssim_patch * p.ssim_patch, nthreads);
    float ssim_sum = 0.0f;
    float dssim[3];
    for (int c = 0; c < 3; ++c) {
        const float a1 = 2.0f * s.mu_r[c] * s.mu_g[c] + p.ssim_c1;
        const float a2 = 2.0f * s.cov[c] + p.ssim_c2;
        const float b1 = s.mu_r[c] * s.mu_r[c] + s.mu_g[c] * s.mu_g[c] + p.ssim_c1;
        const float b2 = s.var_r[c] + s.var_g[c] + p.ssim_c2;
        ssim_sum += (a1 * a2) / (b1 * b2);
        const float d_mu = 2.0f * a2 * (s.mu_g[c] * b1 - s.mu_r[c] * a1) / (b1 * b1 * b2);
        const float d_var = -(a1 * a2) / (b1 * b2 * b2);
        const float d_cov = 2.0f * a1 / (b1 * b2);
        dssim[c] = d_mu + 2.0f * (r[c] - s.mu_r[c]) * d_var + (g[c] - s.mu_g[c]) * d_cov;
    }
    const float ssim = ssim_sum / 3.0f;

    // NCC of this pixel's ncc_patch block over the 3 channels, and its GT confidence.
    const Moments q = block_moments(shared, r, g, w, block_slot(ly, lx, ts, p.ncc_patch),
                                    p.ncc_patch * p.ncc_patch, nthreads);
    const float cov_sum = q.cov[0] + q.cov[1] + q.cov[2];
    const float var_r_sum = q.var_r[0] + q.var_r[1] + q.var_r[2];
    const float var_g_sum = q.var_g[0] + q.var_g[1] + q.var_g[2];
    const float den_r = var_r_sum + p.ncc_eps;
    const float den = sqrtf(den_r * (var_g_sum + p.ncc_eps));
    const float ncc = (cov_sum + p.ncc_eps) / den;
    const float confidence = fminf(fmaxf(sqrtf(var_g_sum / 3.0f) / p.ncc_std_ref, 0.0f), 1.0f);

    // Tile sums: sum_p w_p * (block value of p) = sum over blocks of n_block * value.
    const float l1 = (fabsf(r[0] - g[0]) + fabsf(r[1] - g[1]) + fabsf(r[2] - g[2])) / 3.0f;
    float sums[4] = {w, w * l1, w * ssim, w * confidence * (1.0f - ncc)};
    segmented_sum<4>(shared, sums, tid, nthreads, nthreads);
    const float n_tile = sums[0];

    if (!kBackward) {
        if (tid == 0) {
            const float total = sums[1] + p.lambda_ssim * (n_tile - sums[2]) + p.lambda_ncc * sums[3];
            tile_loss[tile] = safe_div(total, n_tile);
            tile_weight[tile] = n_tile;
        }
        return;
    }
    // Backward. With block moments dmu/dr = w/n, dvar/dr = 2w(r - mu)/n, dcov/dr = w(g - mu_g)/n,
    // and each block weighted by its n in the tile sums, the n cancels:
    //   dL_i/dr_c = (w / N) * [sign(r_c - g_c) / 3 - lambda_ssim * dssim_c / 3 - lambda_ncc * conf * dncc_c].
    if (!(w > 0.0f) || !(n_tile > 0.0f)) return;  // uncounted pixel: zero gradient
    const float scale = tile_scale[tile] / n_tile;
    for (int c = 0; c < 3; ++c) {
        const float diff = r[c] - g[c];
        const float sign = (float)((diff > 0.0f) - (diff < 0.0f));
        const float dncc = (g[c] - q.mu_g[c]) / den - ncc * (r[c] - q.mu_r[c]) / den_r;
        const float grad = sign / 3.0f - p.lambda_ssim * dssim[c] / 3.0f - p.lambda_ncc * confidence * dncc;
        atomicAdd(&grad_render[pix * 3 + c], scale * w * grad);
    }
}

// Calls launch(std::integral_constant<int, TS>) for the runtime tile size.
template <class Launch>
void with_tile_size(int tile_size, Launch launch) {
    switch (tile_size) {
        case 2: launch(std::integral_constant<int, 2>()); break;
        case 4: launch(std::integral_constant<int, 4>()); break;
        case 8: launch(std::integral_constant<int, 8>()); break;
        case 16: launch(std::integral_constant<int, 16>()); break;
        case 32: launch(std::integral_constant<int, 32>()); break;
        default: break;  // rejected by the bindings (and LossConfig) before any launch
    }
}

}  // namespace

void launch_tile_loss_forward(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                              int64_t k, TileLossParams params, float* tile_loss, float* tile_weight,
                              cudaStream_t stream) {
    if (k <= 0) return;
    with_tile_size(params.tile_size, [&](auto tile_size) {
        constexpr int TS = decltype(tile_size)::value;
        auto kernel = tile_loss_kernel<TS, false>;
        TURBOGS_LAUNCH(kernel, (unsigned)k, TS * TS, stream, render, gt, mask, tile_ids, params, tile_loss,
                       tile_weight, nullptr, nullptr);
    });
}

void launch_tile_loss_backward(const float* render, const float* gt, const float* mask, const int64_t* tile_ids,
                               int64_t k, TileLossParams params, const float* tile_scale, float* grad_render,
                               cudaStream_t stream) {
    if (k <= 0) return;
    with_tile_size(params.tile_size, [&](auto tile_size) {
        constexpr int TS = decltype(tile_size)::value;
        auto kernel = tile_loss_kernel<TS, true>;
        TURBOGS_LAUNCH(kernel, (unsigned)k, TS * TS, stream, render, gt, mask, tile_ids, params, nullptr, nullptr,
                       tile_scale, grad_render);
    });
}

}  // namespace turbogs
