// What both passes of rasterize_cpu.cpp's kernels share: the inputs, one tile's Gaussians and
// the box each can reach, the vector type and its exp, and one Gaussian's alpha on a pixel row.
// Included, like rasterize_cpu_kernels.h, once per instruction set inside a namespace of its
// own (no include guard, no includes: rasterize_cpu.cpp includes what this needs first).

// The twin's thresholds as its tensors compare them: F.threshold against the largest float32
// below 1/255 ("raw > it" is "raw >= 1/255" in float32), the others as scalars of the dtype.
template <typename scalar_t>
struct Rules {
  scalar_t below_alpha_threshold = static_cast<scalar_t>(std::nextafter(static_cast<float>(kAlphaThreshold), 0.0f));
  scalar_t max_alpha = static_cast<scalar_t>(kMaxAlpha);
  scalar_t min_transmittance = static_cast<scalar_t>(kMinTransmittance);
};

// Per Gaussian, what does not depend on the tile, computed once per pass rather than once
// for each tile it touches (a log and two square roots each time): whether its
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
    const auto clamp = [](double v, double lo, double hi) {
      return static_cast<int32_t>(std::min(std::max(v, lo), hi));
    };
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
};

// Columns are processed kLanes at a time with GCC/Clang vector extensions (32-byte vectors:
// one AVX register or two SSE ones; 64 bytes in the AVX-512 copy, a whole 16-pixel tile row),
// because the compiler does not vectorize a loop with this many selects by itself. Every lane
// computes exactly what the scalar expression computes, whatever the width.
#if defined(TURBOGS_KERNELS_AVX512)
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif
template <typename T>
struct Simd {
  static constexpr int kLanes = kVectorBytes / sizeof(T);
  typedef T V __attribute__((vector_size(kVectorBytes)));
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> I;
  typedef I M __attribute__((vector_size(kVectorBytes)));
  // Unaligned, typed as T: unlike memcpy, such an access may alias only Ts, so the compiler
  // need not reload every pointer and constant after each store.
  typedef T Unaligned __attribute__((vector_size(kVectorBytes), aligned(alignof(T))));
  static V load(const T* p) { return *reinterpret_cast<const Unaligned*>(p); }
  static void store(T* p, V v) { *reinterpret_cast<Unaligned*>(p) = v; }
  static V splat(T x) { return V{} + x; }
};

// Whether any lane of a mask is set: one movemask where the instruction set has it (the loop
// of lane reads it replaces was a tenth of the backward's time), else lane by lane.
template <typename M>
inline bool any_lane(const M& m) {
#if defined(TURBOGS_KERNELS_AVX512)
  __m512i v;
  std::memcpy(&v, &m, sizeof(v));
  return _mm512_test_epi32_mask(v, v) != 0;
#elif defined(TURBOGS_KERNELS_AVX2)
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
// both see the same bits): -sigma = (x_term + y_term) + cross * dy, each term in the twin's
// order (no fused multiply-add: the module is built for plain x86-64, whose float ops round
// each step as torch's kernels do). Its constants are read once for all its rows (`on_row` sets
// a row's): read per row, each was read again after every float store (which may alias it).
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
    yt = minus_half_c * dy * dy;  // y_term: (-c / 2) dy^2
  }

  // -sigma at pixel centers x = px, and `dx` for the gradients.
  inline V exponent(const V& px, V& dx) const {
    dx = mx - px;
    return (half_a * dx * dx + yt) + (minus_b * dx) * dy;  // (x_term + y_term) + cross * dy
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
        ids(flatten_ids.data_ptr<int32_t>()), num_gaussians(m.size(0)), channels(c.size(1)),
        num_tiles(isect_offsets.numel()), num_listed(tile_list.numel()) {}
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

