// SPDX-License-Identifier: MIT
// Device and policy resolution: what `device: auto|cpu|cuda|cuda:N` and
// `policy: auto` become on this machine, the loss-scale mode a policy implies,
// and the start-up precision warnings of the Keras guides (docs/precision.md).
// Used by every command through Session, and by `mpx validate` and `mpx devices`.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"

namespace mpx {

/// @brief What `device: auto|cpu|cuda|cuda:N` resolves to here, and why.
struct ResolvedDevice {
  std::string device;  // "cpu" or "cuda:N"
  std::string reason;
};
ResolvedDevice resolve_device(const std::string& device);

/// @brief Resolves Policy::Auto from the device's capabilities (docs/precision.md
/// table); other policies are returned unchanged. `reason` says what was chosen and why.
Policy resolve_policy(Policy p, const DeviceInfo& dev, std::string* reason);

/// @brief The loss-scale mode in force: the configured one, else dynamic under
/// mixed_float16 and none otherwise.
LossScaleMode effective_loss_scale_mode(const LossScaleConfig& c, Policy resolved);

/// @brief Start-up warnings of the Keras guides for this config (mixed_float16
/// without loss scaling, 16-bit softmax output, loss scale under bf16/float32,
/// auto -> float32). Each is one line; the caller logs them at warn level.
std::vector<std::string> precision_warnings(const Config& cfg, Policy resolved, bool auto_fell_back);

}  // namespace mpx
