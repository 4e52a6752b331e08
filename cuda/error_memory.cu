// Error memory update and the Gumbel keys of tile sampling.
//
// Twins: memory_update, view_sample_keys and tile_sample_keys in
// turbogs/turbo/_torch_impl.py. The caller picks the argmax of the view keys and the
// top k of the tile keys (torch.topk), which for Gumbel keys is sampling proportional to
// the weights, without replacement.
#include <math.h>

#include "device_common.h"
#include "turbo_kernels.h"

namespace turbogs {
namespace {

constexpr int kThreads = 256;
constexpr int kTileKeyThreads = 1024;

__device__ __forceinline__ float gumbel(float u) {
    u = fminf(fmaxf(u, U_MIN), U_MAX);
    return -logf(-logf(u));
}

__global__ void memory_update_kernel(float* errors_row, int64_t num_tiles, const int64_t* tile_ids,
                                     const float* tile_errors, int64_t k, float decay) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= k) return;
    const int64_t t = tile_ids[i];
    const float x = tile_errors[i];
    if (t < 0 || t >= num_tiles || !isfinite(x)) return;
    const float e = errors_row[t];
    errors_row[t] = isinf(e) ? x : decay * e + (1.0f - decay) * x;
}

// One block per view: mean error of its seen tiles, and whether it has unseen ones.
__global__ void view_stats_kernel(const float* errors, const int64_t* tile_counts, int64_t num_views,
                                  int64_t max_tiles, float* view_mean, float* view_has_unseen) {
    __shared__ float shared[3 * kThreads];
    const int64_t view = blockIdx.x;
    const float* row = errors + view * max_tiles;
    const int64_t count = tile_counts[view];
    float v[3] = {0.0f, 0.0f, 0.0f};  // seen sum, seen count, unseen count
    for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
        const float e = row[t];
        if (isinf(e)) {
            v[2] += 1.0f;
        } else {
            v[0] += e;
            v[1] += 1.0f;
        }
    }
    block_sum<3>(shared, v);
    if (threadIdx.x == 0) {
        view_mean[view] = v[1] > 0.0f ? v[0] / v[1] : 0.0f;
        view_has_unseen[view] = v[2] > 0.0f ? 1.0f : 0.0f;
    }
}

// One block: keys of all views from their means and the mean over views.
__global__ void view_keys_kernel(const float* view_mean, const float* view_has_unseen, int64_t num_views,
                                 float view_floor, const float* uniforms, float* keys) {
    __shared__ float shared[kThreads];
    float v[1] = {0.0f};
    for (int64_t i = threadIdx.x; i < num_views; i += blockDim.x) v[0] += view_mean[i];
    block_sum<1>(shared, v);
    const float mean_over_views = v[0] / (float)num_views;
    for (int64_t i = threadIdx.x; i < num_views; i += blockDim.x) {
        const float g = gumbel(uniforms[i]);
        const float weight = view_mean[i] + view_floor * mean_over_views + TINY;
        keys[i] = view_has_unseen[i] > 0.0f ? UNSEEN_KEY + g : logf(weight) + g;
    }
}

// One block: the mean of e^gamma over the view's seen tiles, then every tile's key.
__global__ void __launch_bounds__(kTileKeyThreads)
    tile_keys_kernel(const float* errors_row, int64_t num_tiles, float gamma, float tile_floor, const float* uniforms,
                     float* keys) {
    __shared__ float shared[2 * kTileKeyThreads];
    float v[2] = {0.0f, 0.0f};  // sum of e^gamma, seen count
    for (int64_t t = threadIdx.x; t < num_tiles; t += blockDim.x) {
        const float e = errors_row[t];
        if (!isinf(e)) {
            v[0] += powf(fmaxf(e, 0.0f), gamma);
            v[1] += 1.0f;
        }
    }
    block_sum<2>(shared, v);
    const float mean = v[1] > 0.0f ? v[0] / v[1] : 0.0f;
    for (int64_t t = threadIdx.x; t < num_tiles; t += blockDim.x) {
        const float e = errors_row[t];
        const float g = gumbel(uniforms[t]);
        if (isinf(e)) {
            keys[t] = UNSEEN_KEY + g;
        } else {
            keys[t] = logf(powf(fmaxf(e, 0.0f), gamma) + tile_floor * mean + TINY) + g;
        }
    }
}

}  // namespace

void launch_memory_update(float* errors_row, int64_t num_tiles, const int64_t* tile_ids,
                          const float* tile_errors, int64_t k, float decay, cudaStream_t stream) {
    if (k <= 0) return;
    const int blocks = (int)((k + kThreads - 1) / kThreads);
    TURBOGS_LAUNCH(memory_update_kernel, blocks, kThreads, stream, errors_row, num_tiles, tile_ids, tile_errors, k,
                   decay);
}

void launch_view_sample_keys(const float* errors, const int64_t* tile_counts, int64_t num_views,
                             int64_t max_tiles, float view_floor, const float* uniforms, float* scratch,
                             float* keys, cudaStream_t stream) {
    if (num_views <= 0) return;
    float* view_mean = scratch;
    float* view_has_unseen = scratch + num_views;
    TURBOGS_LAUNCH(view_stats_kernel, (unsigned)num_views, kThreads, stream, errors, tile_counts, num_views, max_tiles,
                   view_mean, view_has_unseen);
    TURBOGS_LAUNCH(view_keys_kernel, 1, kThreads, stream, view_mean, view_has_unseen, num_views, view_floor, uniforms,
                   keys);
}

void launch_tile_sample_keys(const float* errors_row, int64_t num_tiles, float gamma, float tile_floor,
                             const float* uniforms, float* keys, cudaStream_t stream) {
    if (num_tiles <= 0) return;
    TURBOGS_LAUNCH(tile_keys_kernel, 1, kTileKeyThreads, stream, errors_row, num_tiles, gamma, tile_floor, uniforms,
                   keys);
}

}  // namespace turbogs
