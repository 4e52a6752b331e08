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
// - Each tile is computed whole by one thread (torch's threads take the next tile until none
//   is left), whatever the thread count, so the images do not depend on it.
// - Per-Gaussian gradients are not summed across tiles by atomics or per-thread buffers (both
//   make the rounding depend on the schedule). Each tile writes its Gaussians' sums into the
//   rows of their intersections ([M, 6 + C], row = position in flatten_ids; every
//   intersection belongs to one tile), and one serial pass adds the rows per Gaussian in
//   intersection order. 1 and 2 threads give the same bits.
// - Each tile first copies its Gaussians into contiguous arrays and bounds each by the box of
//   pixels it can reach (`GaussianReach`, once a pass, then `TileGaussians::load`): a
//   Gaussian reaches a pixel only where opacity * exp(-sigma) >= ALPHA_THRESHOLD, an ellipse,
//   while a tile's list holds every Gaussian whose 3-sigma box touches the tile. The box is widened by a margin: the twin's own comparison decides every
//   pixel inside it.
// - A tile is composited Gaussian by Gaussian, each over its box's rows, 8 (float) columns at
//   a time (16 with AVX-512: a whole tile row), with vector extensions and our own vector exp
//   (rasterize_cpu_kernels.h), compiled three times: for the baseline instruction set, for AVX2
//   and for AVX-512, the widest the CPU has chosen at run time. The tile's
//   per-pixel state (a few KB) stays in the L1 cache. Each Gaussian's alphas over its box come
//   first, then the pixels' compositing (or gradients): the exps of a box then overlap.
// - The forward leaves per pixel its final transmittance and the last Gaussian it used; the
//   backward walks the tile's Gaussians back to front from there, recovering each
//   transmittance from the next one (T_i = T_{i+1} / (1 - alpha_i), as gsplat does) with the
//   sum of what lies behind, as the twin's formula has it.
//
// ATen only: this file is compiled by torch.utils.cpp_extension with a C++ compiler alone
// (no CUDA headers), with OpenMP so that at::parallel_for runs on torch's thread pool.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__SSE2__)
#include <immintrin.h>
#endif

namespace {

constexpr double kAlphaThreshold = 1.0 / 255.0;
constexpr double kMaxAlpha = 0.999;
constexpr double kMinTransmittance = 1e-4;
// Added to the skip level of -sigma: far above exp's rounding, so that a skipped Gaussian is
// one that the exact test would have skipped too.
constexpr double kSkipMargin = 1e-3;
constexpr int kParams = 6;  // mean x, mean y, conic a, b, c, -sigma (for the opacity)

}  // namespace

// The kernels, for the baseline instruction set and, where the compiler can target them, AVX2
// and AVX-512 (chosen at run time: `kernel_copy`). The same source and -ffp-contract=off: every
// copy rounds alike (tests/test_raster_cpu.py). The AVX-512 copy's 16 lanes hold a whole tile row.
namespace base {
#include "rasterize_cpu_tile.h"
#include "rasterize_cpu_kernels.h"
}  // namespace base
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TURBOGS_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2")
#define TURBOGS_KERNELS_AVX2 1
namespace avx2 {
#include "rasterize_cpu_tile.h"
#include "rasterize_cpu_kernels.h"
}  // namespace avx2
#undef TURBOGS_KERNELS_AVX2
#pragma GCC pop_options
#define TURBOGS_AVX512 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#define TURBOGS_KERNELS_AVX512 1
namespace avx512 {
#include "rasterize_cpu_tile.h"
#include "rasterize_cpu_kernels.h"
}  // namespace avx512
#undef TURBOGS_KERNELS_AVX512
#pragma GCC pop_options
#endif

namespace {

// Which copy of the kernels runs: the widest this CPU has, or the one $TURBOGS_CPU_KERNELS names
// ("base", "avx2", "avx512"; tests compare their bits), never one the CPU lacks.
enum class Copy { kBase, kAvx2, kAvx512 };
Copy kernel_copy() {
  static const Copy chosen = [] {
    Copy best = Copy::kBase;
#ifdef TURBOGS_AVX2
    if (__builtin_cpu_supports("avx2")) best = Copy::kAvx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      best = Copy::kAvx512;
#endif
    const char* asked = std::getenv("TURBOGS_CPU_KERNELS");
    const std::string name = asked ? asked : "";
    const Copy wanted = name == "base" ? Copy::kBase : name == "avx2" ? Copy::kAvx2 : Copy::kAvx512;
    return std::min(wanted, best);
  }();
  return chosen;
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

// One copy's forward / backward over the dispatched scalar_t (macros: a namespace cannot be a
// template argument).
#define TURBOGS_FORWARD(copy)                                                                                      \
  copy::forward_impl<scalar_t>(                                                                                     \
      copy::Inputs<scalar_t>(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids),  \
      copy::Grid{width, height, tile_size, isect_offsets.size(1), flatten_ids.numel()}, out, out_alpha, out_t, out_last)
#define TURBOGS_BACKWARD(copy)                                                                                     \
  copy::backward_impl<scalar_t>(                                                                                    \
      copy::Inputs<scalar_t>(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids),  \
      copy::Grid{width, height, tile_size, isect_offsets.size(1), flatten_ids.numel()}, a, t, l, gi, ga, pairs_out, \
      bg_out)

// Returns (image [H, W, C], alpha [H, W, 1], and for the backward pass the final
// transmittance [H, W] and each pixel's last used row entry [H, W], -1 for none);
// `background` empty for none; `tiles` the row-major ids of the tiles to composite.
std::vector<at::Tensor> rasterize_forward(const at::Tensor& means2d, const at::Tensor& conics,
                                          const at::Tensor& colors, const at::Tensor& opacities,
                                          const at::Tensor& background, const at::Tensor& tiles,
                                          const at::Tensor& isect_offsets, const at::Tensor& flatten_ids,
                                          int64_t width, int64_t height, int64_t tile_size) {
  check_inputs(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids);
  auto image = at::zeros({height, width, colors.size(1)}, colors.options());
  auto alpha = at::zeros({height, width, 1}, colors.options());
  auto transmittance = at::ones({height, width}, colors.options());
  auto last = at::full({height, width}, -1, colors.options());
  AT_DISPATCH_FLOATING_TYPES(colors.scalar_type(), "rasterize_forward", [&] {
    scalar_t *out = image.data_ptr<scalar_t>(), *out_alpha = alpha.data_ptr<scalar_t>();
    scalar_t *out_t = transmittance.data_ptr<scalar_t>(), *out_last = last.data_ptr<scalar_t>();
#ifdef TURBOGS_AVX2
    if (kernel_copy() == Copy::kAvx512) return TURBOGS_FORWARD(avx512);
    if (kernel_copy() == Copy::kAvx2) return TURBOGS_FORWARD(avx2);
#endif
    TURBOGS_FORWARD(base);
  });
  return {image, alpha, transmittance, last};
}

// Returns the gradients (means2d [N, 2], conics [N, 3], colors [N, C], opacities [N],
// background [C], empty when there is none). `alpha`, `transmittance`, `last`: the forward's.
std::vector<at::Tensor> rasterize_backward(const at::Tensor& means2d, const at::Tensor& conics,
                                           const at::Tensor& colors, const at::Tensor& opacities,
                                           const at::Tensor& background, const at::Tensor& tiles,
                                           const at::Tensor& isect_offsets, const at::Tensor& flatten_ids,
                                           int64_t width, int64_t height, int64_t tile_size,
                                           const at::Tensor& alpha, const at::Tensor& transmittance,
                                           const at::Tensor& last, const at::Tensor& grad_image,
                                           const at::Tensor& grad_alpha) {
  check_inputs(means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids);
  for (const auto* t : {&alpha, &transmittance, &last, &grad_image, &grad_alpha}) {
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == colors.scalar_type() && t->numel() >= height * width,
                "rasterize_cpu: the forward's outputs and their gradients must be contiguous, of the colors' dtype");
  }
  const int64_t n = means2d.size(0), channels = colors.size(1), row = kParams + channels;
  // Rows of intersections of tiles not listed are never written nor read: no need to zero them.
  auto pair_grads = at::empty({flatten_ids.numel(), row}, colors.options());
  auto tile_grad_background = at::empty({tiles.numel(), channels}, colors.options());
  auto grad_means2d = at::zeros({n, 2}, colors.options());
  auto grad_conics = at::zeros({n, 3}, colors.options());
  auto grad_colors = at::zeros({n, channels}, colors.options());
  auto grad_opacities = at::zeros({n}, colors.options());
  auto grad_background = at::zeros({background.numel() ? channels : 0}, colors.options());
  AT_DISPATCH_FLOATING_TYPES(colors.scalar_type(), "rasterize_backward", [&] {
    const scalar_t *a = alpha.data_ptr<scalar_t>(), *t = transmittance.data_ptr<scalar_t>();
    const scalar_t *l = last.data_ptr<scalar_t>(), *gi = grad_image.data_ptr<scalar_t>();
    const scalar_t* ga = grad_alpha.data_ptr<scalar_t>();
    scalar_t *pairs_out = pair_grads.data_ptr<scalar_t>(), *bg_out = tile_grad_background.data_ptr<scalar_t>();
#ifdef TURBOGS_AVX2
    if (kernel_copy() == Copy::kAvx512) TURBOGS_BACKWARD(avx512);
    else if (kernel_copy() == Copy::kAvx2) TURBOGS_BACKWARD(avx2);
    else
#endif
      TURBOGS_BACKWARD(base);
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
      base::tile_range(offsets, tile_ids[i], isect_offsets.numel(), flatten_ids.numel(), start, stop);
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

// intersect_cpu.cpp
std::vector<at::Tensor> intersect_tiles(const at::Tensor& means2d, const at::Tensor& radii, const at::Tensor& depths,
                                        int64_t tile_size, int64_t tile_width, int64_t tile_height,
                                        const at::Tensor& tile_mask);

// sh_cpu.cpp
at::Tensor sh_forward(int64_t degree, const at::Tensor& dirs, const at::Tensor& sh0, const at::Tensor& rest,
                      const at::Tensor& masks);
std::vector<at::Tensor> sh_backward(int64_t degree, const at::Tensor& dirs, const at::Tensor& sh0,
                                    const at::Tensor& rest, const at::Tensor& masks, const at::Tensor& grad_out);

// projection_cpu.cpp
std::vector<at::Tensor> project_forward(const at::Tensor& means, const at::Tensor& quats, const at::Tensor& scales,
                                        const at::Tensor& viewmat, const at::Tensor& K, int64_t width, int64_t height,
                                        double near_plane, double far_plane, double eps2d, bool antialiased,
                                        const at::Tensor& tile_mask, int64_t tile_size);
std::vector<at::Tensor> project_backward(const at::Tensor& means, const at::Tensor& quats, const at::Tensor& scales,
                                         const at::Tensor& viewmat, const at::Tensor& K, int64_t width, int64_t height,
                                         double eps2d, const at::Tensor& radii, const at::Tensor& grad_means2d,
                                         const at::Tensor& grad_depths, const at::Tensor& grad_conics,
                                         const at::Tensor& grad_compensations);

// tile_loss_cpu.cpp
std::vector<at::Tensor> tile_loss_forward(const at::Tensor& render, const at::Tensor& gt,
                                          const std::optional<at::Tensor>& mask, const at::Tensor& tile_ids,
                                          int64_t tile_size, int64_t ssim_patch, int64_t ncc_patch, double lambda_ssim,
                                          double lambda_ncc, double ncc_eps, double ncc_std_ref, double ssim_c1,
                                          double ssim_c2);
at::Tensor tile_loss_backward(const at::Tensor& render, const at::Tensor& gt, const std::optional<at::Tensor>& mask,
                              const at::Tensor& tile_ids, const at::Tensor& tile_scale, int64_t tile_size,
                              int64_t ssim_patch, int64_t ncc_patch, double lambda_ssim, double lambda_ncc,
                              double ncc_eps, double ncc_std_ref, double ssim_c1, double ssim_c2);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tile_loss_forward", &tile_loss_forward, "per-tile loss and counted-pixel weight (CPU)");
  m.def("tile_loss_backward", &tile_loss_backward, "gradient of the weighted tile losses wrt the render (CPU)");
  m.def("project_forward", &project_forward, "EWA projection of Gaussians into one camera, forward (CPU)");
  m.def("project_backward", &project_backward, "EWA projection of Gaussians into one camera, backward (CPU)");
  m.def("sh_forward", &sh_forward, "spherical harmonics of degree 0-3, forward (CPU)");
  m.def("sh_backward", &sh_backward, "spherical harmonics of degree 0-3, backward (CPU)");
  m.def("intersect_tiles", &intersect_tiles, "tile / Gaussian pairs by (tile, depth) (CPU)");
  m.def("rasterize_forward", &rasterize_forward, "tile alpha compositing, forward (CPU)");
  m.def("rasterize_backward", &rasterize_backward, "tile alpha compositing, backward (CPU)");
}
