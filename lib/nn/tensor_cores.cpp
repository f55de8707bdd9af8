// SPDX-License-Identifier: MIT
// tensor_core_warnings(): the Tensor Core checks of `mpx validate` (NVIDIA's
// "Tensor Core requirements": fp16/bf16 GEMM and convolution dimensions that are
// multiples of 8 elements).
#include "nn/tensor_cores.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/dtype.h"

namespace mpx {

namespace {

bool multiple_of_8(int64_t v) { return v % 8 == 0; }
int64_t round_up_8(int64_t v) { return (v + 7) / 8 * 8; }

/// "under mixed_bfloat16" when the layer follows the policy, else "as bfloat16 (its dtype)".
std::string under(Policy p, DType t) {
  const bool from_policy = (p == Policy::MixedFloat16 && t == DType::F16) || (p == Policy::MixedBFloat16 && t == DType::BF16);
  return from_policy ? std::string("under ") + policy_name(p) : fmt::format("as {} (its dtype)", dtype_name(t));
}

}  // namespace

std::vector<std::string> tensor_core_warnings(const Model& model, int64_t batch_size, int cc) {
  std::vector<std::string> out;
  const std::vector<LayerInfo> infos = model.layer_infos();
  const Policy policy = model.policy();

  std::vector<const LayerInfo*> half;  // 16-bit layers
  bool any_bf16 = false;
  for (const LayerInfo& i : infos) {
    if (!is_16bit(i.compute_dtype)) continue;
    half.push_back(&i);
    any_bf16 = any_bf16 || i.compute_dtype == DType::BF16;
  }
  if (half.empty()) return out;

  const std::string who = policy == Policy::MixedFloat16 || policy == Policy::MixedBFloat16
                              ? fmt::format("policy {}", policy_name(policy))
                              : fmt::format("{} layer{} computing in 16 bits (e.g. '{}')", half.size(),
                                            half.size() == 1 ? "" : "s", half.front()->name);
  const DeviceInfo gpu = DeviceInfo::with_cc(cc);
  if (gpu.known_gpu() && !gpu.f16_tensor_cores()) {
    out.push_back(fmt::format(
        "{}: the GPU (compute capability {}.{}) has no Tensor Cores (they need 7.0 or newer): 16-bit layers run no "
        "faster than float32 there and pay the casts; use policy: float32 (what policy: auto picks on this GPU)",
        who, cc / 10, cc % 10));
    return out;
  }
  const bool no_bf16_cores = gpu.known_gpu() && !gpu.bf16_tensor_cores() && any_bf16;
  if (no_bf16_cores)
    out.push_back(fmt::format(
        "{}: the GPU (compute capability {}.{}) has no bfloat16 Tensor Cores (they need 8.0 or newer): bfloat16 "
        "layers will not use Tensor Cores; use policy: mixed_float16 (with dynamic loss scaling) on this GPU",
        who, cc / 10, cc % 10));

  const Shape model_in = infos.front().input_shape;
  for (const LayerInfo* i : half) {
    if (no_bf16_cores && i->compute_dtype == DType::BF16) continue;
    const std::string idle = "Tensor Cores idle for this layer " + under(policy, i->compute_dtype);
    if (i->type == LayerType::Conv2d && i->input_shape.rank == 3 && i->output_shape.rank == 3) {
      const int64_t cin = i->input_shape[2], k = i->output_shape[2];
      if (!multiple_of_8(cin)) {
        if (i->input_shape == model_in && cin < 8)
          out.push_back(fmt::format(
              "conv2d '{}': {} input channel{} (not a multiple of 8): {}; expected for the first layer on "
              "{}-channel image input and usually a small share of the step (pad the input to 8 channels only if "
              "the profile says this layer matters)",
              i->name, cin, cin == 1 ? "" : "s", idle, cin));
        else
          out.push_back(fmt::format(
              "conv2d '{}': {} input channels (not a multiple of 8): {}; make the layer before it output a "
              "multiple of 8 channels (e.g. {})",
              i->name, cin, idle, round_up_8(cin)));
      }
      if (!multiple_of_8(k))
        out.push_back(fmt::format("conv2d '{}': {} filters (not a multiple of 8): {}; use filters: {}", i->name, k,
                                  idle, round_up_8(k)));
    } else if (i->type == LayerType::Dense && i->input_shape.rank == 1 && i->output_shape.rank == 1) {
      const int64_t fin = i->input_shape[0], units = i->output_shape[0];
      if (!multiple_of_8(fin))
        out.push_back(fmt::format(
            "dense '{}': {} input features (not a multiple of 8): {}; make the layer before it output a multiple "
            "of 8 (e.g. {})",
            i->name, fin, idle, round_up_8(fin)));
      if (!multiple_of_8(units)) {
        if (units == model.num_classes() && i == &infos.back())
          out.push_back(fmt::format(
              "dense '{}': {} units (not a multiple of 8): {}; this is the output layer (units = classes): give it "
              "dtype: float32 (a small layer, and float32 logits are what the Keras guides recommend)",
              i->name, units, idle));
        else
          out.push_back(fmt::format("dense '{}': {} units (not a multiple of 8): {}; use units: {}", i->name, units,
                                    idle, round_up_8(units)));
      }
    }
  }

  // The batch matters only where some 16-bit layer can use Tensor Cores at all.
  const bool any_on_cores = !no_bf16_cores || std::any_of(half.begin(), half.end(), [](const LayerInfo* i) {
    return i->compute_dtype == DType::F16;
  });
  if (any_on_cores && !multiple_of_8(batch_size)) {
    const int64_t down = batch_size / 8 * 8, up = round_up_8(batch_size);
    out.push_back(fmt::format(
        "batch size {} (not a multiple of 8): Tensor Cores idle in the 16-bit layers' batch dimension; use "
        "data.batch_size: {}{} (per rank under mpirun: the global batch divided by the number of ranks)",
        batch_size, up, down > 0 ? fmt::format(" or {}", down) : ""));
  }
  return out;
}

}  // namespace mpx
