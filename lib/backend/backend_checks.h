// SPDX-License-Identifier: MIT
// Internal to lib/backend: the argument checks of the public Backend ops
// (backend.cpp, backend_ops.cpp, op_table.inc), each naming the op, the tensor and what it expected.
#pragma once

#include <fmt/format.h>

#include <string>

#include "backend/backend.h"
#include "core/error.h"

namespace mpx::backend_checks {



inline std::string dims(const Tensor& t) { return t.empty() ? std::string("(empty)") : t.str(); }

// Throws with the op name and a message; the tensors' strings go in the message.
#define MPX_VALIDATE(cond, ...) MPX_CHECK_MSG(cond, fmt::format(__VA_ARGS__))

inline void require_data(const char* op, const char* name, const Tensor& t) {
  MPX_VALIDATE(!t.empty() || t.numel() == 0, "{}: {} {} has no data", op, name, dims(t));
}

inline void require_float(const char* op, const char* name, const Tensor& t) {
  require_data(op, name, t);
  MPX_VALIDATE(is_float(t.dtype), "{}: {} must be float32, float16 or bfloat16, got {}", op, name, t.str());
}

inline void require_f32(const char* op, const char* name, const Tensor& t) {
  require_data(op, name, t);
  MPX_VALIDATE(t.dtype == DType::F32, "{}: {} must be float32, got {}", op, name, t.str());
}

inline void require_rank(const char* op, const char* name, const Tensor& t, int rank) {
  MPX_VALIDATE(t.shape.rank == rank, "{}: {} must have rank {} ({}), got {}", op, name, rank,
               rank == 4 ? "NHWC" : rank == 2 ? "[N, C]" : "vector", t.str());
}

inline void require_same_dtype(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  MPX_VALIDATE(a.dtype == b.dtype, "{}: {} {} and {} {} must have the same dtype", op, an, a.str(), bn, b.str());
}

inline void require_same_shape(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  MPX_VALIDATE(a.shape == b.shape, "{}: {} {} and {} {} must have the same shape", op, an, a.str(), bn, b.str());
}

inline void require_same_numel(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  MPX_VALIDATE(a.numel() == b.numel(), "{}: {} {} and {} {} must have the same number of elements", op, an,
               a.str(), bn, b.str());
}

inline void require_shape(const char* op, const char* name, const Tensor& t, Shape s) {
  MPX_VALIDATE(t.shape == s, "{}: {} must have shape {}, got {}", op, name, s.str(), t.str());
}

// A vector of C elements: [C] (rank 1).
inline void require_vector(const char* op, const char* name, const Tensor& t, int64_t c) {
  MPX_VALIDATE(t.numel() == c && t.shape.rank >= 1, "{}: {} must have {} elements ([{}]), got {}", op, name, c, c,
               t.str());
}

// Weight-gradient outputs: float32 or the compute dtype.
inline void require_grad_dtype(const char* op, const char* name, const Tensor& g, DType compute) {
  MPX_VALIDATE(g.dtype == DType::F32 || g.dtype == compute, "{}: {} must be float32 or {}, got {}", op, name,
               dtype_name(compute), g.str());
}

/// A float32 layer's tensor `t` that may be its 16-bit input (or input gradient) as it
/// is: the input cast folded into the op (docs/design.md, "The op table"). `t` has
/// `compute`, or is 16-bit when `compute` is float32.
inline void require_layer_input(const char* op, const char* name, const Tensor& t, const char* cn, DType compute) {
  MPX_VALIDATE(t.dtype == compute || (compute == DType::F32 && is_16bit(t.dtype)),
               "{}: {} {} must have the dtype of {} ({}), or be 16-bit with {} float32", op, name, t.str(), cn,
               dtype_name(compute), cn);
}

inline void check_conv_params(const char* op, const Conv2dParams& p) {
  MPX_VALIDATE(p.R > 0 && p.S > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_top >= 0 && p.pad_left >= 0 &&
                   p.pad_bottom >= 0 && p.pad_right >= 0,
               "{}: bad geometry R={} S={} stride={}x{} pad t/l/b/r={}/{}/{}/{}", op, p.R, p.S, p.stride_h,
               p.stride_w, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right);
}

/// How a convolution's filters see the input channels: every one (w [K,R,S,C]), or one
/// channel each (depthwise: w [C*M,R,S,1], filter k reads channel k / M).
enum class ConvFilters { Dense, Depthwise };

// x [N,H,W,C], w as `filters` says, y [N,P,Q,K] (K = w.shape[0]): all shapes consistent with p.
inline void check_conv_shapes(const char* op, const Conv2dParams& p, const Tensor& x, const char* xn, const Tensor& w,
                              const Tensor& y, const char* yn, ConvFilters filters = ConvFilters::Dense) {
  check_conv_params(op, p);
  require_rank(op, xn, x, 4);
  require_rank(op, "w", w, 4);
  require_rank(op, yn, y, 4);
  if (filters == ConvFilters::Dense) {
    MPX_VALIDATE(w.shape[1] == p.R && w.shape[2] == p.S,
                 "{}: w {} must be [K, R, S, C] with R={} S={} from the geometry", op, w.str(), p.R, p.S);
    MPX_VALIDATE(x.shape[3] == w.shape[3], "{}: {} {} and w {} disagree on C", op, xn, x.str(), w.str());
  } else {
    MPX_VALIDATE(w.shape[1] == p.R && w.shape[2] == p.S && w.shape[3] == 1,
                 "{}: w {} must be [C*M, R, S, 1] with R={} S={} from the geometry", op, w.str(), p.R, p.S);
    const int64_t C = x.shape[3];
    MPX_VALIDATE(C > 0 && w.shape[0] > 0 && w.shape[0] % C == 0,
                 "{}: w {} must have a multiple of the {} channels of {} {} filters (C*M)", op, w.str(), C, xn,
                 x.str());
  }
  const int P = p.out_h(static_cast<int>(x.shape[1])), Q = p.out_w(static_cast<int>(x.shape[2]));
  MPX_VALIDATE(P > 0 && Q > 0, "{}: {} {} is smaller than the {}x{} filter with this padding", op, xn, x.str(), p.R,
               p.S);
  const Shape ys{x.shape[0], P, Q, w.shape[0]};
  MPX_VALIDATE(y.shape == ys, "{}: {} must be {} for {} and w {} (R={} S={} stride {}x{} pad t/l/b/r {}/{}/{}/{}), got {}",
               op, yn, ys.str(), x.str(), w.str(), p.R, p.S, p.stride_h, p.stride_w, p.pad_top, p.pad_left,
               p.pad_bottom, p.pad_right, y.str());
}

inline void check_pool_shapes(const char* op, const PoolParams& p, const Tensor& x, const Tensor& y) {
  MPX_VALIDATE(p.R > 0 && p.S > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_top >= 0 && p.pad_left >= 0 &&
                   p.pad_bottom >= 0 && p.pad_right >= 0 && p.pad_top < p.R && p.pad_bottom < p.R &&
                   p.pad_left < p.S && p.pad_right < p.S,
               "{}: bad pooling geometry {}x{} stride {}x{} pad t/l/b/r {}/{}/{}/{} (padding must be < window)", op,
               p.R, p.S, p.stride_h, p.stride_w, p.pad_top, p.pad_left, p.pad_bottom, p.pad_right);
  require_rank(op, "x", x, 4);
  require_rank(op, "y", y, 4);
  require_float(op, "x", x);
  require_same_dtype(op, "x", x, "y", y);
  const int P = p.out_h(static_cast<int>(x.shape[1])), Q = p.out_w(static_cast<int>(x.shape[2]));
  const Shape ys{x.shape[0], P, Q, x.shape[3]};
  MPX_VALIDATE(P > 0 && Q > 0 && y.shape == ys, "{}: y must be {} for x {} ({}x{} window, stride {}x{}), got {}",
               op, ys.str(), x.str(), p.R, p.S, p.stride_h, p.stride_w, y.str());
}

// Dense: x [N, Cin] (or any rank with N leading), w [Cout, Cin], y [N, Cout].
inline void check_dense_shapes(const char* op, const Tensor& x, const char* xn, const Tensor& w, const Tensor& y,
                        const char* yn) {
  require_rank(op, "w", w, 2);
  require_rank(op, yn, y, 2);
  MPX_VALIDATE(x.shape.rank >= 2, "{}: {} must be [N, Cin], got {}", op, xn, x.str());
  const int64_t n = x.shape[0];
  MPX_VALIDATE(n > 0 && x.numel() == n * w.shape[1], "{}: {} {} and w {} disagree on Cin (w is [Cout, Cin])", op,
               xn, x.str(), w.str());
  const Shape ys{n, w.shape[0]};
  MPX_VALIDATE(y.shape == ys, "{}: {} must be {} for {} and w {}, got {}", op, yn, ys.str(), x.str(), w.str(),
               y.str());
}

// The activation's parameter (the backward of leaky_relu from its output needs slope >= 0),
// and the optional pre-activation output of a fused layer: y's dtype and shape, not y itself.
inline void check_activation(const char* op, Activation act) {
  MPX_VALIDATE(act.kind != ActKind::LeakyRelu || (std::isfinite(act.alpha) && act.alpha >= 0.0f),
               "{}: leaky_relu needs a finite negative slope >= 0, got {}", op, act.alpha);
}
inline void check_pre(const char* op, const Tensor& pre, const Tensor& y) {
  if (pre.empty()) return;
  require_same_dtype(op, "y", y, "pre", pre);
  require_same_shape(op, "y", y, "pre", pre);
  MPX_VALIDATE(pre.data != y.data, "{}: pre must not alias y", op);
}

inline void check_bias(const char* op, const Tensor& bias, int64_t k, DType compute) {
  if (bias.empty()) return;
  require_vector(op, "bias", bias, k);
  MPX_VALIDATE(bias.dtype == DType::F32 || bias.dtype == compute, "{}: bias must be float32 or {}, got {}", op,
               dtype_name(compute), bias.str());
}

// Batch normalization: x [N, H, W, C] or [N, C] has C channels; its parameters and statistics
// are float32 [C].
inline int64_t bn_channels(const char* op, const Tensor& x) {
  MPX_VALIDATE(x.shape.rank == 4 || x.shape.rank == 2, "{}: x must be [N, H, W, C] or [N, C], got {}", op,
               x.str());
  return x.shape[x.shape.rank - 1];
}
inline void require_bn_param(const char* op, const char* name, const Tensor& t, int64_t c) {
  require_f32(op, name, t);
  require_vector(op, name, t, c);
}

/// The arguments of softmax_cross_entropy and its scaled twin.
inline void require_softmax_args(const char* op, const Tensor& logits, const Tensor& labels, const Tensor& loss_sum_out,
                          const Tensor& correct_out, const Tensor& dlogits, float label_smoothing) {
  MPX_VALIDATE(label_smoothing >= 0.0f && label_smoothing < 1.0f, "{}: label_smoothing {} must be in [0, 1)", op,
               label_smoothing);
  require_f32(op, "logits", logits);
  require_rank(op, "logits", logits, 2);
  require_data(op, "labels", labels);
  MPX_VALIDATE(labels.dtype == DType::I32, "{}: labels must be int32, got {}", op, labels.str());
  MPX_VALIDATE(labels.numel() == logits.shape[0] && labels.shape.rank >= 1,
               "{}: labels {} must have one entry per row of logits {}", op, labels.str(), logits.str());
  MPX_VALIDATE(logits.shape[1] > 0, "{}: logits {} has no classes", op, logits.str());
  require_f32(op, "loss_sum_out", loss_sum_out);
  require_f32(op, "correct_out", correct_out);
  MPX_VALIDATE(loss_sum_out.numel() == 1 && correct_out.numel() == 1,
               "{}: loss_sum_out {} and correct_out {} must be float32 [1]", op, loss_sum_out.str(),
               correct_out.str());
  if (!dlogits.empty()) {
    require_f32(op, "dlogits", dlogits);
    require_same_shape(op, "logits", logits, "dlogits", dlogits);
  }
}
/// The arena arguments of optimizer_step and its device-state twin: the state arenas
/// core/optimizer_kind.h lists for the kind, each float32 and as long as master (SGD's
/// momentum may be empty without momentum), and none more.
inline void require_optimizer_args(const char* op, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                   const std::vector<Tensor>& states, const Tensor& compute_copy) {
  require_f32(op, "master", master);
  require_f32(op, "grads", grads);
  require_same_numel(op, "master", master, "grads", grads);
  const OptimizerInfo& k = optimizer_info(s.kind);
  const size_t want = static_cast<size_t>(k.num_arenas());
  const bool plain_sgd = s.kind == OptimizerKind::Sgd && s.momentum == 0.0f;
  for (size_t i = 0; i < states.size() || i < want; ++i) {
    const Tensor t = i < states.size() ? states[i] : Tensor();
    const std::string name = "state" + std::to_string(i + 1);
    if (i >= want) {
      MPX_VALIDATE(t.empty(), "{}: {} {} given, but {} keeps {} state arena(s)", op, name, t.str(), k.name, want);
      continue;
    }
    if (t.empty() && plain_sgd) continue;
    MPX_VALIDATE(!t.empty(), "{}: {} ({} {}) is required", op, name, k.name, k.arenas[i]);
    require_f32(op, name.c_str(), t);
    require_same_numel(op, "master", master, name.c_str(), t);
  }
  if (!compute_copy.empty()) {
    MPX_VALIDATE(is_float(compute_copy.dtype), "{}: compute_copy must be a float dtype, got {}", op,
                 compute_copy.str());
    require_same_numel(op, "master", master, "compute_copy", compute_copy);
  }
}

}  // namespace mpx::backend_checks
