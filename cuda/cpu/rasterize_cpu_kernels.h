// The kernels of rasterize_cpu.cpp, included there three times: once for the baseline
// instruction set, and (on x86-64 with GCC) inside `#pragma GCC target("avx2")` and AVX-512's,
// so that one build runs its vectors as wide as the CPU has them, each time after
// rasterize_cpu_tile.h (what both passes share). No include guard, no includes: rasterize_cpu.cpp
// includes what this needs before each copy, and wraps each copy in a namespace of its own.

// One tile, composited Gaussian by Gaussian (front to back), each over the rows and columns
// of its box, kLanes columns at a time. Per pixel the arithmetic and its order are exactly the
// pixel's own front-to-back loop. Why Gaussian by Gaussian rather than pixel row by row: a
// Gaussian's constants are loaded once for all its rows, and no per-row list of Gaussians has
// to be built (that list cost a quarter of the kernels' time). Besides color and alpha it
// leaves per pixel the final transmittance and the tile index of the last Gaussian the pixel
// used (-1: none), from which the backward pass walks back to front without compositing again.
template <typename scalar_t>
struct TileForward {
  typedef Simd<scalar_t> S;
  typedef typename S::V V;
  typedef typename S::M M;
  int64_t stride = 0, channels = 0;  // stride: the tile's width rounded up to whole vectors
  // [rows][stride] each; rgb [channels][rows][stride]. row_live: a pixel of the row still open.
  std::vector<scalar_t> transmittance, acc, done, last, rgb;
  std::vector<char> row_live;
  std::vector<scalar_t> centers;    // the x of the tile's pixel centers, [stride]
  std::vector<scalar_t> box_alpha;  // one Gaussian's alpha over its box, [vectors][kLanes]
  std::vector<int32_t> box_pixel;   // and the first pixel of each of those vectors

  void resize(int64_t tile_size, int64_t num_channels) {
    channels = num_channels;
    stride = (tile_size + S::kLanes - 1) / S::kLanes * S::kLanes;
    for (auto* v : {&transmittance, &acc, &done, &last}) v->resize(tile_size * stride);
    rgb.resize(num_channels * tile_size * stride);
    row_live.resize(tile_size);
    centers.resize(stride);
    box_alpha.resize(tile_size * stride);
    box_pixel.resize(tile_size * stride / S::kLanes);
  }

  // Whether any pixel of the tile is still open; updates row_live.
  bool update_live(int64_t rows, int64_t cols) {
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      bool live = false;
      for (int64_t c = 0; c < cols; ++c) live |= done[r * stride + c] == 0;
      row_live[r] = live;
      any |= live;
    }
    return any;
  }

  // C: the channel count, or 0 to read it from `channels`.
  template <int C>
  void composite(const TileGaussians<scalar_t>& gs, int64_t x0, int64_t y0, int64_t rows, int64_t cols,
                 const Rules<scalar_t>& rules) {
    const int64_t num_channels = C ? C : channels;
    std::fill(transmittance.begin(), transmittance.end(), scalar_t(1));
    std::fill(acc.begin(), acc.end(), scalar_t(0));
    // Columns past the tile's last one start done: no Gaussian is ever kept there, so the
    // vectors need no column mask (within the tile, a Gaussian's box is conservative and the
    // exact test decides every column).
    for (int64_t p = 0; p < rows * stride; ++p) done[p] = p % stride < cols ? scalar_t(0) : scalar_t(1);
    std::fill(last.begin(), last.end(), scalar_t(-1));
    std::fill(rgb.begin(), rgb.end(), scalar_t(0));
    std::fill(row_live.begin(), row_live.end(), 1);
    const int64_t plane = rows * stride;
    const V zero = S::splat(0), one = S::splat(1);
    const V min_transmittance = S::splat(rules.min_transmittance);
    // Local pointers, read once: a float store may alias any float, such as a member of `gs`.
    scalar_t *const acc_p = acc.data(), *const t_p = transmittance.data(), *const done_p = done.data();
    scalar_t *const last_p = last.data(), *const rgb_p = rgb.data();
    const char* const live_p = row_live.data();
    scalar_t* const box_alpha_p = box_alpha.data();
    int32_t* const box_pixel_p = box_pixel.data();
    column_centers(x0, centers);
    const scalar_t* const centers_p = centers.data();
    for (int64_t k = 0; k < gs.count; ++k) {
      if ((k & 15) == 15 && !update_live(rows, cols)) break;
      const int64_t lo = gs.col_lo[k], hi = gs.col_hi[k];
      const V entry = S::splat(static_cast<scalar_t>(k));
      const scalar_t* color = &gs.colors[k * num_channels];
      // First the Gaussian's alpha over its box, vector by vector: the exps of different vectors
      // are independent and overlap in the pipeline, where the compositing after each one would
      // make the next wait. A vector that no pixel can take is left out.
      int64_t n = 0;
      GaussianOnRow<scalar_t> gauss(gs, k);
      for (int64_t r = gs.row_lo[k]; r <= gs.row_hi[k]; ++r) {
        if (!live_p[r]) continue;
        gauss.on_row(static_cast<scalar_t>(y0 + r) + static_cast<scalar_t>(0.5));
        for (int64_t c0 = lo - lo % S::kLanes; c0 <= hi; c0 += S::kLanes) {
          V dx;
          M on;
          const V ns = gauss.exponent(S::load(&centers_p[c0]), dx);
          if (!gauss.may_pass(ns)) continue;
          const V raw_alpha = gauss.alpha(ns, rules, on);
          S::store(&box_alpha_p[n * S::kLanes], on ? raw_alpha : zero);  // > 0 exactly where on
          box_pixel_p[n++] = static_cast<int32_t>(r * stride + c0);
        }
      }
      // Then the pixels, front to back.
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = box_pixel_p[j];
        const V was_done = S::load(&done_p[p]);
        const V box_alpha = S::load(&box_alpha_p[j * S::kLanes]);
        const M on = (box_alpha > zero) & (was_done == zero);
        const V alpha = on ? box_alpha : zero;
        const V t = S::load(&t_p[p]);
        const V after = t * (one - alpha);
        const M stop = on & ~(after > min_transmittance);  // this one and all later: left out
        const M kept = on & ~stop;
        const V w = kept ? alpha * t : zero;  // adding a zero weight changes no sum
        S::store(&acc_p[p], S::load(&acc_p[p]) + w);
        S::store(&t_p[p], kept ? after : t);
        S::store(&done_p[p], stop ? one : was_done);
        S::store(&last_p[p], kept ? entry : S::load(&last_p[p]));
        for (int64_t ch = 0; ch < num_channels; ++ch) {
          scalar_t* out = &rgb_p[ch * plane + p];
          S::store(out, S::load(out) + w * color[ch]);
        }
      }
    }
  }
};

template <typename scalar_t>
void forward_impl(const Inputs<scalar_t>& in, const Grid& grid, scalar_t* out, scalar_t* out_alpha,
                  scalar_t* out_transmittance, scalar_t* out_last) {
  const Rules<scalar_t> rules;
  const int64_t channels = in.channels;
  const GaussianReach<scalar_t> reach(in.means2d, in.conics, in.opacities, in.num_gaussians);
  std::atomic<int64_t> next_tile(0);
  for_each_tile(in.num_listed, next_tile, [&](int64_t, int64_t) {
    TileGaussians<scalar_t> gs;
    TileForward<scalar_t> tile;
    tile.resize(grid.tile_size, channels);
    for (int64_t i; (i = next_tile++) < in.num_listed;) {
      int64_t start, x0, y0, rows, cols;
      load_tile(in, grid, reach, i, gs, start, x0, y0, rows, cols);
      with_channels(channels, [&](auto fixed) {
        tile.template composite<decltype(fixed)::value>(gs, x0, y0, rows, cols, rules);
      });
      const int64_t plane = rows * tile.stride;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t col = 0; col < cols; ++col) {
          const int64_t pixel = (y0 + r) * grid.width + x0 + col, p = r * tile.stride + col;
          const scalar_t t_final = 1 - tile.acc[p];
          for (int64_t ch = 0; ch < channels; ++ch) {
            const scalar_t rgb = tile.rgb[ch * plane + p];
            out[pixel * channels + ch] = in.background ? rgb + t_final * in.background[ch] : rgb;
          }
          out_alpha[pixel] = tile.acc[p];
          out_transmittance[pixel] = tile.transmittance[p];
          out_last[pixel] = tile.last[p];
        }
      }
    }
  });
}

// Per-pixel state of the backward pass of one tile ([rows][stride] each, g_rgb
// [channels][rows][stride]; columns past the tile's last one hold zeros and use no Gaussian).
template <typename scalar_t>
struct TileGrads {
  std::vector<scalar_t> g_rgb, g_acc, t_final, bg_dot, behind, transmittance, last;
  std::vector<scalar_t> row_last;  // per row, the latest Gaussian any of its pixels used
  std::vector<scalar_t> centers;   // the x of the tile's pixel centers, [stride]
  // One Gaussian's alpha over the vectors of its box that used it, [vectors][kLanes], with the
  // first pixel of each and its row's dy.
  std::vector<scalar_t> box_alpha, box_dy;
  std::vector<int32_t> box_pixel;
  std::vector<scalar_t> sums;      // one Gaussian's [6 + channels][stride] sums over its rows

  void resize(int64_t tile_size, int64_t stride, int64_t channels) {
    g_rgb.resize(channels * tile_size * stride);
    for (auto* x : {&g_acc, &t_final, &bg_dot, &behind, &transmittance, &last}) x->resize(tile_size * stride);
    row_last.resize(tile_size);
    centers.resize(stride);
    box_alpha.resize(tile_size * stride);
    box_dy.resize(tile_size * stride / Simd<scalar_t>::kLanes);
    box_pixel.resize(tile_size * stride / Simd<scalar_t>::kLanes);
    sums.resize((kParams + channels) * stride);
  }
};

// The backward pass walks each tile's Gaussians back to front from the last one any pixel
// used (the forward pass's `last`), recovering the transmittance before each from the one
// after it, T_i = T_{i+1} / (1 - alpha_i), as gsplat's backward does, from the final one. With
// T_i and w_i = alpha_i T_i, for every Gaussian i that a pixel used,
//   d out / d alpha_i = (T_{i+1} c_i - sum_{j > i} w_j c_j - T_final bg) / (1 - alpha_i)
// (the twin's formula, with T_final = 1 - the output alpha, as the twin has it). A Gaussian's
// terms are summed per column over its rows in row order, then over the columns in column
// order (no reassociation anywhere: the same bits always), into its intersection's row.
template <typename scalar_t>
void backward_impl(const Inputs<scalar_t>& in, const Grid& grid, const scalar_t* out_alpha,
                   const scalar_t* out_transmittance, const scalar_t* out_last, const scalar_t* g_img,
                   const scalar_t* g_alpha, scalar_t* pairs, scalar_t* tile_bg) {
  typedef Simd<scalar_t> S;
  typedef typename S::V V;
  typedef typename S::M M;
  const Rules<scalar_t> rules;
  const int64_t channels = in.channels, row_size = kParams + channels;
  const GaussianReach<scalar_t> reach(in.means2d, in.conics, in.opacities, in.num_gaussians);
  std::atomic<int64_t> next_tile(0);
  for_each_tile(in.num_listed, next_tile, [&](int64_t, int64_t) {
    TileGaussians<scalar_t> gs;
    TileGrads<scalar_t> tg;
    const int64_t stride = (grid.tile_size + S::kLanes - 1) / S::kLanes * S::kLanes;
    tg.resize(grid.tile_size, stride, channels);
    const V zero = S::splat(0), one = S::splat(1), max_alpha = S::splat(rules.max_alpha);
    const V minus_half = S::splat(static_cast<scalar_t>(-0.5));
    for (int64_t i; (i = next_tile++) < in.num_listed;) {
      int64_t start, x0, y0, rows, cols;
      load_tile(in, grid, reach, i, gs, start, x0, y0, rows, cols);
      column_centers(x0, tg.centers);
      const int64_t plane = rows * stride;
      for (auto* x : {&tg.g_rgb, &tg.g_acc, &tg.t_final, &tg.bg_dot, &tg.behind, &tg.transmittance}) {
        std::fill(x->begin(), x->end(), scalar_t(0));
      }
      std::fill(tg.last.begin(), tg.last.end(), scalar_t(-1));
      scalar_t* bg_sum = tile_bg + i * channels;
      std::fill(bg_sum, bg_sum + channels, scalar_t(0));
      scalar_t tile_last = -1;
      for (int64_t r = 0; r < rows; ++r) {
        tg.row_last[r] = -1;
        for (int64_t col = 0; col < cols; ++col) {
          const int64_t pixel = (y0 + r) * grid.width + x0 + col, p = r * stride + col;
          tg.g_acc[p] = g_alpha[pixel];
          tg.t_final[p] = 1 - out_alpha[pixel];
          tg.transmittance[p] = out_transmittance[pixel];
          tg.last[p] = out_last[pixel];
          tg.row_last[r] = std::max(tg.row_last[r], out_last[pixel]);
          scalar_t dot = 0;
          for (int64_t ch = 0; ch < channels; ++ch) {
            const scalar_t g = g_img[pixel * channels + ch];
            tg.g_rgb[ch * plane + p] = g;
            if (in.background) {
              dot += g * in.background[ch];
              bg_sum[ch] += tg.t_final[p] * g;
            }
          }
          tg.bg_dot[p] = dot;
        }
        tile_last = std::max(tile_last, tg.row_last[r]);
      }
      scalar_t* tile_rows = pairs + start * row_size;
      // Gaussians after the last one used get nothing.
      std::fill(tile_rows + (static_cast<int64_t>(tile_last) + 1) * row_size, tile_rows + gs.count * row_size,
                scalar_t(0));
      // Back to front; behind[p] is the sum over the later Gaussians j of w_j v_j.
      with_channels(channels, [&](auto fixed) {
      constexpr int64_t C = decltype(fixed)::value;
      const int64_t num_channels = C ? C : channels;
      for (int64_t k = static_cast<int64_t>(tile_last); k >= 0; --k) {
        const int64_t lo = gs.col_lo[k], hi = gs.col_hi[k], first = lo - lo % S::kLanes;
        const V entry = S::splat(static_cast<scalar_t>(k));
        const scalar_t* ck = &gs.colors[k * num_channels];
        const scalar_t minus_a = -gs.a[k], qb = gs.b[k], minus_c = -gs.c[k];
        std::fill(tg.sums.begin(), tg.sums.end(), scalar_t(0));
        scalar_t* sums = tg.sums.data();
        // First the Gaussian's alpha where pixels of its box used it (as in the forward: the
        // exps first, then the gradients, so that the exps of different vectors overlap).
        GaussianOnRow<scalar_t> gauss(gs, k);
        int64_t n = 0;
        for (int64_t r = gs.row_lo[k]; r <= gs.row_hi[k]; ++r) {
          if (static_cast<scalar_t>(k) > tg.row_last[r]) continue;  // no pixel of the row used it
          gauss.on_row(static_cast<scalar_t>(y0 + r) + static_cast<scalar_t>(0.5));
          for (int64_t c0 = first; c0 <= hi; c0 += S::kLanes) {
            const int64_t p = r * stride + c0;
            // Used by the pixel: kept by the twin's rules, at or before the pixel's last one
            // (columns past the tile's last one have none; outside the box the exact test fails).
            const M before_last = entry <= S::load(&tg.last[p]);
            if (!any_lane(before_last)) continue;
            V dx;
            const V ns = gauss.exponent(S::load(&tg.centers[c0]), dx);
            if (!gauss.may_pass(ns)) continue;
            M on;
            const V raw_alpha = gauss.alpha(ns, rules, on);
            on &= before_last;
            if (!any_lane(on)) continue;  // no pixel of these columns used it: every term is 0
            S::store(&tg.box_alpha[n * S::kLanes], on ? raw_alpha : zero);  // > 0 exactly where on
            tg.box_pixel[n] = static_cast<int32_t>(p);
            tg.box_dy[n++] = gauss.dy;
          }
        }
        // Then the gradients, back to front per pixel.
        for (int64_t j = 0; j < n; ++j) {
          const int64_t p = tg.box_pixel[j], c0 = p % stride;
          const scalar_t dy = tg.box_dy[j];
          const V alpha = S::load(&tg.box_alpha[j * S::kLanes]);
          const M on = alpha > zero;
          const V dx = gauss.mx - S::load(&tg.centers[c0]);  // as GaussianOnRow::exponent
          const V t_after = S::load(&tg.transmittance[p]);
          const V over_transparency = one / (one - alpha);  // one division for the two below
          const V before = on ? t_after * over_transparency : t_after;
          V v = S::load(&tg.g_acc[p]);  // the output gradient seen through its color (alpha: 1)
          for (int64_t ch = 0; ch < num_channels; ++ch) v += S::load(&tg.g_rgb[ch * plane + p]) * ck[ch];
          const V w = alpha * before;
          const V t_final = S::load(&tg.t_final[p]);
          const V smaller = t_final < t_after ? t_final : t_after;
          const V behind = S::load(&tg.behind[p]);
          const V grad_alpha = (t_after * v - behind - smaller * S::load(&tg.bg_dot[p])) * over_transparency;
          // d alpha / d(-sigma) = alpha; clamped (and unused) alphas pass nothing.
          const M passes = on & (alpha < max_alpha);
          const V g = passes ? grad_alpha * alpha : zero;
          S::store(&sums[0 * stride + c0], S::load(&sums[0 * stride + c0]) + g * (minus_a * dx - qb * dy));
          S::store(&sums[1 * stride + c0], S::load(&sums[1 * stride + c0]) + g * (minus_c * dy - qb * dx));
          S::store(&sums[2 * stride + c0], S::load(&sums[2 * stride + c0]) + g * (minus_half * dx * dx));
          S::store(&sums[3 * stride + c0], S::load(&sums[3 * stride + c0]) + g * ((zero - dx) * dy));
          S::store(&sums[4 * stride + c0], S::load(&sums[4 * stride + c0]) + g * (minus_half * dy * dy));
          S::store(&sums[5 * stride + c0], S::load(&sums[5 * stride + c0]) + g);
          for (int64_t ch = 0; ch < num_channels; ++ch) {
            scalar_t* out = &sums[(kParams + ch) * stride + c0];
            S::store(out, S::load(out) + w * S::load(&tg.g_rgb[ch * plane + p]));
          }
          S::store(&tg.behind[p], behind + w * v);
          S::store(&tg.transmittance[p], before);
        }
        scalar_t* grads = tile_rows + k * row_size;
        for (int64_t q = 0; q < row_size; ++q) {
          scalar_t sum = 0;
          if (n) {
            for (int64_t col = 0; col < stride; ++col) sum += sums[q * stride + col];
          }
          grads[q] = sum;
        }
      }
      });
    }
  });
}
