// The kernels of rasterize_cpu.cpp, included there twice: once for the baseline instruction
// set, once (on x86-64 with GCC) inside `#pragma GCC target("avx2")`, so that one build runs
// its vectors as AVX2 where the CPU has it and as SSE2 elsewhere. No include guard, no
// includes: rasterize_cpu.cpp includes what this needs before each copy, and wraps each copy
// in a namespace of its own.

// The twin's thresholds as its tensors compare them: F.threshold against the largest float32
// below 1/255 ("raw > it" is "raw >= 1/255" in float32), the others as scalars of the dtype.
template <typename scalar_t>
struct Rules {
  scalar_t below_alpha_threshold = static_cast<scalar_t>(std::nextafter(static_cast<float>(kAlphaThreshold), 0.0f));
  scalar_t max_alpha = static_cast<scalar_t>(kMaxAlpha);
  scalar_t min_transmittance = static_cast<scalar_t>(kMinTransmittance);
};

// Per Gaussian, what does not depend on the tile, computed once per pass (not once per tile
// it touches: the log and the square roots were a tenth of the kernels' time): whether its
// conic is positive definite, and the half extents of the ellipse where it can pass the alpha
// threshold, -sigma >= skip level, i.e. a dx^2 + 2 b dx dy + c dy^2 <= -2 level, which spans
// dy^2 <= -2 a level / det and dx^2 <= -2 c level / det. The skip level is log(threshold /
// opacity) less a margin far above exp's rounding: a pixel outside the ellipse surely fails the
// exact test, which still decides every pixel inside. A conic that is not positive definite,
// a position that is not finite or an opacity that is not positive: reach the whole tile; an
// opacity below the threshold: reach nothing.
template <typename scalar_t>
struct GaussianReach {
  enum Kind : char { kEllipse, kWholeTile, kNothing };
  std::vector<double> reach_x, reach_y;
  std::vector<scalar_t> level;
  std::vector<char> kind, positive_definite;

  GaussianReach(const scalar_t* means2d, const scalar_t* conics, const scalar_t* opacities, int64_t n)
      : reach_x(n), reach_y(n), level(n), kind(n), positive_definite(n) {
    at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const scalar_t a = conics[3 * g], b = conics[3 * g + 1], c = conics[3 * g + 2];
        positive_definite[g] = a > 0 && a * c - b * b > 0;
        const double o = static_cast<double>(opacities[g]);
        level[g] = o > 0 ? static_cast<scalar_t>(std::log(kAlphaThreshold / o) - kSkipMargin)
                         : -std::numeric_limits<scalar_t>::infinity();
        const double qa = a, qb = b, qc = c, det = qa * qc - qb * qb;
        const double gx = means2d[2 * g], gy = means2d[2 * g + 1];
        kind[g] = kWholeTile;
        if (!(qa > 0 && det > 0 && std::isfinite(level[g]) && std::isfinite(gx) && std::isfinite(gy))) continue;
        const double reach_y2 = -2 * qa * level[g] / det, reach_x2 = -2 * qc * level[g] / det;
        kind[g] = reach_y2 >= 0 && reach_x2 >= 0 ? kEllipse : kNothing;
        if (kind[g] == kEllipse) reach_x[g] = std::sqrt(reach_x2), reach_y[g] = std::sqrt(reach_y2);
      }
    });
  }
};

// One tile's Gaussians, copied in depth order.
template <typename scalar_t>
struct TileGaussians {
  std::vector<scalar_t> mx, my, a, b, c, opacity, skip_below, colors;  // skip_below: GaussianReach::level
  std::vector<char> positive_definite;
  int64_t count = 0;
  // Per Gaussian, the tile-relative rows [row_lo, row_hi] and columns [col_lo, col_hi] of the
  // box around its reach (GaussianReach), widened by a pixel; row_lo > row_hi: none.
  std::vector<int32_t> row_lo, row_hi, col_lo, col_hi;

  void load(int64_t start, int64_t end, const int32_t* ids, const scalar_t* means2d, const scalar_t* conics,
            const scalar_t* opacities, const scalar_t* all_colors, int64_t channels,
            const GaussianReach<scalar_t>& reach, int64_t x0, int64_t y0, int64_t rows, int64_t cols) {
    count = end - start;
    for (auto* v : {&mx, &my, &a, &b, &c, &opacity, &skip_below}) v->resize(count);
    for (auto* v : {&row_lo, &row_hi, &col_lo, &col_hi}) v->resize(count);
    positive_definite.resize(count);
    colors.resize(count * channels);
    // Clamped before the casts (a far-off mean must not overflow an int): lo in [0, n], hi in [-1, n - 1].
    const auto clamp = [](double v, double lo, double hi) { return static_cast<int32_t>(std::min(std::max(v, lo), hi)); };
    for (int64_t k = 0; k < count; ++k) {
      const int64_t g = ids[start + k];
      mx[k] = means2d[2 * g];
      my[k] = means2d[2 * g + 1];
      a[k] = conics[3 * g];
      b[k] = conics[3 * g + 1];
      c[k] = conics[3 * g + 2];
      opacity[k] = opacities[g];
      positive_definite[k] = reach.positive_definite[g];
      skip_below[k] = reach.level[g];
      for (int64_t ch = 0; ch < channels; ++ch) colors[k * channels + ch] = all_colors[g * channels + ch];
      row_lo[k] = 0, row_hi[k] = static_cast<int32_t>(rows - 1);
      col_lo[k] = 0, col_hi[k] = static_cast<int32_t>(cols - 1);
      if (reach.kind[g] == GaussianReach<scalar_t>::kWholeTile) continue;
      if (reach.kind[g] == GaussianReach<scalar_t>::kNothing) {
        row_lo[k] = 1, row_hi[k] = 0;
        continue;
      }
      // Pixel row r has its center at y0 + r + 0.5 (columns alike): keep the ones within reach.
      const double gx = mx[k], gy = my[k], reach_x = reach.reach_x[g], reach_y = reach.reach_y[g];
      row_lo[k] = clamp(std::ceil(gy - reach_y - 0.5 - static_cast<double>(y0)) - 1, 0, rows);
      row_hi[k] = clamp(std::floor(gy + reach_y - 0.5 - static_cast<double>(y0)) + 1, -1, rows - 1);
      col_lo[k] = clamp(std::ceil(gx - reach_x - 0.5 - static_cast<double>(x0)) - 1, 0, cols);
      col_hi[k] = clamp(std::floor(gx + reach_x - 0.5 - static_cast<double>(x0)) + 1, -1, cols - 1);
      if (col_lo[k] > col_hi[k]) row_lo[k] = 1, row_hi[k] = 0;
    }
  }

  // One Gaussian's exponent terms on one row: -sigma = (x_term + y_term) + cross * dy, each
  // computed as the twin computes it, in the same order (no fused multiply-add: the module is
  // built for plain x86-64, whose float ops round each step as torch's kernels do).
  inline scalar_t y_term(int64_t k, scalar_t dy) const { return static_cast<scalar_t>(-0.5) * c[k] * dy * dy; }
  inline scalar_t neg_sigma(int64_t k, scalar_t dx, scalar_t dy, scalar_t yt) const {
    return (static_cast<scalar_t>(-0.5) * a[k] * dx * dx + yt) + (-b[k] * dx) * dy;
  }
};

// Columns are processed kLanes at a time with GCC/Clang vector extensions (32-byte vectors:
// one AVX register or two SSE ones), because the compiler does not vectorize a loop with this
// many selects by itself. Every lane computes exactly what the scalar expression computes.
template <typename T>
struct Simd {
  static constexpr int kLanes = 32 / sizeof(T);
  typedef T V __attribute__((vector_size(32)));
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> I;
  typedef I M __attribute__((vector_size(32)));
  // Unaligned, typed as T: unlike memcpy, such an access may alias only Ts, so the compiler
  // need not reload every pointer and constant after each store.
  typedef T Unaligned __attribute__((vector_size(32), aligned(alignof(T))));
  static V load(const T* p) { return *reinterpret_cast<const Unaligned*>(p); }
  static void store(T* p, V v) { *reinterpret_cast<Unaligned*>(p) = v; }
  static V splat(T x) { return V{} + x; }
};

// Whether any lane of a mask is set: one movemask where the instruction set has it (the loop
// of lane reads it replaces was a tenth of the backward's time), else lane by lane.
template <typename M>
inline bool any_lane(const M& m) {
#if defined(TURBOGS_KERNELS_AVX2)
  __m256i v;
  std::memcpy(&v, &m, sizeof(v));
  return !_mm256_testz_si256(v, v);
#elif defined(__SSE2__)
  __m128i lo, hi;
  std::memcpy(&lo, &m, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&m) + sizeof(lo), sizeof(hi));
  return _mm_movemask_epi8(_mm_or_si128(lo, hi)) != 0;
#else
  bool any = false;
  for (size_t l = 0; l < sizeof(M) / sizeof(m[0]); ++l) any |= m[l] != 0;
  return any;
#endif
}

// exp for float32 lanes: Cody-Waite reduction to |r| <= ln2 / 2 and a degree-7 Taylor
// polynomial (truncation 5e-9, under half an ulp), then 2^n from the exponent bits: within
// 2 ulp of the correctly rounded value, as torch's own vectorized exp is. Double lanes (the
// tests' float64 runs) use std::exp.
inline Simd<float>::V vector_exp(Simd<float>::V x) {
  typedef Simd<float>::V V;
  typedef Simd<float>::M M;
  const V low = Simd<float>::splat(-87.0f), high = Simd<float>::splat(88.0f);
  x = x < low ? low : x;
  x = x > high ? high : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V t = x * 1.44269504f + shifter;
  const V n = t - shifter;
  const V r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  // The polynomial by Estrin's scheme (four independent pairs, then r^2 and r^4): a chain of
  // 6 dependent operations instead of Horner's 14, which the pixels' compositing waited on.
  const V r2 = r * r, r4 = r2 * r2;
  const V p01 = r + 1.0f, p23 = r * (1.0f / 6.0f) + 0.5f;
  const V p45 = r * (1.0f / 120.0f) + 1.0f / 24.0f, p67 = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  const V p = (p01 + r2 * p23) + r4 * (p45 + r2 * p67);
  M bits;
  std::memcpy(&bits, &t, sizeof(bits));  // t's low mantissa bits hold n (two's complement)
  const M scale_bits = (bits - 0x4B400000 + 127) << 23;
  V scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return p * scale;
}
inline Simd<double>::V vector_exp(Simd<double>::V x) {
  for (int i = 0; i < Simd<double>::kLanes; ++i) x[i] = std::exp(x[i]);
  return x;
}

// One Gaussian over a tile's pixel rows, kLanes columns at a time: its alpha exactly as the
// twin computes it (the same expression and order in the forward and the backward pass, so
// both see the same bits). Its constants are read once for all its rows (`on_row` sets a
// row's): read per row, each was read again after every float store (which may alias it).
template <typename scalar_t>
struct GaussianOnRow {
  typedef Simd<scalar_t> S;
  typedef typename S::V V;
  typedef typename S::M M;
  scalar_t my, minus_half_c, mx, o, half_a, minus_b, skip_below;
  M positive_definite;
  scalar_t dy = 0, yt = 0;  // the row's

  GaussianOnRow(const TileGaussians<scalar_t>& gs, int64_t k)
      : my(gs.my[k]), minus_half_c(static_cast<scalar_t>(-0.5) * gs.c[k]), mx(gs.mx[k]), o(gs.opacity[k]),
        half_a(static_cast<scalar_t>(-0.5) * gs.a[k]), minus_b(-gs.b[k]), skip_below(gs.skip_below[k]),
        positive_definite(M{} - static_cast<typename S::I>(gs.positive_definite[k] ? 1 : 0)) {}

  // The row whose pixel centers are at y = py.
  inline void on_row(scalar_t py) {
    dy = my - py;
    yt = minus_half_c * dy * dy;  // as TileGaussians::y_term
  }

  // -sigma at pixel centers x = px, and `dx` for the gradients.
  inline V exponent(const V& px, V& dx) const {
    dx = mx - px;
    return (half_a * dx * dx + yt) + (minus_b * dx) * dy;  // as TileGaussians::neg_sigma
  }

  // Whether some lane of -sigma may pass the alpha threshold: where none can, the exp and
  // everything after it are skipped (a quarter of the vectors in a Gaussian's box).
  inline bool may_pass(const V& ns) const { return any_lane(ns >= skip_below); }

  // Alpha from -sigma; `on`: where the twin keeps it (not below the threshold, NaN included,
  // and -sigma <= 0 unless the conic is positive definite), before the pixel's own state.
  inline V alpha(const V& ns, const Rules<scalar_t>& rules, M& on) const {
    const scalar_t below_threshold = rules.below_alpha_threshold, max_alpha = rules.max_alpha;
    const V raw = o * vector_exp(ns);
    on = (raw > below_threshold) & (positive_definite | ~(ns > S::splat(0)));
    return raw < max_alpha ? raw : S::splat(max_alpha);
  }
};

// The x of the pixel centers of a tile's columns, [stride] (as the twin computes them).
template <typename scalar_t>
void column_centers(int64_t x0, std::vector<scalar_t>& centers) {
  for (size_t col = 0; col < centers.size(); ++col) {
    centers[col] = (static_cast<scalar_t>(col) + static_cast<scalar_t>(x0)) + static_cast<scalar_t>(0.5);
  }
}

// Calls body(std::integral_constant<int, C>) with C the channel count where it is one the
// trainer uses (3: RGB; 4 and 5: with the blame probe's channels), else with C = 0, meaning
// "read it at run time": with C known the per-channel loops unroll into straight code.
template <typename Body>
void with_channels(int64_t channels, const Body& body) {
  switch (channels) {
    case 3: return body(std::integral_constant<int, 3>());
    case 4: return body(std::integral_constant<int, 4>());
    case 5: return body(std::integral_constant<int, 5>());
    default: return body(std::integral_constant<int, 0>());
  }
}

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

// The inputs both passes read, as raw pointers.
template <typename scalar_t>
struct Inputs {
  const scalar_t *means2d, *conics, *colors, *opacities, *background;
  const int64_t* tiles;
  const int32_t *offsets, *ids;
  int64_t num_gaussians, channels, num_tiles, num_listed;

  Inputs(const at::Tensor& m, const at::Tensor& q, const at::Tensor& c, const at::Tensor& o, const at::Tensor& bg,
         const at::Tensor& tile_list, const at::Tensor& isect_offsets, const at::Tensor& flatten_ids)
      : means2d(m.data_ptr<scalar_t>()), conics(q.data_ptr<scalar_t>()), colors(c.data_ptr<scalar_t>()),
        opacities(o.data_ptr<scalar_t>()), background(bg.numel() ? bg.data_ptr<scalar_t>() : nullptr),
        tiles(tile_list.data_ptr<int64_t>()), offsets(isect_offsets.data_ptr<int32_t>()),
        ids(flatten_ids.data_ptr<int32_t>()), num_gaussians(m.size(0)), channels(c.size(1)), num_tiles(isect_offsets.numel()),
        num_listed(tile_list.numel()) {}
};

// Runs `body` on torch's threads, each of which takes the next tile from `next_tile` until
// none is left: tiles cost very different amounts (a tile of the sky, one of a dense object),
// so a static split of the list would leave threads idle. Which thread renders a tile changes
// nothing in its result: every tile is computed whole by one thread, into its own outputs.
template <typename Body>
void for_each_tile(int64_t num_tiles, std::atomic<int64_t>& next_tile, const Body& body) {
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_tiles));
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) { body(begin, end); });
}

// Loads listed tile i into `gs` with its Gaussians' boxes; returns its pixel origin and size.
template <typename scalar_t>
void load_tile(const Inputs<scalar_t>& in, const Grid& grid, const GaussianReach<scalar_t>& reach, int64_t i,
               TileGaussians<scalar_t>& gs, int64_t& start, int64_t& x0, int64_t& y0, int64_t& rows, int64_t& cols) {
  const int64_t t = in.tiles[i];
  int64_t stop;
  tile_range(in.offsets, t, in.num_tiles, grid.num_pairs, start, stop);
  x0 = (t % grid.tile_width) * grid.tile_size;
  y0 = (t / grid.tile_width) * grid.tile_size;
  rows = std::min(grid.tile_size, grid.height - y0);
  cols = std::min(grid.tile_size, grid.width - x0);
  gs.load(start, stop, in.ids, in.means2d, in.conics, in.opacities, in.colors, in.channels, reach, x0, y0, rows, cols);
}

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
      with_channels(channels, [&](auto c) { tile.template composite<decltype(c)::value>(gs, x0, y0, rows, cols, rules); });
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
