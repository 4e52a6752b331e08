// Tile intersection on the CPU: every (tile, Gaussian) pair whose tile the Gaussian's screen
// box overlaps, sorted by tile, then depth, then Gaussian index; exactly the output of the
// torch twin (turbogs/kernels/raster_torch.py `intersect_tiles`), bit for bit.
//
// Why native: the twin expands every Gaussian into all its tiles with several tensor passes
// and then sorts the pairs, also for a step that renders a quarter of the tiles (where it
// drops three quarters afterwards): 12 % of such a step at 10k Gaussians. Here the visible
// Gaussians are sorted by depth once (the twin's keys: the float32 bit pattern, ties by
// index), counted per selected tile, and placed by a counting sort: each tile's run comes out
// in depth order without sorting pairs. Serial: it is a small part of a step, the more so as
// the projection has culled what reaches no selected tile.

#include <torch/extension.h>

#include "tile_box_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

using turbogs_cpu::tile_box;

// Returns (isect_offsets [TH, TW] int32, flatten_ids [M] int32). `tile_mask`: [TH * TW] bool,
// or empty for every tile.
std::vector<at::Tensor> intersect_tiles(const at::Tensor& means2d, const at::Tensor& radii, const at::Tensor& depths,
                                        int64_t tile_size, int64_t tile_width, int64_t tile_height,
                                        const at::Tensor& tile_mask) {
  TORCH_CHECK(means2d.device().is_cpu() && radii.device().is_cpu() && depths.device().is_cpu(),
              "intersect_cpu: CPU tensors");
  const auto m = means2d.to(at::kFloat).contiguous();
  const auto r = radii.to(at::kInt).contiguous();
  const auto d = depths.to(at::kFloat).contiguous();
  const auto mask = tile_mask.numel() ? tile_mask.to(at::kBool).contiguous() : tile_mask;
  TORCH_CHECK(m.dim() == 2 && m.size(1) == 2 && r.dim() == 2 && r.size(1) == 2 && d.numel() == m.size(0),
              "intersect_cpu: means2d [N, 2], radii [N, 2], depths [N]");
  TORCH_CHECK(!mask.numel() || mask.numel() == tile_width * tile_height, "intersect_cpu: tile_mask [TH, TW]");
  const int64_t n = m.size(0), num_tiles = tile_width * tile_height;
  TORCH_CHECK(n <= INT32_MAX, "intersect_cpu: at most 2^31 - 1 Gaussians (the ids are int32)");
  const float* xy = m.data_ptr<float>();
  const int32_t* rad = r.data_ptr<int32_t>();
  const float* depth = d.data_ptr<float>();
  const bool* selected = mask.numel() ? mask.data_ptr<bool>() : nullptr;

  // Visible Gaussians by depth: the unsigned bit pattern, ties by index. Key and index packed
  // into one 64-bit word sort as one number, which is that order, with no indirection.
  std::vector<uint64_t> packed;
  packed.reserve(n);
  for (int64_t g = 0; g < n; ++g) {
    if (rad[2 * g] <= 0 || rad[2 * g + 1] <= 0) continue;
    uint32_t key;
    std::memcpy(&key, &depth[g], sizeof(uint32_t));
    packed.push_back((static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(g));
  }
  std::sort(packed.begin(), packed.end());
  std::vector<int64_t> order(packed.size());
  for (size_t i = 0; i < packed.size(); ++i) order[i] = static_cast<int64_t>(packed[i] & 0xFFFFFFFFu);

  std::vector<int64_t> boxes(order.size() * 4);
  std::vector<int64_t> counts(num_tiles + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t g = order[i];
    int64_t* box = &boxes[4 * i];
    tile_box(xy[2 * g], xy[2 * g + 1], rad[2 * g], rad[2 * g + 1], tile_size, tile_width, tile_height, box);
    for (int64_t ty = box[2]; ty < box[3]; ++ty)
      for (int64_t tx = box[0]; tx < box[1]; ++tx) {
        const int64_t t = ty * tile_width + tx;
        if (!selected || selected[t]) ++counts[t + 1];
      }
  }
  std::partial_sum(counts.begin(), counts.end(), counts.begin());  // counts[t]: start of tile t
  auto offsets = at::empty({tile_height, tile_width}, at::kInt);
  int32_t* off = offsets.data_ptr<int32_t>();
  for (int64_t t = 0; t < num_tiles; ++t) off[t] = static_cast<int32_t>(counts[t]);
  auto flatten_ids = at::empty({counts[num_tiles]}, at::kInt);
  int32_t* ids = flatten_ids.data_ptr<int32_t>();
  for (size_t i = 0; i < order.size(); ++i) {  // depth order: each tile's run fills front to back
    const int64_t* box = &boxes[4 * i];
    for (int64_t ty = box[2]; ty < box[3]; ++ty)
      for (int64_t tx = box[0]; tx < box[1]; ++tx) {
        const int64_t t = ty * tile_width + tx;
        if (!selected || selected[t]) ids[counts[t]++] = static_cast<int32_t>(order[i]);
      }
  }
  return {offsets, flatten_ids};
}
