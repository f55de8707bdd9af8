// SPDX-License-Identifier: MIT
// Convolution forward / backward-data / backward-filter through cuDNN's legacy
// convolution API, NHWC with KRSC filters, float32 compute (CUDNN_DATA_FLOAT):
// Tensor Core math for 16-bit operands, FMA-only math (no TF32) for float32. The plans
// (descriptors, the algorithm of each shape, the call) are conv_plan.h's, shared with the
// depthwise convolution: cuDNN's heuristic ranking (the default, the same every run) or
// measured (cuda.conv_algo: search), within the workspace budget, deterministic algorithms
// only with cuda.deterministic, chosen once per process and cached per Context.
//
// The shape cuDNN sees (conv_geometry.h): asymmetric padding (Keras "same" with an even
// kernel or a stride > 1) goes to cuDNN as the smaller pad of each dimension, with the
// input padded explicitly by the difference into a planned buffer (pad_nhwc, conv_pad.cu);
// 16-bit operands with a channel count that is not a multiple of 8 get zero channels up
// to the next multiple in input and filter. Backward data computes the gradient of the
// padded input and crops it into dx; backward filter crops the padded filter gradient
// into dw. Bias and activation run as one epilogue kernel after the convolution
// (activation.cu; cuDNN's legacy API fuses no GELU/SiLU), which also writes the
// pre-activation when asked; the bias gradient is a deterministic column sum.
// Twin of cpu/conv/conv.cpp.
#include "backend/cuda/check.h"
#include "backend/cuda/conv_geometry.h"
#include "backend/cuda/conv_plan.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

using Geo = ConvGeo;

Geo geometry(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) { return conv_geometry(p, x, w, t); }

/// The filter cuDNN reads: w itself, or w with zero channels up to g.Cp.
Tensor conv_filter(Context& ctx, const Geo& g, const Tensor& w) {
  if (!g.channels_padded()) return w;
  const Shape s{g.K, g.R, g.S, g.Cp};
  Tensor wp(ctx.scratch(kSlotPadW, static_cast<size_t>(s.numel()) * dtype_size(w.dtype)), w.dtype, s);
  pad_nhwc(ctx, w, wp, 0, 0);
  return wp;
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------

Support probe_conv2d(Context& ctx, const Conv2dParams& p, const Shape& x, const Shape& w, DType t) {
  const Geo g = geometry(p, x, w, t);
  if (g.N == 0 || g.K == 0 || g.C == 0) return {};
  // Forward and backward filter are needed by every layer; backward data only by a layer
  // whose input gradient is computed (not the first), so its absence is reported, not fatal.
  Support out;
  try {
    ConvPlan plan;
    make_conv_descriptors(plan, ConvGroups::Full, g, t);
    const AlgoSettings s = ctx.algo_settings();
    for (ConvPass pass : {ConvPass::Forward, ConvPass::BackwardFilter})
      choose_conv_heuristic(ctx, pass, ConvGroups::Full, plan, g, t, s);
    try {
      choose_conv_heuristic(ctx, ConvPass::BackwardData, ConvGroups::Full, plan, g, t, s);
    } catch (const Error& e) {
      out.input_grad = false;
      out.input_grad_reason = e.what();
    }
  } catch (const Error& e) {
    return Support::refused(e.what());
  }
  return out;
}

void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre) {
  const Geo g = geometry(p, x.shape, w.shape, x.dtype);
  if (y.numel() == 0) return;
  const Tensor xin = conv_input(ctx, g, x);
  const Tensor win = conv_filter(ctx, g, w);
  const ConvData d{xin.data, win.data, y.data};
  run_conv(ctx, ConvPass::Forward, conv_plan(ctx, ConvPass::Forward, ConvGroups::Full, p, g, x.dtype, d), d);
  bias_activation(ctx, y, bias, act, pre);
}

void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) {
  const Geo g = geometry(p, dx.shape, w.shape, dx.dtype);
  if (dx.numel() == 0) return;
  const Tensor win = conv_filter(ctx, g, w);
  const Tensor dxin = conv_input_grad(ctx, g, dx);
  const ConvData d{win.data, dy.data, dxin.data};
  run_conv(ctx, ConvPass::BackwardData, conv_plan(ctx, ConvPass::BackwardData, ConvGroups::Full, p, g, dx.dtype, d),
           d);
  if (g.padded) crop_nhwc(ctx, dxin, dx, g.top, g.left);
}

void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db) {
  const Geo g = geometry(p, x.shape, dw.shape, x.dtype);
  if (x.numel() == 0 || dy.numel() == 0) {  // an empty batch has zero gradients
    fill(ctx, dw, 0.0f);
    if (!db.empty()) fill(ctx, db, 0.0f);
    return;
  }
  const Tensor xin = conv_input(ctx, g, x);
  // cuDNN writes dw in the operands' dtype (and padded channels): a float32 dw of 16-bit
  // operands goes through a 16-bit buffer (the gradient Keras computes in the compute dtype)
  // and one cast; the zero channels' gradient is cropped away.
  const auto grad16 = [&] {
    return Tensor(ctx.scratch(kSlotGrad16, static_cast<size_t>(dw.numel()) * dtype_size(x.dtype)), x.dtype,
                  dw.shape);
  };
  Tensor dwout = dw;
  if (g.channels_padded()) {
    const Shape s{g.K, g.R, g.S, g.Cp};
    dwout = Tensor(ctx.scratch(kSlotPadDW, static_cast<size_t>(s.numel()) * dtype_size(x.dtype)), x.dtype, s);
  } else if (dw.dtype != x.dtype) {
    dwout = grad16();
  }
  const ConvData d{xin.data, dy.data, dwout.data};
  run_conv(ctx, ConvPass::BackwardFilter,
           conv_plan(ctx, ConvPass::BackwardFilter, ConvGroups::Full, p, g, x.dtype, d), d);
  if (g.channels_padded()) {
    const Tensor dwc = dw.dtype == x.dtype ? dw : grad16();
    crop_nhwc(ctx, dwout, dwc, 0, 0);
    if (dwc.data != dw.data) cast(ctx, dwc, dw);
  } else if (dwout.data != dw.data) {
    cast(ctx, dwout, dw);
  }
  if (!db.empty()) bias_backward(ctx, dy, db);
}

}  // namespace mpx::cuda
