// SPDX-License-Identifier: MIT
// The public compute ops of Backend: the op table's (op_table.inc), and pooling with
// its argmax and the unscale-and-check pass, written out. Each validates its arguments
// once (backend_checks.h), then calls the backend's *_impl.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/backend_checks.h"
#include "core/error.h"

namespace mpx {

using namespace backend_checks;

// ---- the op table -------------------------------------------------------------
// Each op's public method: its checks (op_table.inc), then its NAME_impl when there is
// work to do.

#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...)             \
  void Backend::NAME PARAMS {                               \
    static constexpr const char* op = #NAME;                \
    const bool has_work = [&]() -> bool { __VA_ARGS__ }();  \
    if (has_work) NAME##_impl ARGS;                         \
  }
#include "backend/op_table.inc"

const std::vector<OpInfo>& backend_ops() {
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...) {#NAME, Op::GROUP},
  static const std::vector<OpInfo> ops = {
#include "backend/op_table.inc"
  };
  return ops;
}

// ---- pooling -----------------------------------------------------------------

bool Backend::max_pool_keeps_argmax(const PoolParams& p, const Shape& x) const {
  return p.kind == PoolKind::Max && max_pool_keeps_argmax_impl(p, x);
}

int64_t Backend::dense_input_piece_rows(int64_t features, int64_t units, DType t, DType x) const {
  return features > 0 && units > 0 ? std::max<int64_t>(0, dense_input_piece_rows_impl(features, units, t, x)) : 0;
}

int64_t Backend::max_pool_input_piece_rows(const PoolParams& p, const Shape& x, DType t) const {
  return p.kind == PoolKind::Max && x.rank == 4 ? std::max<int64_t>(0, max_pool_input_piece_rows_impl(p, x, t)) : 0;
}

bool Backend::conv2d_forward_in_pieces(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) const {
  return x.rank == 4 && w.rank == 4 && conv2d_forward_in_pieces_impl(p, x, w, t);
}

namespace {
/// An argmax tensor for y: uint8, y's shape, of a geometry whose argmax the backend keeps.
void check_argmax(const char* op, const Backend& be, const PoolParams& p, const Tensor& x, const Tensor& y,
                  const Tensor& argmax) {
  require_data(op, "argmax", argmax);
  MPX_VALIDATE(argmax.dtype == DType::U8, "{}: argmax must be uint8, got {}", op, dtype_name(argmax.dtype));
  require_same_shape(op, "y", y, "argmax", argmax);
  MPX_VALIDATE(be.max_pool_keeps_argmax(p, x.shape), "{}: this backend keeps no argmax for {}x{} {} pooling of x {}",
               op, p.R, p.S, p.kind == PoolKind::Max ? "max" : "average", x.str());
}
}  // namespace

void Backend::pool_forward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& argmax) {
  check_pool_shapes("pool_forward", p, x, y);
  if (!argmax.empty()) check_argmax("pool_forward", *this, p, x, y, argmax);
  if (y.numel() == 0) return;
  if (argmax.empty())
    pool_forward_impl(p, x, y);
  else
    max_pool_forward_argmax_impl(p, x, y, argmax);
}

void Backend::max_pool_forward_argmax_impl(const PoolParams&, const Tensor&, const Tensor&, const Tensor&) {
  MPX_VALIDATE(false, "pool_forward: this backend keeps no max-pooling argmax");
}

void Backend::max_pool_backward_argmax_impl(const PoolParams&, const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, bool) {
  MPX_VALIDATE(false, "pool_backward: this backend keeps no max-pooling argmax");
}

namespace {
/// The arguments of a pooling backward op: x/y as the forward's, dy like y, dx like x.
void check_pool_backward(const char* op, const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                         const Tensor& dx) {
  check_pool_shapes(op, p, x, y);
  require_data(op, "dy", dy);
  require_data(op, "dx", dx);
  require_same_dtype(op, "x", x, "dy", dy);
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "y", y, "dy", dy);
  require_same_shape(op, "x", x, "dx", dx);
}
}  // namespace

void Backend::pool_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                            const Tensor& dx, const Tensor& argmax) {
  check_pool_backward("pool_backward", p, x, y, dy, dx);
  if (!argmax.empty()) check_argmax("pool_backward", *this, p, x, y, argmax);
  if (dx.numel() == 0) return;
  if (argmax.empty())
    pool_backward_impl(p, x, y, dy, dx);
  else
    max_pool_backward_argmax_impl(p, y, argmax, dy, dx, false);
}

void Backend::max_pool_relu_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& dx, const Tensor& argmax) {
  const char* op = "max_pool_relu_backward";
  MPX_VALIDATE(p.kind == PoolKind::Max, "{}: needs max pooling, got average", op);
  check_pool_backward(op, p, x, y, dy, dx);
  if (!argmax.empty()) check_argmax(op, *this, p, x, y, argmax);
  if (dx.numel() == 0) return;
  if (argmax.empty())
    max_pool_relu_backward_impl(p, x, y, dy, dx);
  else
    max_pool_backward_argmax_impl(p, y, argmax, dy, dx, true);
}

void Backend::max_pool_relu_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                          const Tensor& dx) {
  pool_backward_impl(p, x, y, dy, dx);
  activation_backward_impl(Activation::Relu, x, dx, dx);
}

void Backend::max_pool_conv_backward(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                     const Tensor& dx, const Tensor& argmax, const Conv2dParams& cp,
                                     const Tensor& conv_x, const Tensor& conv_dw, const Tensor& conv_db) {
  const char* op = "max_pool_conv_backward";
  MPX_VALIDATE(p.kind == PoolKind::Max, "{}: needs max pooling, got average", op);
  check_pool_backward(op, p, x, y, dy, dx);
  if (!argmax.empty()) check_argmax(op, *this, p, x, y, argmax);
  require_float(op, "conv_x", conv_x);
  require_data(op, "conv_dw", conv_dw);
  require_same_dtype(op, "x", x, "conv_x", conv_x);
  require_grad_dtype(op, "conv_dw", conv_dw, conv_x.dtype);
  check_conv_shapes(op, cp, conv_x, "conv_x", conv_dw, x, "x");
  if (!conv_db.empty()) {
    require_vector(op, "conv_db", conv_db, conv_dw.shape[0]);
    require_grad_dtype(op, "conv_db", conv_db, conv_x.dtype);
  }
  if (x.numel() == 0) return;
  max_pool_conv_backward_impl(p, x, y, dy, dx, argmax, cp, conv_x, conv_dw, conv_db);
}

void Backend::max_pool_conv_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                          const Tensor& dx, const Tensor& argmax, const Conv2dParams& cp,
                                          const Tensor& conv_x, const Tensor& conv_dw, const Tensor& conv_db) {
  if (argmax.empty())
    max_pool_relu_backward_impl(p, x, y, dy, dx);
  else
    max_pool_backward_argmax_impl(p, y, argmax, dy, dx, true);
  conv2d_backward_filter_impl(cp, conv_x, dx, conv_dw, conv_db);
}

void Backend::conv_max_pool_forward(const Conv2dParams& cp, const Tensor& x, const Tensor& w, const Tensor& bias,
                                    const Tensor& conv_y, const PoolParams& p, const Tensor& y, const Tensor& argmax) {
  const char* op = "conv_max_pool_forward";
  MPX_VALIDATE(p.kind == PoolKind::Max, "{}: needs max pooling, got average", op);
  require_float(op, "x", x);
  require_data(op, "w", w);
  require_data(op, "conv_y", conv_y);
  require_same_dtype(op, "x", x, "w", w);
  require_same_dtype(op, "x", x, "conv_y", conv_y);
  check_conv_shapes(op, cp, x, "x", w, conv_y, "conv_y");
  check_bias(op, bias, w.shape[0], x.dtype);
  check_pool_shapes(op, p, conv_y, y);
  require_same_dtype(op, "conv_y", conv_y, "y", y);
  if (!argmax.empty()) check_argmax(op, *this, p, conv_y, y, argmax);
  if (y.numel() == 0) return;
  conv_max_pool_forward_impl(cp, x, w, bias, conv_y, p, y, argmax);
}

void Backend::conv_max_pool_forward_impl(const Conv2dParams& cp, const Tensor& x, const Tensor& w, const Tensor& bias,
                                         const Tensor& conv_y, const PoolParams& p, const Tensor& y,
                                         const Tensor& argmax) {
  conv2d_forward_impl(cp, x, w, bias, conv_y, Activation::Relu, Tensor());
  if (argmax.empty())
    pool_forward_impl(p, conv_y, y);
  else
    max_pool_forward_argmax_impl(p, conv_y, y, argmax);
}

bool Backend::conv_max_pool_forward_fuses(const Conv2dParams& cp, const Shape& x, const Shape& w, DType t,
                                          const PoolParams& p) const {
  if (p.kind != PoolKind::Max || x.rank != 4 || w.rank != 4) return false;
  const Shape conv_y{x[0], cp.out_h(static_cast<int>(x[1])), cp.out_w(static_cast<int>(x[2])), w[0]};
  return conv_max_pool_forward_fuses_impl(cp, x, w, t, p, conv_y);
}

void Backend::dense_relu_backward_data(const Tensor& dy, const Tensor& w, const Tensor& x, const Tensor& dx) {
  const char* op = "dense_relu_backward_data";
  require_float(op, "dy", dy);
  require_data(op, "w", w);
  require_float(op, "dx", dx);
  require_same_dtype(op, "dy", dy, "w", w);
  require_layer_input(op, "dx", dx, "dy", dy.dtype);
  check_dense_shapes(op, dx, "dx", w, dy, "dy");
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "x", x, "dx", dx);
  if (dx.numel() == 0) return;
  dense_relu_backward_data_impl(dy, w, x, dx);
}

void Backend::dense_relu_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x, const Tensor& dx) {
  dense_backward_data_impl(dy, w, dx);
  activation_backward_impl(Activation::Relu, x, dx, dx);
}

namespace {
/// dense_backward's arguments (dense_conv_backward's too).
void check_dense_backward(const char* op, const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                          const Tensor& db, const Tensor& dx) {
  require_float(op, "x", x);
  require_float(op, "dy", dy);
  require_data(op, "w", w);
  require_data(op, "dw", dw);
  require_float(op, "dx", dx);
  require_same_dtype(op, "dy", dy, "w", w);
  require_layer_input(op, "x", x, "dy", dy.dtype);
  require_grad_dtype(op, "dw", dw, dy.dtype);
  check_dense_shapes(op, x, "x", dw, dy, "dy");
  check_dense_shapes(op, dx, "dx", w, dy, "dy");
  if (!db.empty()) {
    require_vector(op, "db", db, dw.shape[0]);
    require_grad_dtype(op, "db", db, dy.dtype);
  }
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "x", x, "dx", dx);
}
}  // namespace

void Backend::dense_backward(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw, const Tensor& db,
                             const Tensor& dx, bool relu_input) {
  check_dense_backward("dense_backward", x, dy, w, dw, db, dx);
  dense_backward_impl(x, dy, w, dw, db, dx, relu_input);
}

void Backend::dense_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                                  const Tensor& db, const Tensor& dx, bool relu_input) {
  dense_backward_weights_impl(x, dy, dw, db);
  if (dx.numel() == 0) return;
  if (relu_input)
    dense_relu_backward_data_impl(dy, w, x, dx);
  else
    dense_backward_data_impl(dy, w, dx);
}

void Backend::dense_conv_backward(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                                  const Tensor& db, const Tensor& dx, const Conv2dParams& p, const Tensor& conv_x,
                                  const Tensor& conv_dw, const Tensor& conv_db) {
  const char* op = "dense_conv_backward";
  require_float(op, "conv_x", conv_x);
  require_data(op, "conv_dw", conv_dw);
  require_same_dtype(op, "x", x, "conv_x", conv_x);
  require_grad_dtype(op, "conv_dw", conv_dw, conv_x.dtype);
  require_rank(op, "conv_x", conv_x, 4);
  require_rank(op, "conv_dw", conv_dw, 4);
  check_conv_params(op, p);
  const int P = p.out_h(static_cast<int>(conv_x.shape[1])), Q = p.out_w(static_cast<int>(conv_x.shape[2]));
  const int64_t K = conv_dw.shape[0];
  MPX_VALIDATE(x.shape.rank == 2 && x.shape[0] == conv_x.shape[0] && x.shape[1] == int64_t{P} * Q * K,
               "{}: x {} must be the convolution's output flattened, [{}, {}x{}x{}]", op, x.str(), conv_x.shape[0],
               P, Q, K);
  Tensor y = x;  // x seen as the convolution's output
  y.shape = Shape{x.shape[0], P, Q, K};
  check_conv_shapes(op, p, conv_x, "conv_x", conv_dw, y, "x");
  if (!conv_db.empty()) {
    require_vector(op, "conv_db", conv_db, conv_dw.shape[0]);
    require_grad_dtype(op, "conv_db", conv_db, conv_x.dtype);
  }
  check_dense_backward(op, x, dy, w, dw, db, dx);
  if (x.numel() == 0) return;
  dense_conv_backward_impl(x, dy, w, dw, db, dx, p, conv_x, conv_dw, conv_db);
}

void Backend::dense_conv_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw,
                                       const Tensor& db, const Tensor& dx, const Conv2dParams& p,
                                       const Tensor& conv_x, const Tensor& conv_dw, const Tensor& conv_db) {
  dense_backward_impl(x, dy, w, dw, db, dx, true);
  Tensor g = dx;  // dx seen as the convolution's output gradient
  g.shape = Shape{dx.shape[0], p.out_h(static_cast<int>(conv_x.shape[1])),
                  p.out_w(static_cast<int>(conv_x.shape[2])), conv_dw.shape[0]};
  conv2d_backward_filter_impl(p, conv_x, g, conv_dw, conv_db);
}

void Backend::global_avg_pool_relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const char* op = "global_avg_pool_relu_backward";
  require_float(op, "dy", dy);
  require_data(op, "dx", dx);
  require_rank(op, "dx", dx, 4);
  require_same_dtype(op, "dy", dy, "dx", dx);
  require_shape(op, "dy", dy, Shape{dx.shape[0], dx.shape[3]});
  MPX_VALIDATE(dx.shape[1] * dx.shape[2] > 0, "{}: dx {} has no pixels", op, dx.str());
  require_same_dtype(op, "x", x, "dx", dx);
  require_same_shape(op, "x", x, "dx", dx);
  if (dx.numel() == 0) return;
  global_avg_pool_relu_backward_impl(x, dy, dx);
}

void Backend::global_avg_pool_relu_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  global_avg_pool_backward_impl(dy, dx);
  activation_backward_impl(Activation::Relu, x, dx, dx);
}

// ---- fused mixed-precision passes --------------------------------------------

bool Backend::unscale_and_check(const Tensor& grads, float inv_scale) {
  require_f32("unscale_and_check", "grads", grads);
  if (grads.numel() == 0) return true;
  return unscale_and_check_impl(grads, inv_scale);
}

}  // namespace mpx
