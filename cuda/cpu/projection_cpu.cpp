// Projecting Gaussians into one pinhole camera on the CPU (EWA splatting), forward and
// backward, with the rules of the torch twin (turbogs/kernels/raster_torch.py `project`,
// its math in projection_torch.py, gsplat's reference):
//
// - the quaternion is normalized first, q / max(|q|, 1e-12) (F.normalize); the world
//   covariance is M M^T with M = R(q) diag(scale);
// - mean and covariance go into the camera frame; a Gaussian outside [near, far] in depth is
//   projected from the stand-in point (0, 0, 1) and culled;
// - the Jacobian of the pinhole is taken at the mean clamped to 1.3x the field of view;
// - the screen covariance gets eps2d added on its diagonal (at least about a pixel), its
//   inverse is the conic, its radius ceil(3.33 sigma) per axis;
// - culled Gaussians (out of depth, det <= 0, or off the image, and with a tile mask those
//   whose tile box reaches none of its tiles) get radii 0 and zeros elsewhere, and no
//   gradient: the backward, SH and the tile intersection then skip them;
// - with `antialiased`, the opacity compensation sqrt(max(det(cov) / det(cov + eps2d I), 1e-12)).
//
// Why native: the twin is some 80 small torch ops over every Gaussian, forward and backward
// (batched 3x3 products, masks, stacks): 13-19 ms at 10k Gaussians on one core, a quarter of
// a step that composites a quarter of the tiles, and 120-150 ms at 100k. Here each Gaussian is
// one loop iteration: 1.9 and 19 ms (AMD EPYC, forward and backward).
// The backward computes the forward's intermediates again from the inputs (a few dozen flops),
// so nothing but the radii (which say who was culled) is kept between the passes. Each
// Gaussian is computed alone: the bits do not depend on the thread count. The gradients to the
// camera (viewmat, K) are not computed here: the caller runs the twin when those need them.

#include <torch/extension.h>

#include "tile_box_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace {

constexpr double kRadiusExtent = 3.33;  // a Gaussian's screen radius, in standard deviations
constexpr double kNormalizeEps = 1e-12;  // F.normalize's
constexpr double kCompensationFloor = 1e-12;
constexpr int64_t kGrain = 2048;  // Gaussians per parallel chunk

// The camera, in the Gaussians' dtype, computed as the twin computes it.
template <typename T>
struct Camera {
  T R[3][3], t[3];  // world -> camera
  T K[2][3];        // the first two rows of the intrinsics
  T lim_x_neg, lim_x_pos, lim_y_neg, lim_y_pos;  // the field of view widened by 30 %, as x/z and y/z
  T width, height, near_plane, far_plane, eps2d;

  Camera(const at::Tensor& viewmat, const at::Tensor& intrinsics, int64_t w, int64_t h, double near, double far,
         double eps)
      : width(T(w)), height(T(h)), near_plane(T(near)), far_plane(T(far)), eps2d(T(eps)) {
    const auto v = viewmat.accessor<T, 2>();
    const auto k = intrinsics.accessor<T, 2>();
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) R[i][j] = v[i][j];
      t[i] = v[i][3];
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) K[i][j] = k[i][j];
    const T fx = K[0][0], fy = K[1][1], cx = K[0][2], cy = K[1][2];
    const T tan_fovx = T(0.5 * w) / fx, tan_fovy = T(0.5 * h) / fy;
    lim_x_pos = (width - cx) / fx + T(0.3) * tan_fovx;
    lim_x_neg = cx / fx + T(0.3) * tan_fovx;
    lim_y_pos = (height - cy) / fy + T(0.3) * tan_fovy;
    lim_y_neg = cy / fy + T(0.3) * tan_fovy;
  }
};

// One Gaussian's projection and every intermediate its backward needs.
template <typename T>
struct Projection {
  T q[4], q_length;  // the unit quaternion (w, x, y, z) and what it was divided by
  bool q_clamped;    // |q| was below the floor, which stood in for it
  T Rq[3][3];        // its rotation
  T M[3][3];         // Rq diag(scale)
  T mean_c[3];       // the camera-space mean (the stand-in point when out of depth)
  T cov_c[3][3];     // the camera-space covariance
  T depth;           // the camera-space z, before the stand-in
  bool in_depth;
  T u_x, u_y;            // x/z and y/z, clamped to the widened field of view
  bool x_inside, y_inside;  // ... and whether they were inside it (then the clamp passes gradient)
  T J[2][3];             // the pinhole's Jacobian at the clamped point
  T cov2d[2][2];         // J cov_c J^T
  T mean2d[2];
  T var_x, var_y, cov_xy, det;  // the blurred screen covariance and its determinant
};

template <typename T>
T clamp(T value, T lo, T hi, bool& inside) {
  inside = value >= lo && value <= hi;  // torch.clamp's gradient passes at the bounds too
  return std::min(std::max(value, lo), hi);
}

template <typename T>
void project_one(const Camera<T>& cam, const T* mean, const T* quat, const T* scale, Projection<T>& p) {
  // Rotation and world covariance.
  const T norm = std::sqrt(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] + quat[3] * quat[3]);
  p.q_clamped = !(norm >= T(kNormalizeEps));
  p.q_length = p.q_clamped ? T(kNormalizeEps) : norm;
  for (int i = 0; i < 4; ++i) p.q[i] = quat[i] / p.q_length;
  const T w = p.q[0], x = p.q[1], y = p.q[2], z = p.q[3];
  const T rot[3][3] = {{1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)},
                       {2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)},
                       {2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)}};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) p.Rq[i][j] = rot[i][j], p.M[i][j] = rot[i][j] * scale[j];
  T cov[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) cov[i][j] = p.M[i][0] * p.M[j][0] + p.M[i][1] * p.M[j][1] + p.M[i][2] * p.M[j][2];

  // Into the camera frame: mean_c = R mean + t, cov_c = R cov R^T.
  for (int i = 0; i < 3; ++i)
    p.mean_c[i] = cam.R[i][0] * mean[0] + cam.R[i][1] * mean[1] + cam.R[i][2] * mean[2] + cam.t[i];
  T R_cov[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      R_cov[i][j] = cam.R[i][0] * cov[0][j] + cam.R[i][1] * cov[1][j] + cam.R[i][2] * cov[2][j];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      p.cov_c[i][j] = R_cov[i][0] * cam.R[j][0] + R_cov[i][1] * cam.R[j][1] + R_cov[i][2] * cam.R[j][2];
  p.depth = p.mean_c[2];
  p.in_depth = p.depth >= cam.near_plane && p.depth <= cam.far_plane;
  if (!p.in_depth) p.mean_c[0] = T(0), p.mean_c[1] = T(0), p.mean_c[2] = T(1);

  // The pinhole and its Jacobian at the clamped point.
  const T tz = p.mean_c[2], tz2 = tz * tz;
  p.u_x = clamp(p.mean_c[0] / tz, -cam.lim_x_neg, cam.lim_x_pos, p.x_inside);
  p.u_y = clamp(p.mean_c[1] / tz, -cam.lim_y_neg, cam.lim_y_pos, p.y_inside);
  const T tx = tz * p.u_x, ty = tz * p.u_y;
  const T fx = cam.K[0][0], fy = cam.K[1][1];
  p.J[0][0] = fx / tz, p.J[0][1] = T(0), p.J[0][2] = -fx * tx / tz2;
  p.J[1][0] = T(0), p.J[1][1] = fy / tz, p.J[1][2] = -fy * ty / tz2;
  T J_cov[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      J_cov[i][j] = p.J[i][0] * p.cov_c[0][j] + p.J[i][1] * p.cov_c[1][j] + p.J[i][2] * p.cov_c[2][j];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      p.cov2d[i][j] = J_cov[i][0] * p.J[j][0] + J_cov[i][1] * p.J[j][1] + J_cov[i][2] * p.J[j][2];
  for (int i = 0; i < 2; ++i)
    p.mean2d[i] = (cam.K[i][0] * p.mean_c[0] + cam.K[i][1] * p.mean_c[1] + cam.K[i][2] * p.mean_c[2]) / tz;

  // The low-pass filter: every splat covers at least about a pixel.
  p.var_x = p.cov2d[0][0] + cam.eps2d;
  p.var_y = p.cov2d[1][1] + cam.eps2d;
  p.cov_xy = T(0.5) * (p.cov2d[0][1] + p.cov2d[1][0]);
  p.det = p.var_x * p.var_y - p.cov_xy * p.cov_xy;
}

// The radii (0 when culled), as the twin decides them; whether it is visible.
template <typename T>
bool radii_of(const Camera<T>& cam, const Projection<T>& p, int32_t* radii) {
  const T rx = std::ceil(T(kRadiusExtent) * std::sqrt(std::max(p.var_x, T(0))));
  const T ry = std::ceil(T(kRadiusExtent) * std::sqrt(std::max(p.var_y, T(0))));
  const bool visible = p.in_depth && p.det > 0 && p.mean2d[0] + rx > 0 && p.mean2d[0] - rx < cam.width &&
                       p.mean2d[1] + ry > 0 && p.mean2d[1] - ry < cam.height;
  radii[0] = visible ? static_cast<int32_t>(rx) : 0;
  radii[1] = visible ? static_cast<int32_t>(ry) : 0;
  return visible;
}

// The determinant of the screen covariance before the blur, over the blurred one.
template <typename T>
T compensation_ratio(const Projection<T>& p) {
  const T det_orig = p.cov2d[0][0] * p.cov2d[1][1] - p.cov_xy * p.cov_xy;
  return det_orig / p.det;
}

// grad (blurred var_x, var_y, cov_xy) -> grad cov_c and grad of the camera-space mean, through
// J cov_c J^T, the clamped Jacobian and the pixel mean.
template <typename T>
void camera_space_gradients(const Camera<T>& cam, const Projection<T>& p, T g_var_x, T g_var_y, T g_cov_xy,
                            const T* g_mean2d, T g_depth, T g_mean_c[3], T g_cov_c[3][3]) {
  const T G[2][2] = {{g_var_x, T(0.5) * g_cov_xy}, {T(0.5) * g_cov_xy, g_var_y}};  // grad cov2d (symmetric)
  // grad cov_c = J^T G J; grad J = 2 G J cov_c (G and cov_c symmetric).
  T G_J[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) G_J[i][j] = G[i][0] * p.J[0][j] + G[i][1] * p.J[1][j];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) g_cov_c[i][j] = p.J[0][i] * G_J[0][j] + p.J[1][i] * G_J[1][j];
  T g_J[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      g_J[i][j] = 2 * (G_J[i][0] * p.cov_c[0][j] + G_J[i][1] * p.cov_c[1][j] + G_J[i][2] * p.cov_c[2][j]);

  // J = [[fx/tz, 0, -fx tx/tz^2], [0, fy/tz, -fy ty/tz^2]] with tx = tz u_x, u_x = clamp(x/tz).
  const T x = p.mean_c[0], y = p.mean_c[1], tz = p.mean_c[2], tz2 = tz * tz, tz3 = tz2 * tz;
  const T fx = cam.K[0][0], fy = cam.K[1][1];
  const T tx = tz * p.u_x, ty = tz * p.u_y;
  T g_tz = -fx / tz2 * g_J[0][0] - fy / tz2 * g_J[1][1];
  const T g_tx = -fx / tz2 * g_J[0][2], g_ty = -fy / tz2 * g_J[1][2];
  g_tz += 2 * fx * tx / tz3 * g_J[0][2] + 2 * fy * ty / tz3 * g_J[1][2];
  g_tz += g_tx * p.u_x + g_ty * p.u_y;  // tx = tz u_x
  const T g_ux = g_tx * tz, g_uy = g_ty * tz;
  T g_x = 0, g_y = 0;
  if (p.x_inside) g_x += g_ux / tz, g_tz -= g_ux * x / tz2;
  if (p.y_inside) g_y += g_uy / tz, g_tz -= g_uy * y / tz2;

  // mean2d_i = (K_i0 x + K_i1 y + K_i2 z) / z.
  for (int i = 0; i < 2; ++i) {
    g_x += g_mean2d[i] * cam.K[i][0] / tz;
    g_y += g_mean2d[i] * cam.K[i][1] / tz;
    g_tz -= g_mean2d[i] * (cam.K[i][0] * x + cam.K[i][1] * y) / tz2;
  }
  g_mean_c[0] = g_x, g_mean_c[1] = g_y, g_mean_c[2] = g_tz + g_depth;
}

// grad cov_c, grad mean_c -> grad mean, quaternion, scale (world space).
template <typename T>
void world_gradients(const Camera<T>& cam, const Projection<T>& p, const T* scale, const T g_mean_c[3],
                     const T g_cov_c[3][3], T* g_mean, T* g_quat, T* g_scale) {
  for (int j = 0; j < 3; ++j)
    g_mean[j] = cam.R[0][j] * g_mean_c[0] + cam.R[1][j] * g_mean_c[1] + cam.R[2][j] * g_mean_c[2];
  // grad cov = R^T grad cov_c R (symmetric); grad M = 2 grad cov M.
  T Rt_g[3][3], g_cov[3][3], g_M[3][3];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      Rt_g[i][j] = cam.R[0][i] * g_cov_c[0][j] + cam.R[1][i] * g_cov_c[1][j] + cam.R[2][i] * g_cov_c[2][j];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      g_cov[i][j] = Rt_g[i][0] * cam.R[0][j] + Rt_g[i][1] * cam.R[1][j] + Rt_g[i][2] * cam.R[2][j];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      g_M[i][j] = (g_cov[i][0] + g_cov[0][i]) * p.M[0][j] + (g_cov[i][1] + g_cov[1][i]) * p.M[1][j] +
                  (g_cov[i][2] + g_cov[2][i]) * p.M[2][j];
  // M = Rq diag(scale).
  T g[3][3];
  for (int j = 0; j < 3; ++j) {
    g_scale[j] = g_M[0][j] * p.Rq[0][j] + g_M[1][j] * p.Rq[1][j] + g_M[2][j] * p.Rq[2][j];
    for (int i = 0; i < 3; ++i) g[i][j] = g_M[i][j] * scale[j];
  }
  // Rq(w, x, y, z) of the unit quaternion, then its normalization:
  // d(q / |q|) = (I - u u^T) / |q| where |q| is above the floor, I / floor where it was clamped.
  const T w = p.q[0], x = p.q[1], y = p.q[2], z = p.q[3];
  const T g_unit[4] = {
      2 * (-z * g[0][1] + y * g[0][2] + z * g[1][0] - x * g[1][2] - y * g[2][0] + x * g[2][1]),
      2 * (y * g[0][1] + z * g[0][2] + y * g[1][0] - 2 * x * g[1][1] - w * g[1][2] + z * g[2][0] + w * g[2][1] -
           2 * x * g[2][2]),
      2 * (-2 * y * g[0][0] + x * g[0][1] + w * g[0][2] + x * g[1][0] + z * g[1][2] - w * g[2][0] + z * g[2][1] -
           2 * y * g[2][2]),
      2 * (-2 * z * g[0][0] - w * g[0][1] + x * g[0][2] + w * g[1][0] - 2 * z * g[1][1] + y * g[1][2] + x * g[2][0] +
           y * g[2][1])};
  const T along = p.q_clamped ? T(0) : w * g_unit[0] + x * g_unit[1] + y * g_unit[2] + z * g_unit[3];
  for (int i = 0; i < 4; ++i) g_quat[i] = (g_unit[i] - along * p.q[i]) / p.q_length;
}

void check_inputs(const at::Tensor& means, const at::Tensor& quats, const at::Tensor& scales,
                  const at::Tensor& viewmat, const at::Tensor& K) {
  for (const auto* t : {&means, &quats, &scales, &viewmat, &K})
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() && t->scalar_type() == means.scalar_type(),
                "projection_cpu: inputs must be contiguous CPU tensors of one dtype");
  const int64_t n = means.size(0);
  TORCH_CHECK(means.dim() == 2 && means.size(1) == 3 && quats.dim() == 2 && quats.size(0) == n &&
                  quats.size(1) == 4 && scales.dim() == 2 && scales.size(0) == n && scales.size(1) == 3,
              "projection_cpu: means [N, 3], quats [N, 4], scales [N, 3]");
  TORCH_CHECK(viewmat.dim() == 2 && viewmat.size(0) == 4 && viewmat.size(1) == 4 && K.dim() == 2 && K.size(0) == 3 &&
                  K.size(1) == 3,
              "projection_cpu: viewmat [4, 4], K [3, 3]");
}

}  // namespace

// Returns (radii [N, 2] int32, means2d [N, 2], depths [N], conics [N, 3], compensations [N],
// empty unless `antialiased`); culled Gaussians get zeros. `tile_mask`: [TH * TW] bool of the
// tiles that will be rendered (tiles of `tile_size` pixels), or empty for every tile.
std::vector<at::Tensor> project_forward(const at::Tensor& means, const at::Tensor& quats, const at::Tensor& scales,
                                        const at::Tensor& viewmat, const at::Tensor& K, int64_t width, int64_t height,
                                        double near_plane, double far_plane, double eps2d, bool antialiased,
                                        const at::Tensor& tile_mask, int64_t tile_size) {
  check_inputs(means, quats, scales, viewmat, K);
  const int64_t n = means.size(0);
  const int64_t tile_width = (width + tile_size - 1) / tile_size, tile_height = (height + tile_size - 1) / tile_size;
  TORCH_CHECK(!tile_mask.numel() || (tile_mask.scalar_type() == at::kBool && tile_mask.is_contiguous() &&
                                     tile_mask.numel() == tile_width * tile_height),
              "projection_cpu: tile_mask must be a contiguous [TH * TW] bool");
  std::optional<turbogs_cpu::TileTable> tiles;
  if (tile_mask.numel()) tiles.emplace(tile_mask.data_ptr<bool>(), tile_width, tile_height);
  auto radii = at::empty({n, 2}, means.options().dtype(at::kInt));
  auto means2d = at::empty({n, 2}, means.options());
  auto depths = at::empty({n}, means.options());
  auto conics = at::empty({n, 3}, means.options());
  auto compensations = at::empty({antialiased ? n : 0}, means.options());
  AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "project_forward", [&] {
    using T = scalar_t;
    const Camera<T> cam(viewmat, K, width, height, near_plane, far_plane, eps2d);
    const T *mean = means.data_ptr<T>(), *quat = quats.data_ptr<T>(), *scale = scales.data_ptr<T>();
    int32_t* r = radii.data_ptr<int32_t>();
    T *m2 = means2d.data_ptr<T>(), *d = depths.data_ptr<T>(), *c = conics.data_ptr<T>();
    T* comp = antialiased ? compensations.data_ptr<T>() : nullptr;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      Projection<T> p;
      for (int64_t g = begin; g < end; ++g) {
        project_one(cam, mean + 3 * g, quat + 4 * g, scale + 3 * g, p);
        bool visible = radii_of(cam, p, r + 2 * g);
        if (visible && tiles) {  // does its tile box reach a rendered tile? (the float32 rule of the twins)
          int64_t box[4];
          turbogs_cpu::tile_box(static_cast<float>(p.mean2d[0]), static_cast<float>(p.mean2d[1]), r[2 * g],
                                r[2 * g + 1], tile_size, tile_width, tile_height, box);
          visible = tiles->any(box);
          if (!visible) r[2 * g] = r[2 * g + 1] = 0;
        }
        m2[2 * g] = visible ? p.mean2d[0] : T(0);
        m2[2 * g + 1] = visible ? p.mean2d[1] : T(0);
        d[g] = visible ? p.depth : T(0);
        c[3 * g] = visible ? p.var_y / p.det : T(0);
        c[3 * g + 1] = visible ? -p.cov_xy / p.det : T(0);
        c[3 * g + 2] = visible ? p.var_x / p.det : T(0);
        if (comp) comp[g] = visible ? std::sqrt(std::max(compensation_ratio(p), T(kCompensationFloor))) : T(0);
      }
    });
  });
  return {radii, means2d, depths, conics, compensations};
}

// (grad means [N, 3], grad quats [N, 4], grad scales [N, 3]) from the gradients of the
// forward's float outputs; `radii` is the forward's (who was culled). `grad_compensations`
// is empty unless the forward was antialiased.
std::vector<at::Tensor> project_backward(const at::Tensor& means, const at::Tensor& quats, const at::Tensor& scales,
                                         const at::Tensor& viewmat, const at::Tensor& K, int64_t width, int64_t height,
                                         double eps2d, const at::Tensor& radii, const at::Tensor& grad_means2d,
                                         const at::Tensor& grad_depths, const at::Tensor& grad_conics,
                                         const at::Tensor& grad_compensations) {
  check_inputs(means, quats, scales, viewmat, K);
  const int64_t n = means.size(0);
  for (const auto* t : {&grad_means2d, &grad_depths, &grad_conics, &grad_compensations})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == means.scalar_type(),
                "projection_cpu: gradients must be contiguous, of the inputs' dtype");
  TORCH_CHECK(radii.is_contiguous() && radii.scalar_type() == at::kInt && radii.numel() == 2 * n &&
                  grad_means2d.numel() == 2 * n && grad_depths.numel() == n && grad_conics.numel() == 3 * n &&
                  (grad_compensations.numel() == 0 || grad_compensations.numel() == n),
              "projection_cpu: radii [N, 2] int32 and gradients of the outputs' shapes");
  auto grad_means = at::zeros_like(means);
  auto grad_quats = at::zeros_like(quats);
  auto grad_scales = at::zeros_like(scales);
  AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "project_backward", [&] {
    using T = scalar_t;
    // Near and far only decide who is culled, which `radii` already says: no depth is out of range here.
    const double inf = std::numeric_limits<double>::infinity();
    const Camera<T> cam(viewmat, K, width, height, -inf, inf, eps2d);
    const T *mean = means.data_ptr<T>(), *quat = quats.data_ptr<T>(), *scale = scales.data_ptr<T>();
    const int32_t* r = radii.data_ptr<int32_t>();
    const T *v_m2 = grad_means2d.data_ptr<T>(), *v_d = grad_depths.data_ptr<T>(), *v_c = grad_conics.data_ptr<T>();
    const T* v_comp = grad_compensations.numel() ? grad_compensations.data_ptr<T>() : nullptr;
    T *g_mean = grad_means.data_ptr<T>(), *g_quat = grad_quats.data_ptr<T>(), *g_scale = grad_scales.data_ptr<T>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      Projection<T> p;
      for (int64_t g = begin; g < end; ++g) {
        if (r[2 * g] == 0 && r[2 * g + 1] == 0) continue;  // culled: its outputs were constant zeros
        project_one(cam, mean + 3 * g, quat + 4 * g, scale + 3 * g, p);
        // The conic (var_y, -cov_xy, var_x) / det.
        const T vx = p.var_x, vy = p.var_y, b = p.cov_xy, det = p.det, det2 = det * det;
        const T* vc = v_c + 3 * g;
        T g_vx = (-vy * vy * vc[0] + b * vy * vc[1] - b * b * vc[2]) / det2;
        T g_vy = (-b * b * vc[0] + b * vx * vc[1] - vx * vx * vc[2]) / det2;
        T g_b = (2 * b * vy * vc[0] - (det + 2 * b * b) * vc[1] + 2 * b * vx * vc[2]) / det2;
        if (v_comp) {
          // sqrt(max(ratio, floor)), ratio = (p q - b^2) / det with p, q the unblurred variances.
          const T ratio = compensation_ratio(p);
          if (ratio >= T(kCompensationFloor)) {
            const T g_ratio = v_comp[g] * T(0.5) / std::sqrt(ratio);
            g_vx += g_ratio * (p.cov2d[1][1] - ratio * vy) / det;
            g_vy += g_ratio * (p.cov2d[0][0] - ratio * vx) / det;
            g_b += g_ratio * 2 * b * (ratio - 1) / det;
          }
        }
        T g_mean_c[3], g_cov_c[3][3];
        camera_space_gradients(cam, p, g_vx, g_vy, g_b, v_m2 + 2 * g, v_d[g], g_mean_c, g_cov_c);
        world_gradients(cam, p, scale + 3 * g, g_mean_c, g_cov_c, g_mean + 3 * g, g_quat + 4 * g, g_scale + 3 * g);
      }
    });
  });
  return {grad_means, grad_quats, grad_scales};
}
