// Tile rasterization on the CPU: front-to-back alpha compositing, forward and backward,
// with exactly the rules of the torch twin (turbogs/kernels/raster_torch.py `rasterize`):
//
// - pixel centers at (x + 0.5, y + 0.5); -sigma = -a dx^2 / 2 - c dy^2 / 2 - b dx dy;
// - alpha = min(opacity * exp(-sigma), MAX_ALPHA), skipped (0) below ALPHA_THRESHOLD, and
//   skipped where -sigma > 0 for a conic that is not positive definite;
// - a pixel stops at the Gaussian after which its transmittance would fall to
//   MIN_TRANSMITTANCE or below (that Gaussian and every later one are left out);
// - colors have any number C of channels (RGB plus the blame probe's extra ones); the
//   output alpha is 1 - final transmittance, and the background (optional) is added
//   with that transmittance;
// - only the tiles listed in `tiles` are composited; every other pixel is 0 and gets no
//   gradient; clamped alphas pass no gradient.
//
// Why it is shaped this way:
// - One task per tile (at::parallel_for over the listed tiles): a pixel is computed by one
//   thread whatever the thread count, so the images do not depend on it.
// - Per-Gaussian gradients are not summed across tiles by atomics or per-thread buffers (both
//   make the rounding depend on the schedule). Each tile writes its Gaussians' sums into the
//   rows of their intersections ([M, 6 + C], row = position in flatten_ids; every
//   intersection belongs to one tile), and one serial pass adds the rows per Gaussian in
//   intersection order. 1 and 2 threads give the same bits.
// - Each tile first copies its Gaussians into contiguous arrays (the pixel loop reads them
//   256 times), and skips the exp of Gaussians whose -sigma is clearly below the level at
//   which opacity * exp(-sigma) reaches ALPHA_THRESHOLD: the test is decided exactly, by
//   the same comparison as the twin, whenever it is close.
// - The backward recomputes each pixel's forward pass (nothing per pixel is stored but the
//   image), keeps the alphas and transmittances of the Gaussians the pixel used, and walks
//   them back to front with the sum of what lies behind, as the twin's formula has it.
//
// ATen only: this file is compiled by torch.utils.cpp_extension with a C++ compiler alone
// (no CUDA headers), with OpenMP so that at::parallel_for runs on torch's thread pool.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr double kAlphaThreshold = 1.0 / 255.0;
constexpr double kMaxAlpha = 0.999;
constexpr double kMinTransmittance = 1e-4;
// Added to the skip level of -sigma: far above exp's rounding, so that a skipped Gaussian is
// one that the exact test would have skipped too.
constexpr double kSkipMargin = 1e-3;
constexpr int kParams = 6;  // mean x, mean y, conic a, b, c, -sigma (for the opacity)

// The twin's thresholds as its tensors compare them: F.threshold against the largest float32
// below 1/255 ("raw > it" is "raw >= 1/255" in float32), the others as scalars of the dtype.
template <typename scalar_t>
struct Rules {
  scalar_t below_alpha_threshold = static_cast<scalar_t>(std::nextafter(static_cast<float>(kAlphaThreshold), 0.0f));
  scalar_t max_alpha = static_cast<scalar_t>(kMaxAlpha);
  scalar_t min_transmittance = static_cast<scalar_t>(kMinTransmittance);
};

// One tile's Gaussians, copied in depth order.
template <typename scalar_t>
struct TileGaussians {
  std::vector<scalar_t> mx, my, a, b, c, opacity, skip_below, colors;
  std::vector<char> positive_definite;
  int64_t count = 0;

  void load(int64_t start, int64_t end, const int32_t* ids, const scalar_t* means2d, const scalar_t* conics,
            const scalar_t* opacities, const scalar_t* all_colors, int64_t channels) {
    count = end - start;
    for (auto* v : {&mx, &my, &a, &b, &c, &opacity, &skip_below}) v->resize(count);
    positive_definite.resize(count);
    colors.resize(count * channels);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t g = ids[start + k];
      mx[k] = means2d[2 * g];
      my[k] = means2d[2 * g + 1];
      a[k] = conics[3 * g];
      b[k] = conics[3 * g + 1];
      c[k] = conics[3 * g + 2];
      opacity[k] = opacities[g];
      positive_definite[k] = a[k] > 0 && a[k] * c[k] - b[k] * b[k] > 0;
      // -sigma below log(threshold / opacity) - margin: opacity * exp(-sigma) is surely below
      // the threshold. No positive opacity (or NaN): never skipped here, the exact test decides.
      const double o = static_cast<double>(opacity[k]);
      skip_below[k] = o > 0 ? static_cast<scalar_t>(std::log(kAlphaThreshold / o) - kSkipMargin)
                            : -std::numeric_limits<scalar_t>::infinity();
      for (int64_t ch = 0; ch < channels; ++ch) colors[k * channels + ch] = all_colors[g * channels + ch];
    }
  }

  // -sigma at pixel center (px, py), computed as the twin does: x_term + y_term + cross * dy.
  inline scalar_t neg_sigma(int64_t k, scalar_t px, scalar_t py, scalar_t& dx, scalar_t& dy) const {
    dx = mx[k] - px;
    dy = my[k] - py;
    const scalar_t half = static_cast<scalar_t>(-0.5);
    return (half * a[k] * dx * dx + half * c[k] * dy * dy) + (-b[k] * dx) * dy;
  }

  // alpha of Gaussian k at -sigma `ns`, 0 where the twin skips it.
  inline scalar_t alpha(int64_t k, scalar_t ns, const Rules<scalar_t>& rules) const {
    if (ns > 0 && !positive_definite[k]) return 0;
    if (ns < skip_below[k]) return 0;
    const scalar_t raw = opacity[k] * std::exp(ns);
    if (!(raw > rules.below_alpha_threshold)) return 0;  // NaN too, as F.threshold does
    return std::min(raw, rules.max_alpha);
  }
};

struct Grid {
  int64_t width, height, tile_size, tile_width, num_pairs;
};

// [start, end) of tile `t`'s run in flatten_ids.
inline void tile_range(const int32_t* offsets, int64_t t, int64_t num_tiles, int64_t num_pairs, int64_t& start,
                       int64_t& end) {
  start = offsets[t];
  end = t + 1 < num_tiles ? offsets[t + 1] : num_pairs;
  end = std::max(start, std::min<int64_t>(end, num_pairs));
}

template <typename scalar_t>
void forward_impl(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                  const at::Tensor& opacities, const at::Tensor& background, const at::Tensor& tiles,
                  const at::Tensor& isect_offsets, const at::Tensor& flatten_ids, const Grid& grid, at::Tensor& image,
                  at::Tensor& alpha_out) {
  const int64_t channels = colors.size(1);
  const int64_t num_tiles = isect_offsets.numel();
  const scalar_t* m = means2d.data_ptr<scalar_t>();
  const scalar_t* q = conics.data_ptr<scalar_t>();
  const scalar_t* col = colors.data_ptr<scalar_t>();
  const scalar_t* op = opacities.data_ptr<scalar_t>();
  const scalar_t* bg = background.numel() ? background.data_ptr<scalar_t>() : nullptr;
  const int64_t* tile_ids = tiles.data_ptr<int64_t>();
  const int32_t* offsets = isect_offsets.data_ptr<int32_t>();
  const int32_t* ids = flatten_ids.data_ptr<int32_t>();
  scalar_t* out = image.data_ptr<scalar_t>();
  scalar_t* out_alpha = alpha_out.data_ptr<scalar_t>();
  const Rules<scalar_t> rules;

  at::parallel_for(0, tiles.numel(), 1, [&](int64_t begin, int64_t end) {
    TileGaussians<scalar_t> gs;
    std::vector<scalar_t> rgb(channels);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = tile_ids[i];
      int64_t start, stop;
      tile_range(offsets, t, num_tiles, grid.num_pairs, start, stop);
      gs.load(start, stop, ids, m, q, op, col, channels);
      const int64_t x0 = (t % grid.tile_width) * grid.tile_size, y0 = (t / grid.tile_width) * grid.tile_size;
      for (int64_t y = y0; y < std::min(y0 + grid.tile_size, grid.height); ++y) {
        for (int64_t x = x0; x < std::min(x0 + grid.tile_size, grid.width); ++x) {
          const scalar_t px = static_cast<scalar_t>(x) + static_cast<scalar_t>(0.5);
          const scalar_t py = static_cast<scalar_t>(y) + static_cast<scalar_t>(0.5);
          std::fill(rgb.begin(), rgb.end(), scalar_t(0));
          scalar_t transmittance = 1, acc = 0, dx, dy;
          for (int64_t k = 0; k < gs.count; ++k) {
            const scalar_t a = gs.alpha(k, gs.neg_sigma(k, px, py, dx, dy), rules);
            if (a == 0) continue;
            const scalar_t after = transmittance * (1 - a);
            if (!(after > rules.min_transmittance)) break;
            const scalar_t w = a * transmittance;
            const scalar_t* ck = &gs.colors[k * channels];
            for (int64_t ch = 0; ch < channels; ++ch) rgb[ch] += w * ck[ch];
            acc += w;
            transmittance = after;
          }
          const scalar_t t_final = 1 - acc;
          scalar_t* o = out + (y * grid.width + x) * channels;
          for (int64_t ch = 0; ch < channels; ++ch) o[ch] = bg ? rgb[ch] + t_final * bg[ch] : rgb[ch];
          out_alpha[y * grid.width + x] = acc;
        }
      }
    }
  });
}

template <typename scalar_t>
void backward_impl(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                   const at::Tensor& opacities, const at::Tensor& background, const at::Tensor& tiles,
                   const at::Tensor& isect_offsets, const at::Tensor& flatten_ids, const Grid& grid,
                   const at::Tensor& grad_image, const at::Tensor& grad_alpha, at::Tensor& pair_grads,
                   at::Tensor& tile_grad_background) {
  const int64_t channels = colors.size(1);
  const int64_t row = kParams + channels;
  const int64_t num_tiles = isect_offsets.numel();
  const scalar_t* m = means2d.data_ptr<scalar_t>();
  const scalar_t* q = conics.data_ptr<scalar_t>();
  const scalar_t* col = colors.data_ptr<scalar_t>();
  const scalar_t* op = opacities.data_ptr<scalar_t>();
  const scalar_t* bg = background.numel() ? background.data_ptr<scalar_t>() : nullptr;
  const int64_t* tile_ids = tiles.data_ptr<int64_t>();
  const int32_t* offsets = isect_offsets.data_ptr<int32_t>();
  const int32_t* ids = flatten_ids.data_ptr<int32_t>();
  const scalar_t* g_img = grad_image.data_ptr<scalar_t>();
  const scalar_t* g_alpha = grad_alpha.data_ptr<scalar_t>();
  scalar_t* pairs = pair_grads.data_ptr<scalar_t>();
  scalar_t* tile_bg = tile_grad_background.data_ptr<scalar_t>();
  const Rules<scalar_t> rules;

  at::parallel_for(0, tiles.numel(), 1, [&](int64_t begin, int64_t end) {
    TileGaussians<scalar_t> gs;
    std::vector<int64_t> used;  // the Gaussians a pixel composited, front to back
    std::vector<scalar_t> used_alpha, used_before, used_after;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = tile_ids[i];
      int64_t start, stop;
      tile_range(offsets, t, num_tiles, grid.num_pairs, start, stop);
      gs.load(start, stop, ids, m, q, op, col, channels);
      scalar_t* rows = pairs + start * row;  // this tile's intersections' rows: its own
      std::fill(rows, rows + gs.count * row, scalar_t(0));
      scalar_t* bg_sum = tile_bg + i * channels;
      std::fill(bg_sum, bg_sum + channels, scalar_t(0));
      const int64_t x0 = (t % grid.tile_width) * grid.tile_size, y0 = (t / grid.tile_width) * grid.tile_size;
      for (int64_t y = y0; y < std::min(y0 + grid.tile_size, grid.height); ++y) {
        for (int64_t x = x0; x < std::min(x0 + grid.tile_size, grid.width); ++x) {
          const int64_t pixel = y * grid.width + x;
          const scalar_t* g_rgb = g_img + pixel * channels;
          const scalar_t g_acc = g_alpha[pixel];
          bool any = g_acc != 0;
          for (int64_t ch = 0; ch < channels && !any; ++ch) any = g_rgb[ch] != 0;
          if (!any) continue;  // every term below is a product with the output gradient: all 0
          const scalar_t px = static_cast<scalar_t>(x) + static_cast<scalar_t>(0.5);
          const scalar_t py = static_cast<scalar_t>(y) + static_cast<scalar_t>(0.5);

          used.clear(), used_alpha.clear(), used_before.clear(), used_after.clear();
          scalar_t transmittance = 1, acc = 0, dx, dy;
          for (int64_t k = 0; k < gs.count; ++k) {
            const scalar_t a = gs.alpha(k, gs.neg_sigma(k, px, py, dx, dy), rules);
            if (a == 0) continue;
            const scalar_t after = transmittance * (1 - a);
            if (!(after > rules.min_transmittance)) break;
            used.push_back(k), used_alpha.push_back(a), used_before.push_back(transmittance),
                used_after.push_back(after);
            acc += a * transmittance;
            transmittance = after;
          }
          const scalar_t t_final = 1 - acc;
          scalar_t bg_dot = 0;
          if (bg) {
            for (int64_t ch = 0; ch < channels; ++ch) {
              bg_dot += g_rgb[ch] * bg[ch];
              bg_sum[ch] += t_final * g_rgb[ch];
            }
          }

          scalar_t behind = 0;  // sum over the later Gaussians j of w_j v_j
          for (int64_t u = static_cast<int64_t>(used.size()) - 1; u >= 0; --u) {
            const int64_t k = used[u];
            const scalar_t a = used_alpha[u], t_after = used_after[u], w = a * used_before[u];
            const scalar_t* ck = &gs.colors[k * channels];
            scalar_t v = g_acc;  // the output gradient seen through this Gaussian's color (alpha: 1)
            for (int64_t ch = 0; ch < channels; ++ch) v += g_rgb[ch] * ck[ch];
            scalar_t* r = rows + k * row;
            for (int64_t ch = 0; ch < channels; ++ch) r[kParams + ch] += w * g_rgb[ch];
            if (a < rules.max_alpha) {  // clamped alphas pass no gradient
              const scalar_t grad_alpha_k = (t_after * v - behind - std::min(t_after, t_final) * bg_dot) / (1 - a);
              const scalar_t g = grad_alpha_k * a;  // d alpha / d(-sigma) = alpha
              gs.neg_sigma(k, px, py, dx, dy);
              r[0] += g * (-gs.a[k] * dx - gs.b[k] * dy);
              r[1] += g * (-gs.c[k] * dy - gs.b[k] * dx);
              r[2] += g * (static_cast<scalar_t>(-0.5) * dx * dx);
              r[3] += g * (-dx * dy);
              r[4] += g * (static_cast<scalar_t>(-0.5) * dy * dy);
              r[5] += g;
            }
            behind += w * v;
          }
        }
      }
    }
  });
}

void check_inputs(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                  const at::Tensor& opacities, const at::Tensor& background, const at::Tensor& tiles,
                  const at::Tensor& isect_offsets, const at::Tensor& flatten_ids) {
  for (const auto* t : {&means2d, &conics, &colors, &opacities, &tiles, &isect_offsets, &flatten_ids}) {
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous(), "rasterize_cpu: inputs must be contiguous CPU tensors");
  }
  const auto dtype = means2d.scalar_type();
  TORCH_CHECK(conics.scalar_type() == dtype && colors.scalar_type() == dtype && opacities.scalar_type() == dtype,
              "rasterize_cpu: means2d, conics, colors and opacities must share a dtype");
  TORCH_CHECK(means2d.dim() == 2 && means2d.size(1) == 2 && conics.dim() == 2 && conics.size(1) == 3 &&
                  colors.dim() == 2 && opacities.dim() == 1,
              "rasterize_cpu: shapes must be [N, 2], [N, 3], [N, C], [N]");
  TORCH_CHECK(background.numel() == 0 || (background.scalar_type() == dtype && background.is_contiguous() &&
                                          background.numel() == colors.size(1)),
              "rasterize_cpu: background must be [C] of the colors' dtype");
  TORCH_CHECK(tiles.scalar_type() == at::kLong && isect_offsets.scalar_type() == at::kInt &&
                  flatten_ids.scalar_type() == at::kInt,
              "rasterize_cpu: tiles int64, isect_offsets and flatten_ids int32");
}

}  // namespace

// Returns (image [H, W, C], alpha [H, W, 1]); `background` empty for none; `tiles` the
// row-major ids of the tiles to composite, ascending.
std::vector<at::Tensor> rasterize_forward(const at::Tensor& means2d, const at::Tensor& conics,
                                          const at::Tensor& colors, const at::Tensor& opacities,
                                          const at::Tensor& background, const at::Tensor& tiles,
                                          const at::Tensor& isect_offsets, const at::Tensor& flatten_ids,
                                          int64_t width, int64_t height, int64_t tile_size) {
  check_inputs(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids);
  const Grid grid{width, height, tile_size, isect_offsets.size(1), flatten_ids.numel()};
  auto image = at::zeros({height, width, colors.size(1)}, colors.options());
  auto alpha = at::zeros({height, width, 1}, colors.options());
  AT_DISPATCH_FLOATING_TYPES(colors.scalar_type(), "rasterize_forward", [&] {
    forward_impl<scalar_t>(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids, grid,
                           image, alpha);
  });
  return {image, alpha};
}

// Returns the gradients (means2d [N, 2], conics [N, 3], colors [N, C], opacities [N],
// background [C], empty when there is none).
std::vector<at::Tensor> rasterize_backward(const at::Tensor& means2d, const at::Tensor& conics,
                                           const at::Tensor& colors, const at::Tensor& opacities,
                                           const at::Tensor& background, const at::Tensor& tiles,
                                           const at::Tensor& isect_offsets, const at::Tensor& flatten_ids,
                                           int64_t width, int64_t height, int64_t tile_size,
                                           const at::Tensor& grad_image, const at::Tensor& grad_alpha) {
  check_inputs(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids);
  TORCH_CHECK(grad_image.is_contiguous() && grad_alpha.is_contiguous() &&
                  grad_image.scalar_type() == colors.scalar_type() && grad_alpha.scalar_type() == colors.scalar_type(),
              "rasterize_cpu: output gradients must be contiguous, of the colors' dtype");
  const int64_t n = means2d.size(0), channels = colors.size(1), row = kParams + channels;
  const Grid grid{width, height, tile_size, isect_offsets.size(1), flatten_ids.numel()};
  // Rows of intersections of tiles not listed are never written nor read: no need to zero them.
  auto pair_grads = at::empty({flatten_ids.numel(), row}, colors.options());
  auto tile_grad_background = at::empty({tiles.numel(), channels}, colors.options());
  auto grad_means2d = at::zeros({n, 2}, colors.options());
  auto grad_conics = at::zeros({n, 3}, colors.options());
  auto grad_colors = at::zeros({n, channels}, colors.options());
  auto grad_opacities = at::zeros({n}, colors.options());
  auto grad_background = at::zeros({background.numel() ? channels : 0}, colors.options());
  AT_DISPATCH_FLOATING_TYPES(colors.scalar_type(), "rasterize_backward", [&] {
    backward_impl<scalar_t>(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids, grid,
                            grad_image, grad_alpha, pair_grads, tile_grad_background);
    // The fixed-order reduction: listed tiles in order, each tile's intersections in order.
    const scalar_t* pairs = pair_grads.data_ptr<scalar_t>();
    const int32_t* ids = flatten_ids.data_ptr<int32_t>();
    const int32_t* offsets = isect_offsets.data_ptr<int32_t>();
    const int64_t* tile_ids = tiles.data_ptr<int64_t>();
    scalar_t* gm = grad_means2d.data_ptr<scalar_t>();
    scalar_t* gq = grad_conics.data_ptr<scalar_t>();
    scalar_t* gc = grad_colors.data_ptr<scalar_t>();
    scalar_t* gsig = grad_opacities.data_ptr<scalar_t>();  // sums of d/d(-sigma) first
    for (int64_t i = 0; i < tiles.numel(); ++i) {
      int64_t start, stop;
      tile_range(offsets, tile_ids[i], isect_offsets.numel(), flatten_ids.numel(), start, stop);
      for (int64_t p = start; p < stop; ++p) {
        const int64_t g = ids[p];
        const scalar_t* r = pairs + p * row;
        gm[2 * g] += r[0], gm[2 * g + 1] += r[1];
        gq[3 * g] += r[2], gq[3 * g + 1] += r[3], gq[3 * g + 2] += r[4];
        gsig[g] += r[5];
        for (int64_t ch = 0; ch < channels; ++ch) gc[g * channels + ch] += r[kParams + ch];
      }
    }
    // d alpha / d opacity = alpha / opacity: the sum of d/d(-sigma) over the opacity.
    const scalar_t* o = opacities.data_ptr<scalar_t>();
    for (int64_t g = 0; g < n; ++g) gsig[g] = o[g] > 0 ? gsig[g] / std::max(o[g], scalar_t(1e-30)) : scalar_t(0);
    if (background.numel()) {
      const scalar_t* tb = tile_grad_background.data_ptr<scalar_t>();
      scalar_t* gb = grad_background.data_ptr<scalar_t>();
      for (int64_t i = 0; i < tiles.numel(); ++i)
        for (int64_t ch = 0; ch < channels; ++ch) gb[ch] += tb[i * channels + ch];
    }
  });
  return {grad_means2d, grad_conics, grad_colors, grad_opacities, grad_background};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rasterize_forward", &rasterize_forward, "tile alpha compositing, forward (CPU)");
  m.def("rasterize_backward", &rasterize_backward, "tile alpha compositing, backward (CPU)");
}
