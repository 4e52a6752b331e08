// The sparse tile loss on the CPU: L1 + lambda_ssim * (1 - SSIM) + lambda_ncc * NCC term of
// each sampled tile, forward and backward, with the rules of the torch twin
// (turbogs/kernels/turbo_torch.py `tile_loss_per_tile`; the definitions are in
// turbogs/turbo/losses.py) and the signatures of the CUDA kernel's bindings (cuda/tile_loss.cu,
// whose per-pixel gradient formula this shares):
//
// - a pixel counts with weight mask (1 without a mask) where it is inside the image and that
//   weight is > 0; uncounted pixels (outside, masked, or undefined in a sparse render, which
//   may hold NaN) are never read and get a zero gradient;
// - SSIM and NCC come from the weighted first and centred second moments of each
//   ssim_patch / ncc_patch block of the tile; a block counts by its weight sum n;
// - a tile's loss is its sum over counted pixels divided by their weight N (0 for none).
//
// Why native: the twin is some 150 small torch ops forward and backward (gathers, reshapes into
// blocks, masked moments), 15 ms for the 176 tiles of a 250x165 view on one core: 14 % of a
// full turbo step at 10k Gaussians, the same at any count. Here a tile is a few passes over
// its 256 pixels in the cache.
// Each tile is computed alone, and the backward adds the tiles' gradients into the image in
// tile order, one thread: the bits do not depend on the thread count, also when a tile is
// listed twice.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

namespace {

constexpr int kMaxTileSize = 32;

struct Params {
  int64_t tile_size, ssim_patch, ncc_patch;
  double lambda_ssim, lambda_ncc, ncc_eps, ncc_std_ref, ssim_c1, ssim_c2;
};

template <typename T>
T safe_div(T num, T den) {
  return den > 0 ? num / den : T(0);
}

// One tile's counted pixels, row-major within the tile: weight w (0 = not counted), render r
// and ground truth g (0 where not counted).
template <typename T>
struct TilePixels {
  T w[kMaxTileSize * kMaxTileSize];
  T r[kMaxTileSize * kMaxTileSize][3], g[kMaxTileSize * kMaxTileSize][3];
  int64_t pixel[kMaxTileSize * kMaxTileSize];  // index into the image, -1 outside it
  T n_tile;

  void load(const T* render, const T* gt, const T* mask, int64_t tile_id, int64_t width, int64_t height,
            int64_t ts) {
    const int64_t tiles_x = (width + ts - 1) / ts, tiles_y = (height + ts - 1) / ts;
    const bool in_grid = tile_id >= 0 && tile_id < tiles_x * tiles_y;  // ids outside the grid: empty tiles
    const int64_t y0 = in_grid ? tile_id / tiles_x * ts : 0, x0 = in_grid ? tile_id % tiles_x * ts : 0;
    n_tile = 0;
    for (int64_t ly = 0; ly < ts; ++ly) {
      for (int64_t lx = 0; lx < ts; ++lx) {
        const int64_t p = ly * ts + lx, y = y0 + ly, x = x0 + lx;
        pixel[p] = in_grid && y < height && x < width ? y * width + x : -1;
        const T m = pixel[p] < 0 ? T(0) : mask != nullptr ? mask[pixel[p]] : T(1);
        w[p] = m > 0 ? m : T(0);  // NaN too: not counted
        for (int c = 0; c < 3; ++c) {
          r[p][c] = w[p] > 0 ? render[pixel[p] * 3 + c] : T(0);
          g[p][c] = w[p] > 0 ? gt[pixel[p] * 3 + c] : T(0);
        }
        n_tile += w[p];
      }
    }
  }
};

// Weighted first and centred second moments of one block, per channel (population statistics).
template <typename T>
struct Moments {
  T n = 0, mu_r[3] = {0, 0, 0}, mu_g[3] = {0, 0, 0}, var_r[3] = {0, 0, 0}, var_g[3] = {0, 0, 0}, cov[3] = {0, 0, 0};

  Moments(const TilePixels<T>& t, int64_t ts, int64_t y0, int64_t x0, int64_t patch) {
    T sum_r[3] = {0, 0, 0}, sum_g[3] = {0, 0, 0};
    for (int64_t y = y0; y < y0 + patch; ++y)
      for (int64_t x = x0; x < x0 + patch; ++x) {
        const int64_t p = y * ts + x;
        n += t.w[p];
        for (int c = 0; c < 3; ++c) sum_r[c] += t.w[p] * t.r[p][c], sum_g[c] += t.w[p] * t.g[p][c];
      }
    for (int c = 0; c < 3; ++c) mu_r[c] = safe_div(sum_r[c], n), mu_g[c] = safe_div(sum_g[c], n);
    for (int64_t y = y0; y < y0 + patch; ++y)
      for (int64_t x = x0; x < x0 + patch; ++x) {
        const int64_t p = y * ts + x;
        for (int c = 0; c < 3; ++c) {
          const T dr = t.r[p][c] - mu_r[c], dg = t.g[p][c] - mu_g[c];
          var_r[c] += t.w[p] * dr * dr, var_g[c] += t.w[p] * dg * dg, cov[c] += t.w[p] * dr * dg;
        }
      }
    for (int c = 0; c < 3; ++c)
      var_r[c] = safe_div(var_r[c], n), var_g[c] = safe_div(var_g[c], n), cov[c] = safe_div(cov[c], n);
  }
};

// A block's SSIM per channel and its partial derivatives (mean, variance, covariance of r).
template <typename T>
struct Ssim {
  T value[3], d_mu[3], d_var[3], d_cov[3];

  Ssim(const Moments<T>& m, const Params& p) {
    const T c1 = T(p.ssim_c1), c2 = T(p.ssim_c2);
    for (int c = 0; c < 3; ++c) {
      const T a1 = 2 * m.mu_r[c] * m.mu_g[c] + c1, a2 = 2 * m.cov[c] + c2;
      const T b1 = m.mu_r[c] * m.mu_r[c] + m.mu_g[c] * m.mu_g[c] + c1, b2 = m.var_r[c] + m.var_g[c] + c2;
      value[c] = (a1 * a2) / (b1 * b2);
      d_mu[c] = 2 * a2 * (m.mu_g[c] * b1 - m.mu_r[c] * a1) / (b1 * b1 * b2);
      d_var[c] = -(a1 * a2) / (b1 * b2 * b2);
      d_cov[c] = 2 * a1 / (b1 * b2);
    }
  }
};

// A block's NCC over the 3 channels (each centred on its own mean), its denominators, and the
// ground truth's confidence clamp(RMS std / std_ref, 0, 1), which passes no gradient.
template <typename T>
struct Ncc {
  T value, den, den_r, confidence;

  Ncc(const Moments<T>& m, const Params& p) {
    const T eps = T(p.ncc_eps);
    const T cov = m.cov[0] + m.cov[1] + m.cov[2], var_r = m.var_r[0] + m.var_r[1] + m.var_r[2];
    const T var_g = m.var_g[0] + m.var_g[1] + m.var_g[2];
    den_r = var_r + eps;
    den = std::sqrt(den_r * (var_g + eps));
    value = (cov + eps) / den;
    confidence = std::min(std::max(std::sqrt(var_g / T(3)) / T(p.ncc_std_ref), T(0)), T(1));
  }
};

// Calls fn(moments, y0, x0) for each patch x patch block of the tile, (y0, x0) its corner.
template <typename T, class Fn>
void for_each_block(const TilePixels<T>& t, int64_t ts, int64_t patch, Fn fn) {
  for (int64_t y0 = 0; y0 < ts; y0 += patch)
    for (int64_t x0 = 0; x0 < ts; x0 += patch) fn(Moments<T>(t, ts, y0, x0, patch), y0, x0);
}

// Calls fn(i) for each counted pixel of the block at (y0, x0), i its index in the tile.
template <typename T, class Fn>
void for_each_counted(const TilePixels<T>& t, int64_t ts, int64_t y0, int64_t x0, int64_t patch, Fn fn) {
  for (int64_t y = y0; y < y0 + patch; ++y)
    for (int64_t x = x0; x < x0 + patch; ++x)
      if (t.w[y * ts + x] > 0) fn(y * ts + x);
}

// The tile's loss sum over its counted pixels.
template <typename T>
T tile_total(const TilePixels<T>& t, const Params& p) {
  const int64_t ts = p.tile_size;
  T l1 = 0;
  for (int64_t i = 0; i < ts * ts; ++i)
    l1 += t.w[i] *
          (std::abs(t.r[i][0] - t.g[i][0]) + std::abs(t.r[i][1] - t.g[i][1]) + std::abs(t.r[i][2] - t.g[i][2])) / T(3);
  T ssim_sum = 0, ncc_sum = 0;
  for_each_block(t, ts, p.ssim_patch, [&](const Moments<T>& m, int64_t, int64_t) {
    const Ssim<T> s(m, p);
    ssim_sum += m.n * ((s.value[0] + s.value[1] + s.value[2]) / T(3));
  });
  for_each_block(t, ts, p.ncc_patch, [&](const Moments<T>& m, int64_t, int64_t) {
    const Ncc<T> q(m, p);
    ncc_sum += m.n * q.confidence * (1 - q.value);
  });
  return l1 + T(p.lambda_ssim) * (t.n_tile - ssim_sum) + T(p.lambda_ncc) * ncc_sum;
}

// d(tile total)/d r at each counted pixel, times `scale`, into grad [ts * ts][3]. With block moments
// dmu/dr = w/n, dvar/dr = 2w(r - mu)/n, dcov/dr = w(g - mu_g)/n and each block weighted by its n,
// the n cancels:
//   d/dr_c = w * [sign(r_c - g_c) / 3 - lambda_ssim * dssim_c / 3 - lambda_ncc * conf * dncc_c].
template <typename T>
void tile_gradient(const TilePixels<T>& t, const Params& p, T scale, T (*grad)[3]) {
  const int64_t ts = p.tile_size;
  for (int64_t i = 0; i < ts * ts; ++i) grad[i][0] = grad[i][1] = grad[i][2] = 0;
  for_each_block(t, ts, p.ssim_patch, [&](const Moments<T>& m, int64_t y0, int64_t x0) {
    const Ssim<T> s(m, p);
    for_each_counted(t, ts, y0, x0, p.ssim_patch, [&](int64_t i) {
      for (int c = 0; c < 3; ++c) {
        const T d_ssim = s.d_mu[c] + 2 * (t.r[i][c] - m.mu_r[c]) * s.d_var[c] + (t.g[i][c] - m.mu_g[c]) * s.d_cov[c];
        const T diff = t.r[i][c] - t.g[i][c];
        const T sign = T((diff > 0) - (diff < 0));
        grad[i][c] += sign / T(3) - T(p.lambda_ssim) * d_ssim / T(3);
      }
    });
  });
  for_each_block(t, ts, p.ncc_patch, [&](const Moments<T>& m, int64_t y0, int64_t x0) {
    const Ncc<T> q(m, p);
    for_each_counted(t, ts, y0, x0, p.ncc_patch, [&](int64_t i) {
      for (int c = 0; c < 3; ++c) {
        const T d_ncc = (t.g[i][c] - m.mu_g[c]) / q.den - q.value * (t.r[i][c] - m.mu_r[c]) / q.den_r;
        grad[i][c] -= T(p.lambda_ncc) * q.confidence * d_ncc;
      }
    });
  });
  for (int64_t i = 0; i < ts * ts; ++i)
    for (int c = 0; c < 3; ++c) grad[i][c] *= scale * t.w[i];
}

bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

Params checked(const at::Tensor& render, const at::Tensor& gt, const std::optional<at::Tensor>& mask,
               const at::Tensor& tile_ids, int64_t tile_size, int64_t ssim_patch, int64_t ncc_patch, double lambda_ssim,
               double lambda_ncc, double ncc_eps, double ncc_std_ref, double ssim_c1, double ssim_c2) {
  TORCH_CHECK(render.device().is_cpu() && render.is_contiguous() && gt.is_contiguous() &&
                  gt.scalar_type() == render.scalar_type() && render.dim() == 3 && render.size(2) == 3 &&
                  gt.sizes() == render.sizes(),
              "tile_loss_cpu: render and gt must be contiguous [H, W, 3] CPU tensors of one dtype");
  TORCH_CHECK(!mask.has_value() || (mask->is_contiguous() && mask->scalar_type() == render.scalar_type() &&
                                    mask->numel() == render.size(0) * render.size(1)),
              "tile_loss_cpu: mask must be a contiguous [H, W] of the render's dtype");
  TORCH_CHECK(tile_ids.scalar_type() == at::kLong && tile_ids.is_contiguous(), "tile_loss_cpu: tile_ids int64");
  TORCH_CHECK(power_of_two(tile_size) && tile_size <= kMaxTileSize && power_of_two(ssim_patch) &&
                  ssim_patch <= tile_size && power_of_two(ncc_patch) && ncc_patch <= tile_size,
              "tile_loss_cpu: tile_size a power of two up to 32, patches powers of two up to it");
  return {tile_size, ssim_patch, ncc_patch, lambda_ssim, lambda_ncc, ncc_eps, ncc_std_ref, ssim_c1, ssim_c2};
}

}  // namespace

// Returns (tile_loss [K], tile_weight [K]).
std::vector<at::Tensor> tile_loss_forward(const at::Tensor& render, const at::Tensor& gt,
                                          const std::optional<at::Tensor>& mask, const at::Tensor& tile_ids,
                                          int64_t tile_size, int64_t ssim_patch, int64_t ncc_patch, double lambda_ssim,
                                          double lambda_ncc, double ncc_eps, double ncc_std_ref, double ssim_c1,
                                          double ssim_c2) {
  const Params p = checked(render, gt, mask, tile_ids, tile_size, ssim_patch, ncc_patch, lambda_ssim, lambda_ncc,
                           ncc_eps, ncc_std_ref, ssim_c1, ssim_c2);
  const int64_t k = tile_ids.numel(), height = render.size(0), width = render.size(1);
  auto tile_loss = at::empty({k}, render.options());
  auto tile_weight = at::empty({k}, render.options());
  AT_DISPATCH_FLOATING_TYPES(render.scalar_type(), "tile_loss_forward", [&] {
    using T = scalar_t;
    const T *r = render.data_ptr<T>(), *g = gt.data_ptr<T>(), *m = mask.has_value() ? mask->data_ptr<T>() : nullptr;
    const int64_t* ids = tile_ids.data_ptr<int64_t>();
    T *loss = tile_loss.data_ptr<T>(), *weight = tile_weight.data_ptr<T>();
    at::parallel_for(0, k, 4, [&](int64_t begin, int64_t end) {
      auto tile = std::make_unique<TilePixels<T>>();
      for (int64_t i = begin; i < end; ++i) {
        tile->load(r, g, m, ids[i], width, height, p.tile_size);
        loss[i] = safe_div(tile_total(*tile, p), tile->n_tile);
        weight[i] = tile->n_tile;
      }
    });
  });
  return {tile_loss, tile_weight};
}

// Returns grad_render [H, W, 3]: sum_i tile_scale[i] * dL_i / d render.
at::Tensor tile_loss_backward(const at::Tensor& render, const at::Tensor& gt, const std::optional<at::Tensor>& mask,
                              const at::Tensor& tile_ids, const at::Tensor& tile_scale, int64_t tile_size,
                              int64_t ssim_patch, int64_t ncc_patch, double lambda_ssim, double lambda_ncc,
                              double ncc_eps, double ncc_std_ref, double ssim_c1, double ssim_c2) {
  const Params p = checked(render, gt, mask, tile_ids, tile_size, ssim_patch, ncc_patch, lambda_ssim, lambda_ncc,
                           ncc_eps, ncc_std_ref, ssim_c1, ssim_c2);
  const int64_t k = tile_ids.numel(), height = render.size(0), width = render.size(1), ts = p.tile_size;
  TORCH_CHECK(tile_scale.is_contiguous() && tile_scale.scalar_type() == render.scalar_type() && tile_scale.numel() == k,
              "tile_loss_cpu: one tile_scale per tile, of the render's dtype");
  auto grad_render = at::zeros_like(render);
  // Each tile's gradient [K, ts * ts, 3] and its pixels, then added into the image in tile order.
  auto grads = at::empty({k, ts * ts, 3}, render.options());
  auto pixels = at::empty({k, ts * ts}, tile_ids.options());
  AT_DISPATCH_FLOATING_TYPES(render.scalar_type(), "tile_loss_backward", [&] {
    using T = scalar_t;
    const T *r = render.data_ptr<T>(), *g = gt.data_ptr<T>(), *m = mask.has_value() ? mask->data_ptr<T>() : nullptr;
    const T* scale = tile_scale.data_ptr<T>();
    const int64_t* ids = tile_ids.data_ptr<int64_t>();
    T* tile_grads = grads.data_ptr<T>();
    int64_t* tile_pixels = pixels.data_ptr<int64_t>();
    at::parallel_for(0, k, 4, [&](int64_t begin, int64_t end) {
      auto tile = std::make_unique<TilePixels<T>>();
      for (int64_t i = begin; i < end; ++i) {
        tile->load(r, g, m, ids[i], width, height, ts);
        T(*grad)[3] = reinterpret_cast<T(*)[3]>(tile_grads + i * ts * ts * 3);
        if (tile->n_tile > 0) {
          tile_gradient(*tile, p, scale[i] / tile->n_tile, grad);
        } else {
          std::fill(tile_grads + i * ts * ts * 3, tile_grads + (i + 1) * ts * ts * 3, T(0));
        }
        std::copy(tile->pixel, tile->pixel + ts * ts, tile_pixels + i * ts * ts);
      }
    });
    T* out = grad_render.data_ptr<T>();
    for (int64_t i = 0; i < k * ts * ts; ++i) {
      if (tile_pixels[i] < 0) continue;
      for (int c = 0; c < 3; ++c) out[tile_pixels[i] * 3 + c] += tile_grads[i * 3 + c];
    }
  });
  return grad_render;
}
