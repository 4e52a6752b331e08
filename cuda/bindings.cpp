// Torch glue for the TurboGS kernels: checks tensors, allocates outputs and calls the
// launchers of turbo_kernels.h on the current CUDA stream. Every launch is checked at once
// (C10_CUDA_KERNEL_LAUNCH_CHECK): a bad launch raises here, naming the kernel, instead of
// surfacing later as a wrong number or an error at some unrelated sync. Built into turbogs._C by
// cuda/build.py. Python-side semantics: turbogs/turbo/_cuda.py and _torch_impl.py.
// Narrow includes instead of <torch/extension.h>: the same Tensor and pybind11 casters,
// at a third of the compile time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "turbo_kernels.h"

namespace {

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
}

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

void memory_update(at::Tensor errors, int64_t view, int64_t num_tiles, at::Tensor tile_ids, at::Tensor tile_errors,
                   double decay) {
    check_tensor(errors, "errors", at::kFloat);
    check_tensor(tile_ids, "tile_ids", at::kLong);
    check_tensor(tile_errors, "tile_errors", at::kFloat);
    TORCH_CHECK(errors.dim() == 2, "errors must be [V, T_max]");
    TORCH_CHECK(view >= 0 && view < errors.size(0), "view ", view, " out of range");
    TORCH_CHECK(num_tiles <= errors.size(1), "num_tiles exceeds T_max");
    TORCH_CHECK(tile_ids.numel() == tile_errors.numel(), "tile_ids and tile_errors differ in length");
    const c10::cuda::CUDAGuard guard(errors.device());
    turbogs::launch_memory_update(errors.data_ptr<float>() + view * errors.size(1), num_tiles,
                                  tile_ids.data_ptr<int64_t>(), tile_errors.data_ptr<float>(), tile_ids.numel(),
                                  (float)decay, current_stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor view_sample_keys(at::Tensor errors, at::Tensor tile_counts, double view_floor, at::Tensor uniforms) {
    check_tensor(errors, "errors", at::kFloat);
    check_tensor(tile_counts, "tile_counts", at::kLong);
    check_tensor(uniforms, "uniforms", at::kFloat);
    TORCH_CHECK(errors.dim() == 2, "errors must be [V, T_max]");
    const int64_t num_views = errors.size(0);
    TORCH_CHECK(tile_counts.numel() == num_views && uniforms.numel() == num_views,
                "tile_counts and uniforms must have one entry per view");
    const c10::cuda::CUDAGuard guard(errors.device());
    at::Tensor scratch = at::empty({2 * num_views}, errors.options());
    at::Tensor keys = at::empty({num_views}, errors.options());
    turbogs::launch_view_sample_keys(errors.data_ptr<float>(), tile_counts.data_ptr<int64_t>(), num_views,
                                     errors.size(1), (float)view_floor, uniforms.data_ptr<float>(),
                                     scratch.data_ptr<float>(), keys.data_ptr<float>(), current_stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return keys;
}

at::Tensor tile_sample_keys(at::Tensor errors_row, double gamma, double tile_floor, at::Tensor uniforms) {
    check_tensor(errors_row, "errors_row", at::kFloat);
    check_tensor(uniforms, "uniforms", at::kFloat);
    TORCH_CHECK(uniforms.numel() == errors_row.numel(), "one uniform per tile is needed");
    const c10::cuda::CUDAGuard guard(errors_row.device());
    at::Tensor keys = at::empty({errors_row.numel()}, errors_row.options());
    turbogs::launch_tile_sample_keys(errors_row.data_ptr<float>(), errors_row.numel(), (float)gamma,
                                     (float)tile_floor, uniforms.data_ptr<float>(), keys.data_ptr<float>(),
                                     current_stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return keys;
}

struct LossInputs {
    const float* mask;
    turbogs::TileLossParams params;
};

LossInputs check_loss_inputs(const at::Tensor& render, const at::Tensor& gt, const std::optional<at::Tensor>& mask,
                             const at::Tensor& tile_ids, int64_t tile_size, int64_t ssim_patch, int64_t ncc_patch,
                             double lambda_ssim, double lambda_ncc, double ncc_eps, double ncc_std_ref,
                             double ssim_c1, double ssim_c2) {
    check_tensor(render, "render", at::kFloat);
    check_tensor(gt, "gt", at::kFloat);
    check_tensor(tile_ids, "tile_ids", at::kLong);
    TORCH_CHECK(render.dim() == 3 && render.size(2) == 3, "render must be [H, W, 3]");
    TORCH_CHECK(gt.sizes() == render.sizes(), "gt must have the shape of render");
    const bool pow2 = tile_size > 0 && (tile_size & (tile_size - 1)) == 0;
    TORCH_CHECK(pow2 && tile_size >= 2 && tile_size <= 32, "tile_size must be a power of two in 2..32");
    for (int64_t patch : {ssim_patch, ncc_patch}) {
        TORCH_CHECK(patch > 0 && (patch & (patch - 1)) == 0 && patch <= tile_size,
                    "patch sizes must be powers of two <= tile_size");
    }
    const float* mask_ptr = nullptr;
    if (mask.has_value() && mask->defined()) {
        check_tensor(*mask, "mask", at::kFloat);
        TORCH_CHECK(mask->dim() == 2 && mask->size(0) == render.size(0) && mask->size(1) == render.size(1),
                    "mask must be [H, W]");
        mask_ptr = mask->data_ptr<float>();
    }
    turbogs::TileLossParams params{(int)render.size(0), (int)render.size(1), (int)tile_size, (int)ssim_patch,
                                   (int)ncc_patch, (float)lambda_ssim, (float)lambda_ncc, (float)ncc_eps,
                                   (float)ncc_std_ref, (float)ssim_c1, (float)ssim_c2};
    return {mask_ptr, params};
}

// Returns (tile_loss [K], tile_weight [K]).
std::vector<at::Tensor> tile_loss_forward(at::Tensor render, at::Tensor gt, std::optional<at::Tensor> mask,
                                          at::Tensor tile_ids, int64_t tile_size, int64_t ssim_patch,
                                          int64_t ncc_patch, double lambda_ssim, double lambda_ncc, double ncc_eps,
                                          double ncc_std_ref, double ssim_c1, double ssim_c2) {
    const LossInputs in = check_loss_inputs(render, gt, mask, tile_ids, tile_size, ssim_patch, ncc_patch,
                                            lambda_ssim, lambda_ncc, ncc_eps, ncc_std_ref, ssim_c1, ssim_c2);
    const c10::cuda::CUDAGuard guard(render.device());
    const int64_t k = tile_ids.numel();
    at::Tensor tile_loss = at::zeros({k}, render.options());
    at::Tensor tile_weight = at::zeros({k}, render.options());
    turbogs::launch_tile_loss_forward(render.data_ptr<float>(), gt.data_ptr<float>(), in.mask,
                                      tile_ids.data_ptr<int64_t>(), k, in.params, tile_loss.data_ptr<float>(),
                                      tile_weight.data_ptr<float>(), current_stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {tile_loss, tile_weight};
}

// Returns grad_render [H, W, 3]: sum_i tile_scale[i] * dL_i / d render.
at::Tensor tile_loss_backward(at::Tensor render, at::Tensor gt, std::optional<at::Tensor> mask, at::Tensor tile_ids,
                              at::Tensor tile_scale, int64_t tile_size, int64_t ssim_patch, int64_t ncc_patch,
                              double lambda_ssim, double lambda_ncc, double ncc_eps, double ncc_std_ref,
                              double ssim_c1, double ssim_c2) {
    const LossInputs in = check_loss_inputs(render, gt, mask, tile_ids, tile_size, ssim_patch, ncc_patch,
                                            lambda_ssim, lambda_ncc, ncc_eps, ncc_std_ref, ssim_c1, ssim_c2);
    check_tensor(tile_scale, "tile_scale", at::kFloat);
    TORCH_CHECK(tile_scale.numel() == tile_ids.numel(), "one tile_scale per tile is needed");
    const c10::cuda::CUDAGuard guard(render.device());
    at::Tensor grad = at::zeros_like(render);
    turbogs::launch_tile_loss_backward(render.data_ptr<float>(), gt.data_ptr<float>(), in.mask,
                                       tile_ids.data_ptr<int64_t>(), tile_ids.numel(), in.params,
                                       tile_scale.data_ptr<float>(), grad.data_ptr<float>(), current_stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return grad;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "TurboGS CUDA kernels: error memory, tile sampling keys, sparse tile loss";
    m.def("memory_update", &memory_update, "In-place EMA update of one view's tile errors");
    m.def("view_sample_keys", &view_sample_keys, "Gumbel keys for the view draw");
    m.def("tile_sample_keys", &tile_sample_keys, "Gumbel keys for the tile draw");
    m.def("tile_loss_forward", &tile_loss_forward, "Per-tile loss and counted-pixel weight");
    m.def("tile_loss_backward", &tile_loss_backward, "Gradient of the weighted tile losses wrt render");
}
