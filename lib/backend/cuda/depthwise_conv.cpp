// SPDX-License-Identifier: MIT
// Depthwise convolution through cuDNN's grouped convolution (one group per input channel),
// NHWC, filters [C*M, R, S, 1] (cuDNN's NHWC filter layout with C/groups = 1 input
// channel), float32 compute, on conv_plan.h's plans as conv2d's: the same choice of
// algorithm (cuda.conv_algo, cuda.deterministic, cuda.workspace_mb). Asymmetric padding
// goes through the explicitly padded input (pad_nhwc); no channel padding (it would change
// the groups). Bias and activation run as the epilogue kernel of activation.cu, the bias
// gradient as its column sum. Twin of cpu/conv/depthwise_conv.cpp.
#include "backend/cuda/conv_geometry.h"
#include "backend/cuda/conv_plan.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

/// conv_geometry's spatial padding, with the channels as they are (C groups of one channel).
ConvGeo dw_geometry(const Conv2dParams& p, const Shape& x, const Shape& w) {
  ConvGeo g = conv_geometry(p, x, w, DType::F32);  // float32: never channel-padded
  g.padded = g.Hp != g.H || g.Wp != g.W;
  return g;
}

}  // namespace

// ---- ops (op_table.inc) -----------------------------------------------------------------

void depthwise_conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w,
                              const Tensor& bias, const Tensor& y, Activation act, const Tensor& pre) {
  const ConvGeo g = dw_geometry(p, x.shape, w.shape);
  const Tensor xin = conv_input(ctx, g, x);
  const ConvData d{xin.data, w.data, y.data};
  run_conv(ctx, ConvPass::Forward, conv_plan(ctx, ConvPass::Forward, ConvGroups::Depthwise, p, g, x.dtype, d), d);
  bias_activation(ctx, y, bias, act, pre);
}

void depthwise_conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                                    const Tensor& dx) {
  const ConvGeo g = dw_geometry(p, dx.shape, w.shape);
  const Tensor dxin = conv_input_grad(ctx, g, dx);
  const ConvData d{w.data, dy.data, dxin.data};
  run_conv(ctx, ConvPass::BackwardData,
           conv_plan(ctx, ConvPass::BackwardData, ConvGroups::Depthwise, p, g, dx.dtype, d), d);
  if (g.padded) crop_nhwc(ctx, dxin, dx, g.top, g.left);
}

void depthwise_conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                                      const Tensor& dw, const Tensor& db) {
  const ConvGeo g = dw_geometry(p, x.shape, dw.shape);
  if (x.numel() == 0 || dy.numel() == 0) {  // an empty batch has zero gradients
    fill(ctx, dw, 0.0f);
    if (!db.empty()) fill(ctx, db, 0.0f);
    return;
  }
  const Tensor xin = conv_input(ctx, g, x);
  // cuDNN writes dw in the operands' dtype: a float32 dw of 16-bit operands goes through a
  // 16-bit buffer and one cast, as conv2d_backward_filter does.
  Tensor dwout = dw;
  if (dw.dtype != x.dtype)
    dwout = Tensor(ctx.scratch(kSlotGrad16, static_cast<size_t>(dw.numel()) * dtype_size(x.dtype)), x.dtype,
                   dw.shape);
  const ConvData d{xin.data, dy.data, dwout.data};
  run_conv(ctx, ConvPass::BackwardFilter,
           conv_plan(ctx, ConvPass::BackwardFilter, ConvGroups::Depthwise, p, g, x.dtype, d), d);
  if (dwout.data != dw.data) cast(ctx, dwout, dw);
  if (!db.empty()) bias_backward(ctx, dy, db);
}

}  // namespace mpx::cuda
