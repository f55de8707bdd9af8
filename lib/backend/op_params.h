// SPDX-License-Identifier: MIT
// The plain-data arguments of the Backend ops (backend.h): convolution and
// pooling geometry, one optimizer step's hyper-parameters, the device-resident
// step state and the loss-scale rule, tensor statistics.
#pragma once

#include <cstdint>

#include "core/optimizer_kind.h"

namespace mpx {

/// Convolution geometry. x: [N, H, W, C]; w: [K, R, S, C] (cuDNN's NHWC filter
/// layout, "KRSC"); y: [N, P, Q, K]. Padding may be asymmetric (Keras "same"
/// with an even kernel pads more at the bottom/right).
struct Conv2dParams {
  int R = 1, S = 1;            // filter height, width
  int stride_h = 1, stride_w = 1;
  int pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int out_h(int H) const { return (H + pad_top + pad_bottom - R) / stride_h + 1; }
  int out_w(int W) const { return (W + pad_left + pad_right - S) / stride_w + 1; }
};

enum class PoolKind : uint8_t { Max, Avg };

/// Pooling geometry, NHWC. Avg pooling excludes padding from the divisor (Keras).
struct PoolParams {
  PoolKind kind = PoolKind::Max;
  int R = 2, S = 2;
  int stride_h = 2, stride_w = 2;
  int pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int out_h(int H) const { return (H + pad_top + pad_bottom - R) / stride_h + 1; }
  int out_w(int W) const { return (W + pad_left + pad_right - S) / stride_w + 1; }
};

/// Hyper-parameters of one fused optimizer pass over a flat arena. The optimizers and their
/// state arenas are declared in core/optimizer_kind.h.
struct OptimizerStep {
  using Kind = OptimizerKind;
  Kind kind = Kind::Adam;
  float lr = 1e-3f;
  float momentum = 0.0f;  // SGD
  bool nesterov = false;  // SGD
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-7f;  // Adam/AdamW (Keras epsilon)
  /// SGD/Adam: L2 added to the gradient (g += wd * w); AdamW: decoupled (w -= lr * wd * w).
  float weight_decay = 0.0f;
  /// Adam's bias-correction step of this update: 1 for the first step, counting skipped steps
  /// too (Keras 2's optimizer.iterations + 1; docs/precision.md).
  int64_t t = 1;
  /// optimizer_step_state only: the device's lr is multiplied by this (a parameter group's
  /// multiplier, docs/fast-cifar.md "Parameter groups"; 1 leaves its bits unchanged).
  float lr_scale = 1.0f;
};

/// Device-resident bookkeeping of the training step (see Backend::loss_scale_update_state).
/// Plain data, the same layout on every backend; read back with Backend::download.
struct StepState {
  double scale = 1.0;               // loss scale S of the next step
  int64_t good_steps = 0;           // LossScalerState fields, same meaning
  int64_t skipped_total = 0;
  int64_t consecutive_skips = 0;
  int64_t applied_total = 0;        // optimizer iterations so far, skipped steps included (Adam t of the next = this + 1)
  int32_t finite = 1;               // verdict of the last unscale_and_check_state
  int32_t last_skip_reason = 0;     // SkipReason (2 nonfinite_loss, 3 backward_overflow)
  int32_t bad = 0;                  // scratch flag of unscale_and_check_state
  int32_t pad = 0;
  // The log window, reset by the host after each read.
  double loss_sum = 0, correct = 0; // over steps whose loss was finite
  int64_t counted = 0;              // records of those steps
  int64_t steps = 0, skipped = 0, nonfinite_loss_steps = 0;
  int64_t max_consecutive_skips = 0;  // largest run of consecutive skips in the window
};
static_assert(sizeof(StepState) == 112, "StepState layout is shared with device code");

/// The loss-scaler rule for loss_scale_update_state (LossScaler, Keras 2).
struct LossScaleRule {
  enum class Mode : uint8_t { None, Fixed, Dynamic } mode = Mode::Dynamic;
  int64_t growth_interval = 2000;
  double growth_factor = 2.0, backoff_factor = 0.5, min_scale = 1.0;
};

/// What the moving variance of batch norm takes of the biased batch variance over `rows`
/// (N H W or N) values per channel: rows / (rows - 1) for a 4-D [N,H,W,C] input (Bessel's
/// correction, as tf-keras 2's fused batch norm), 1 for a 2-D [N,C] input (its non-fused
/// path) and for a single row. Both backends apply it (docs/keras-parity.md).
inline double bn_moving_variance_factor(int rank, int64_t rows) {
  return rank == 4 && rows > 1 ? static_cast<double>(rows) / static_cast<double>(rows - 1) : 1.0;
}

/// Statistics of one tensor, for check_numerics and `mpx inspect`.
struct TensorStats {
  double min = 0, max = 0, mean_abs = 0;  // over finite values
  int64_t n_inf = 0, n_nan = 0, n_zero = 0, count = 0;
  bool all_finite() const { return n_inf == 0 && n_nan == 0; }
};

}  // namespace mpx
