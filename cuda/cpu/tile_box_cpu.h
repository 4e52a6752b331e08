// A Gaussian's tile box and the question "does it reach a rendered tile?", shared by the
// projection (which culls what reaches none, turbogs/tiles.py `boxes_touch_tiles`) and the
// tile intersection (which lists the pairs): both must use one rule, bit for bit the twins'.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace turbogs_cpu {

// A Gaussian's tile box [min, max) in tile units, computed in float32 as the twin does. A tile
// size that is a power of two divides exactly as its reciprocal multiplies (the same bits, and
// a multiplication costs a fraction of a division: the projection asks this of every Gaussian).
inline void tile_box(float x, float y, int32_t rx, int32_t ry, int64_t tile_size, int64_t tile_width,
                     int64_t tile_height, int64_t box[4]) {
  const float ts = static_cast<float>(tile_size);
  const bool power_of_two = tile_size > 0 && (tile_size & (tile_size - 1)) == 0;
  const float inverse = 1.0f / ts;
  const auto scaled = [&](float v) { return power_of_two ? v * inverse : v / ts; };
  const float cx = scaled(x), cy = scaled(y), ex = scaled(static_cast<float>(rx)), ey = scaled(static_cast<float>(ry));
  const float limit[2] = {static_cast<float>(tile_width), static_cast<float>(tile_height)};
  const float lo[2] = {std::floor(cx - ex), std::floor(cy - ey)};
  const float hi[2] = {std::ceil(cx + ex), std::ceil(cy + ey)};
  for (int d = 0; d < 2; ++d) {
    const float l = std::min(std::max(lo[d], 0.0f), limit[d]), h = std::min(std::max(hi[d], 0.0f), limit[d]);
    box[2 * d] = std::isfinite(l) ? static_cast<int64_t>(l) : 0;
    box[2 * d + 1] = std::isfinite(h) ? static_cast<int64_t>(h) : 0;
  }
}

// The rendered tiles of a [TH * TW] bool mask as a summed-area table: how many a box holds, in
// four reads.
class TileTable {
 public:
  TileTable(const bool* selected, int64_t tile_width, int64_t tile_height)
      : row_(tile_width + 1), table_((tile_width + 1) * (tile_height + 1), 0) {
    for (int64_t y = 0; y < tile_height; ++y)
      for (int64_t x = 0; x < tile_width; ++x)
        table_[(y + 1) * row_ + x + 1] = table_[y * row_ + x + 1] + table_[(y + 1) * row_ + x] - table_[y * row_ + x] +
                                         (selected[y * tile_width + x] ? 1 : 0);
  }

  // Whether the box [x0, x1) x [y0, y1) holds a rendered tile.
  bool any(const int64_t box[4]) const {
    return table_[box[3] * row_ + box[1]] - table_[box[2] * row_ + box[1]] - table_[box[3] * row_ + box[0]] +
               table_[box[2] * row_ + box[0]] >
           0;
  }

 private:
  int64_t row_;
  std::vector<int32_t> table_;
};

}  // namespace turbogs_cpu
