// SPDX-License-Identifier: MIT
// Device and policy resolution (device.h).
#include "train/device.h"

#include <mpx/config.hpp>

#include <fmt/format.h>

#include "nn/model.h"

namespace mpx {

ResolvedDevice resolve_device(const std::string& device) {
  if (device == "auto") {
    const int n = cuda_device_count();
    if (n > 0) {
      try {
        auto b = create_backend("cuda:0");
        return {"cuda:0", fmt::format("device auto: {} CUDA device{} present, using cuda:0 ({})", n,
                                      n == 1 ? "" : "s", b->info().description)};
      } catch (const std::exception& e) {
        return {"cpu", fmt::format("device auto: a CUDA device is present but the CUDA backend did not start "
                                   "({}); using the CPU",
                                   e.what())};
      }
    }
#if MPX_WITH_CUDA
    return {"cpu", "device auto: no CUDA device found, using the CPU"};
#else
    return {"cpu", "device auto: this mpx was built without CUDA, using the CPU"};
#endif
  }
  if (device == "cuda") return {"cuda:0", "device cuda: using cuda:0"};
  return {device, "device " + device + " (from the config or --set)"};
}

Policy resolve_policy(Policy p, const DeviceInfo& dev, std::string* reason) {
  auto say = [&](const std::string& s) {
    if (reason) *reason = s;
  };
  if (p != Policy::Auto) {
    say(fmt::format("policy {} (from the config or --set)", policy_name(p)));
    return p;
  }
  if (dev.known_gpu()) {
    const int cc = dev.compute_capability;
    if (dev.bf16_tensor_cores()) {
      say(fmt::format("policy auto -> mixed_bfloat16: {} has compute capability {}.{} (native bfloat16 Tensor Cores)",
                      dev.name, cc / 10, cc % 10));
      return Policy::MixedBFloat16;
    }
    if (dev.f16_tensor_cores()) {
      say(fmt::format("policy auto -> mixed_float16: {} has compute capability {}.{} (float16 Tensor Cores, "
                      "no bfloat16)",
                      dev.name, cc / 10, cc % 10));
      return Policy::MixedFloat16;
    }
    say(fmt::format("policy auto -> float32: {} has compute capability {}.{} (no Tensor Cores)", dev.name, cc / 10,
                    cc % 10));
    return Policy::Float32;
  }
  // The CPU backend's own path (docs/precision.md, "16-bit arithmetic on the CPU"): it
  // follows oneDNN's ISA limit and MPX_CPU_16BIT, as the training's ops will.
  if (dev.native_bf16) {
    say("policy auto -> mixed_bfloat16: the CPU runs bfloat16 natively (" + dev.math_bf16 +
        "; oneDNN's bfloat16 kernels beat float32)");
    return Policy::MixedBFloat16;
  }
  say("policy auto -> float32: bfloat16 math on this CPU is " +
      (dev.math_bf16.empty() ? std::string("widened to float32") : dev.math_bf16) +
      ", slower than float32 on most nets");
  return Policy::Float32;
}

namespace {

const LayerConfig* last_layer(const std::vector<LayerConfig>& layers) {
  if (layers.empty()) return nullptr;
  const LayerConfig& l = layers.back();
  if (l.type == LayerType::Residual) return last_layer(l.layers);
  return &l;
}

}  // namespace

std::vector<std::string> precision_warnings(const Config& cfg, Policy resolved, bool auto_fell_back) {
  std::vector<std::string> w;
  const LossScaleMode mode = effective_loss_scale_mode(cfg.loss_scale, resolved);
  if (resolved == Policy::MixedFloat16 && mode == LossScaleMode::None) {
    w.push_back("policy mixed_float16 with loss_scale.mode none: gradients below 2^-24 flush to zero in float16 "
                "and the model may stop learning; use loss_scale.mode dynamic (the default for mixed_float16)");
  }
  if (const LayerConfig* last = last_layer(cfg.model.layers)) {
    if (last->activation == ActivationName::Softmax) {
      const DType dt = compute_dtype_for(resolved, last->dtype);
      if (is_16bit(dt)) {
        w.push_back(fmt::format(
            "the output layer '{}' computes in {} and has a softmax: mpx fuses the softmax into the float32 loss, "
            "but its logits are rounded to {} first (Keras: put the output layer in float32 with dtype: float32)",
            last->name.empty() ? std::string(enum_name(last->type)) : last->name, dtype_name(dt), dtype_name(dt)));
      }
    }
  }
  if (cfg.loss_scale.mode_explicit && mode != LossScaleMode::None && resolved != Policy::MixedFloat16) {
    w.push_back(fmt::format("loss_scale.mode {} under policy {}: {} has float32's exponent range and needs no loss "
                            "scaling; it only costs time (use loss_scale.mode none)",
                            loss_scale_mode_name(mode), policy_name(resolved),
                            resolved == Policy::MixedBFloat16 ? "bfloat16" : "float32"));
  }
  if (auto_fell_back) {
    w.push_back("policy auto resolved to float32: this device has no fast 16-bit math, so training runs in float32 "
                "(set policy: mixed_float16 or mixed_bfloat16 to force mixed precision, e.g. to test numerics)");
  }
  return w;
}

LossScaleMode effective_loss_scale_mode(const LossScaleConfig& c, Policy resolved) {
  if (c.mode_explicit) return c.mode;
  return resolved == Policy::MixedFloat16 ? LossScaleMode::Dynamic : LossScaleMode::None;
}

}  // namespace mpx
