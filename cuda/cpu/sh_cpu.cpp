// View-dependent color on the CPU: real spherical harmonics of degree 0-3 along each
// Gaussian's direction, forward and backward, with the rules of the torch twin
// (turbogs/kernels/projection_torch.py `spherical_harmonics`, 3DGS's conventions):
//
// - the direction is normalized first, d / max(|d|, 1e-12) (F.normalize);
// - the value is sum over the first (degree + 1)^2 bases of basis(d) * coefficient, per
//   channel (3); coefficients past those get a zero gradient.
//
// Why native: the twin is some 60 small torch ops a step over every Gaussian, forward and
// backward, which at 100k Gaussians cost more than the compositing of a quarter of the tiles.
// Here each Gaussian is one loop iteration, and the basis
// gradients are the twin's polynomials differentiated (by sympy, then written out by hand).
// Each Gaussian is computed alone: the bits do not depend on the thread count.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr double kNormalizeEps = 1e-12;  // F.normalize's
constexpr int kMaxBases = 16;            // degree 3

// The real SH bases at unit direction (x, y, z), in 3DGS's order and signs.
template <typename T>
void bases(int64_t num_bases, T x, T y, T z, T* b) {
  b[0] = T(0.2820947917738781);
  if (num_bases <= 1) return;
  b[1] = T(-0.48860251190292) * y;
  b[2] = T(0.48860251190292) * z;
  b[3] = T(-0.48860251190292) * x;
  if (num_bases <= 4) return;
  const T xx = x * x, yy = y * y, zz = z * z;
  b[4] = T(1.092548430592079) * x * y;
  b[5] = T(-1.092548430592079) * y * z;
  b[6] = T(0.9461746957575601) * zz - T(0.3153915652525201);
  b[7] = T(-1.092548430592079) * x * z;
  b[8] = T(0.5462742152960395) * (xx - yy);
  if (num_bases <= 9) return;
  b[9] = T(-0.5900435899266435) * y * (3 * xx - yy);
  b[10] = T(2.890611442640554) * x * y * z;
  b[11] = y * (T(0.4570457994644658) - T(2.285228997322329) * zz);
  b[12] = z * (T(1.865881662950577) * zz - T(1.119528997770346));
  b[13] = x * (T(0.4570457994644658) - T(2.285228997322329) * zz);
  b[14] = T(1.445305721320277) * z * (xx - yy);
  b[15] = T(-0.5900435899266435) * x * (xx - 3 * yy);
}

// sum_k v_b[k] * grad basis_k(x, y, z), into (gx, gy, gz).
template <typename T>
void basis_gradients(int64_t num_bases, T x, T y, T z, const T* vb, T& gx, T& gy, T& gz) {
  gx = gy = gz = 0;
  if (num_bases <= 1) return;
  const T c1 = T(0.48860251190292);
  gx += -c1 * vb[3], gy += -c1 * vb[1], gz += c1 * vb[2];
  if (num_bases <= 4) return;
  const T c2 = T(1.092548430592079), xx = x * x, yy = y * y, zz = z * z;
  gx += c2 * (y * vb[4] - z * vb[7] + x * vb[8]);
  gy += c2 * (x * vb[4] - z * vb[5] - y * vb[8]);
  gz += c2 * (-y * vb[5] - x * vb[7]) + T(1.8923493915151202) * z * vb[6];
  if (num_bases <= 9) return;
  const T c9 = T(1.7701307697799305), c10 = T(2.890611442640554), c14 = T(1.445305721320277);
  const T c11 = T(0.4570457994644658) - T(2.285228997322329) * zz;
  gx += -2 * c9 * x * y * vb[9] + c10 * y * z * vb[10] + c11 * vb[13] + 2 * c14 * x * z * vb[14] +
        c9 * (yy - xx) * vb[15];
  gy += c9 * (yy - xx) * vb[9] + c10 * x * z * vb[10] + c11 * vb[11] - 2 * c14 * y * z * vb[14] +
        2 * c9 * x * y * vb[15];
  gz += c10 * x * y * vb[10] - T(4.570457994644658) * z * (y * vb[11] + x * vb[13]) +
        (T(5.597644988851731) * zz - T(1.119528997770346)) * vb[12] + c14 * (xx - yy) * vb[14];
}

// The unit direction of d and the length it was divided by (F.normalize's); `clamped`: the
// length was below the floor, which then stood in for it.
template <typename T>
T normalize(const T* d, T& x, T& y, T& z, bool& clamped) {
  const T norm = std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  clamped = !(norm > T(kNormalizeEps));
  const T length = clamped ? T(kNormalizeEps) : norm;
  x = d[0] / length, y = d[1] / length, z = d[2] / length;
  return length;
}

// The coefficients come in the two parts Gaussians store them in, the DC term sh0 [N, 1, 3] and
// the rest [N, R, 3] (R may exceed what the degree uses, or be 0 at degree 0), so that a
// training step neither concatenates them nor splits the gradient afterwards.
int64_t checked_bases(int64_t degree, const at::Tensor& dirs, const at::Tensor& sh0, const at::Tensor& rest) {
  TORCH_CHECK(degree >= 0 && degree <= 3, "sh_cpu: degree must be 0-3");
  TORCH_CHECK(dirs.device().is_cpu() && sh0.device().is_cpu() && rest.device().is_cpu() && dirs.is_contiguous() &&
                  sh0.is_contiguous() && rest.is_contiguous(),
              "sh_cpu: inputs must be contiguous CPU tensors");
  const int64_t n = dirs.size(0);
  TORCH_CHECK(dirs.dim() == 2 && dirs.size(1) == 3 && sh0.dim() == 3 && sh0.size(0) == n && sh0.size(1) == 1 &&
                  sh0.size(2) == 3 && rest.dim() == 3 && rest.size(0) == n && rest.size(2) == 3 &&
                  dirs.scalar_type() == sh0.scalar_type() && dirs.scalar_type() == rest.scalar_type(),
              "sh_cpu: dirs [N, 3], sh0 [N, 1, 3] and rest [N, R, 3] of one dtype");
  const int64_t num_bases = (degree + 1) * (degree + 1);
  TORCH_CHECK(rest.size(1) + 1 >= num_bases, "sh_cpu: too few coefficients for the degree");
  return num_bases;
}

// The mask's rows, or nullptr for every row.
const bool* checked_masks(const at::Tensor& masks, int64_t n) {
  if (!masks.numel()) return nullptr;
  TORCH_CHECK(masks.scalar_type() == at::kBool && masks.is_contiguous() && masks.numel() == n,
              "sh_cpu: masks must be a contiguous [N] bool");
  return masks.data_ptr<bool>();
}

}  // namespace

// [N, 3]: the raw SH value (the caller adds 0.5).
// `masks`: [N] bool, or empty for every row; a masked-out row is 0 (gsplat's `masks`).
at::Tensor sh_forward(int64_t degree, const at::Tensor& dirs, const at::Tensor& sh0, const at::Tensor& rest,
                      const at::Tensor& masks) {
  const int64_t num_bases = checked_bases(degree, dirs, sh0, rest), n = dirs.size(0), r_all = rest.size(1);
  const bool* keep = checked_masks(masks, n);
  auto out = at::empty({n, 3}, dirs.options());
  AT_DISPATCH_FLOATING_TYPES(dirs.scalar_type(), "sh_forward", [&] {
    const scalar_t *d = dirs.data_ptr<scalar_t>(), *c0 = sh0.data_ptr<scalar_t>(), *cr = rest.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
      scalar_t b[kMaxBases];
      for (int64_t g = begin; g < end; ++g) {
        if (keep && !keep[g]) {
          o[3 * g] = o[3 * g + 1] = o[3 * g + 2] = 0;
          continue;
        }
        scalar_t x, y, z;
        bool clamped;
        normalize(d + 3 * g, x, y, z, clamped);
        bases(num_bases, x, y, z, b);
        const scalar_t* cg = cr + g * r_all * 3;  // band k >= 1 at cg[(k - 1) * 3 + ch]
        scalar_t sum[3];
        for (int ch = 0; ch < 3; ++ch) sum[ch] = b[0] * c0[3 * g + ch];
        for (int64_t k = 1; k < num_bases; ++k)
          for (int ch = 0; ch < 3; ++ch) sum[ch] += b[k] * cg[(k - 1) * 3 + ch];
        for (int ch = 0; ch < 3; ++ch) o[3 * g + ch] = sum[ch];
      }
    });
  });
  return out;
}

// (grad dirs [N, 3], grad sh0 [N, 1, 3], grad rest [N, R, 3]) from the gradient of the value
// [N, 3]; masked-out rows get zeros. Every entry is written once in the loop (no zero fill
// first: at 100k Gaussians and degree 3 that fill alone was a pass over 18 MB).
std::vector<at::Tensor> sh_backward(int64_t degree, const at::Tensor& dirs, const at::Tensor& sh0,
                                    const at::Tensor& rest, const at::Tensor& masks, const at::Tensor& grad_out) {
  const int64_t num_bases = checked_bases(degree, dirs, sh0, rest), n = dirs.size(0), r_all = rest.size(1);
  const bool* keep = checked_masks(masks, n);
  TORCH_CHECK(grad_out.is_contiguous() && grad_out.scalar_type() == dirs.scalar_type() && grad_out.numel() == n * 3,
              "sh_cpu: the gradient must be a contiguous [N, 3] of the inputs' dtype");
  auto grad_dirs = at::empty({n, 3}, dirs.options());
  auto grad_sh0 = at::empty_like(sh0);
  auto grad_rest = at::empty_like(rest);
  AT_DISPATCH_FLOATING_TYPES(dirs.scalar_type(), "sh_backward", [&] {
    const scalar_t *d = dirs.data_ptr<scalar_t>(), *c0 = sh0.data_ptr<scalar_t>(), *cr = rest.data_ptr<scalar_t>();
    const scalar_t* v = grad_out.data_ptr<scalar_t>();
    scalar_t *gd = grad_dirs.data_ptr<scalar_t>(), *g0 = grad_sh0.data_ptr<scalar_t>();
    scalar_t* gr = grad_rest.data_ptr<scalar_t>();
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
      scalar_t b[kMaxBases], vb[kMaxBases];
      for (int64_t g = begin; g < end; ++g) {
        scalar_t* grg = gr + g * r_all * 3;
        const bool skip = keep && !keep[g];
        const int64_t used = skip ? 0 : (num_bases - 1) * 3;  // the rest's entries this degree uses
        std::fill(grg + used, grg + r_all * 3, scalar_t(0));
        if (skip) {
          gd[3 * g] = gd[3 * g + 1] = gd[3 * g + 2] = 0;
          g0[3 * g] = g0[3 * g + 1] = g0[3 * g + 2] = 0;
          continue;
        }
        scalar_t x, y, z;
        bool clamped;
        const scalar_t length = normalize(d + 3 * g, x, y, z, clamped);
        bases(num_bases, x, y, z, b);
        const scalar_t* vg = v + 3 * g;
        vb[0] = 0;
        for (int ch = 0; ch < 3; ++ch) {
          g0[3 * g + ch] = b[0] * vg[ch];
          vb[0] += c0[3 * g + ch] * vg[ch];
        }
        const scalar_t* cg = cr + g * r_all * 3;  // band k >= 1 at (k - 1) * 3 + ch, as in grg
        for (int64_t k = 1; k < num_bases; ++k) {
          vb[k] = 0;
          for (int ch = 0; ch < 3; ++ch) {
            grg[(k - 1) * 3 + ch] = b[k] * vg[ch];
            vb[k] += cg[(k - 1) * 3 + ch] * vg[ch];
          }
        }
        // Through the bases to the unit direction, then through the normalization:
        // d(d / |d|) = (I - u u^T) / |d| where |d| > eps, I / eps where it was clamped.
        scalar_t ux, uy, uz;
        basis_gradients(num_bases, x, y, z, vb, ux, uy, uz);
        const scalar_t along = clamped ? scalar_t(0) : x * ux + y * uy + z * uz;
        gd[3 * g] = (ux - along * x) / length;
        gd[3 * g + 1] = (uy - along * y) / length;
        gd[3 * g + 2] = (uz - along * z) / length;
      }
    });
  });
  return {grad_dirs, grad_sh0, grad_rest};
}
