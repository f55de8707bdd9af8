// SPDX-License-Identifier: MIT
// Depthwise convolution through cuDNN's grouped convolution (cudnnSetConvolutionGroupCount
// with one group per input channel), NHWC, filters [C*M, R, S, 1] (cuDNN's NHWC filter
// layout with C/groups = 1 input channel), float32 compute. The algorithm of each shape is
// the first of cuDNN's heuristic ranking (the _v7 queries) that fits the workspace budget,
// without TF32 for float32, deterministic only with cuda.deterministic (algo_choice.h).
// Asymmetric padding goes through the explicitly padded input of conv.cpp (pad_nhwc);
// no channel padding (it would change the groups). Bias and activation run as the
// epilogue kernel of activation.cu, the bias gradient as its column sum. Twin of
// cpu/conv/depthwise_conv.cpp.
#include <cudnn.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/algo_choice.h"
#include "backend/cuda/check.h"
#include "backend/cuda/conv_geometry.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

/// conv_geometry's spatial padding, with the channels as they are (C groups of one channel).
ConvGeo dw_geometry(const Conv2dParams& p, const Shape& x, const Shape& w) {
  ConvGeo g = conv_geometry(p, x, w, DType::F32);  // float32: never channel-padded
  g.padded = g.Hp != g.H || g.Wp != g.W;
  return g;
}

std::string dw_what(const char* op, const ConvGeo& g, DType t) {
  return std::string(op) + " (" + dtype_name(t) + ") for x [" + std::to_string(g.N) + ", " + std::to_string(g.H) +
         ", " + std::to_string(g.W) + ", " + std::to_string(g.C) + "], w [" + std::to_string(g.K) + ", " +
         std::to_string(g.R) + ", " + std::to_string(g.S) + ", 1], stride " + std::to_string(g.sh) + "x" +
         std::to_string(g.sw);
}

enum DwOp : int64_t { kDwFwd = 131, kDwBwdData = 132, kDwBwdFilter = 133 };

const char* dw_op_name(DwOp op) {
  return op == kDwFwd ? "depthwise convolution forward"
                      : op == kDwBwdData ? "depthwise convolution backward data"
                                         : "depthwise convolution backward filter";
}

PlanKey dw_key(DwOp op, const Conv2dParams& p, const ConvGeo& g, DType t, const void* a, const void* b,
               const void* c) {
  PlanKey k;
  k << op << static_cast<int64_t>(t) << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w
    << p.pad_top << p.pad_left << p.pad_bottom << p.pad_right << pointer_alignment(a) << pointer_alignment(b)
    << pointer_alignment(c);
  return k;
}

/// Descriptors, algorithm and workspace of one (op, shape, dtype).
struct DwPlan : Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t ws_bytes = 0;

  ~DwPlan() override {
    auto log = [](const char* what, cudnnStatus_t s) {
      if (s != CUDNN_STATUS_SUCCESS) spdlog::error("cuDNN: {} failed: {}", what, cudnnGetErrorString(s));
    };
    if (x) log("cudnnDestroyTensorDescriptor", cudnnDestroyTensorDescriptor(x));
    if (y) log("cudnnDestroyTensorDescriptor", cudnnDestroyTensorDescriptor(y));
    if (w) log("cudnnDestroyFilterDescriptor", cudnnDestroyFilterDescriptor(w));
    if (conv) log("cudnnDestroyConvolutionDescriptor", cudnnDestroyConvolutionDescriptor(conv));
  }
};

void make_descriptors(DwPlan& plan, const ConvGeo& g, DType t) {
  const cudnnDataType_t dt = cudnn_dtype(t);
  MPX_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.x));
  MPX_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.y));
  MPX_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan.w));
  MPX_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan.conv));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.C), static_cast<int>(g.Hp), static_cast<int>(g.Wp)));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.K), static_cast<int>(g.P), static_cast<int>(g.Q)));
  // K = C*M filters of one input channel each: [K, R, S, 1] in cuDNN's NHWC filter layout.
  MPX_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan.w, dt, CUDNN_TENSOR_NHWC, static_cast<int>(g.K), 1,
                                             static_cast<int>(g.R), static_cast<int>(g.S)));
  MPX_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan.conv, g.ph, g.pw, g.sh, g.sw, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
  MPX_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan.conv, static_cast<int>(g.C)));
  MPX_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, t == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  int n = 0, c = 0, h = 0, w = 0;
  MPX_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan.conv, plan.x, plan.w, &n, &c, &h, &w));
  MPX_CHECK_MSG(n == g.N && c == g.K && h == g.P && w == g.Q,
                "cuDNN depthwise output shape differs from Conv2dParams (padding translation bug)");
}

template <typename Perf>
std::vector<AlgoCandidate> to_candidates(const Perf* perf, int n) {
  std::vector<AlgoCandidate> out;
  for (int i = 0; i < n; ++i) {
    AlgoCandidate c;
    c.algo = static_cast<int>(perf[i].algo);
    c.ok = perf[i].status == CUDNN_STATUS_SUCCESS;
    c.memory = perf[i].memory;
    c.deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
    c.tensor_op = perf[i].mathType == CUDNN_TENSOR_OP_MATH || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    c.math = static_cast<int>(perf[i].mathType);
    out.push_back(c);
  }
  return out;
}

/// cuDNN's heuristic ranking of op's algorithms for the plan's descriptors.
std::vector<AlgoCandidate> ranked(Context& ctx, DwOp op, const DwPlan& pl) {
  cudnnHandle_t h = ctx.cudnn();
  int n = 0;
  if (op == kDwFwd) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    MPX_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, pl.x, pl.w, pl.conv, pl.y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
    return to_candidates(perf, n);
  }
  if (op == kDwBwdData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    MPX_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, pl.w, pl.y, pl.conv, pl.x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
    return to_candidates(perf, n);
  }
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  MPX_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, pl.x, pl.y, pl.conv, pl.w,
                                                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
  return to_candidates(perf, n);
}

bool workspace_size(Context& ctx, DwOp op, const DwPlan& pl, int algo, size_t* ws) {
  cudnnStatus_t st;
  if (op == kDwFwd)
    st = cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn(), pl.x, pl.w, pl.conv, pl.y,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws);
  else if (op == kDwBwdData)
    st = cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.cudnn(), pl.w, pl.y, pl.conv, pl.x,
                                                      static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws);
  else
    st = cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.cudnn(), pl.x, pl.y, pl.conv, pl.w,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws);
  return st == CUDNN_STATUS_SUCCESS;
}

/// The plan of op on g: descriptors and the first usable algorithm (cached per process).
DwPlan* build(Context& ctx, DwOp op, const PlanKey& key, const ConvGeo& g, DType t) {
  auto plan = std::make_unique<DwPlan>();
  make_descriptors(*plan, g, t);
  const AlgoSettings s = ctx.algo_settings();
  const std::string what = dw_what(dw_op_name(op), g, t);
  const AlgoChoice c = AlgoCache::process().get(algo_key(ctx.device(), key.v.data(), key.n, s), [&] {
    const std::vector<AlgoCandidate> cands = ranked(ctx, op, *plan);
    for (const AlgoCandidate& a : usable_candidates(cands, t == DType::F32, s.budget, s.deterministic)) {
      const cudnnMathType_t m = t == DType::F32 ? CUDNN_FMA_MATH : static_cast<cudnnMathType_t>(a.math);
      if (cudnnSetConvolutionMathType(plan->conv, m) != CUDNN_STATUS_SUCCESS) continue;
      size_t ws = 0;
      if (!workspace_size(ctx, op, *plan, a.algo, &ws) || ws > s.budget) continue;
      return AlgoChoice{a.algo, static_cast<int>(m), ws, a.deterministic};
    }
    throw Error("cuDNN: unsupported configuration, no " + std::string(s.deterministic ? "deterministic " : "") +
                "algorithm for " + what + " within a workspace of " + std::to_string(s.budget >> 20) + " MiB (" +
                std::to_string(cands.size()) + " ranked by cuDNN)");
  });
  MPX_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, static_cast<cudnnMathType_t>(c.math)));
  plan->algo = c.algo;
  plan->ws_bytes = c.workspace;
  ctx.note_plan(PlanReport{"cudnn", what,
                           std::to_string(c.algo) + (c.deterministic ? " (deterministic)" : " (non-deterministic)") +
                               ", heuristic",
                           c.math == CUDNN_FMA_MATH ? "CUDNN_FMA_MATH"
                           : c.math == CUDNN_TENSOR_OP_MATH ? "CUDNN_TENSOR_OP_MATH"
                           : c.math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION"
                                                                             : "CUDNN_DEFAULT_MATH",
                           c.workspace});
  return plan.release();
}

void* workspace(Context& ctx, const DwPlan& plan) {
  return plan.ws_bytes ? ctx.scratch(kSlotWorkspace, plan.ws_bytes) : nullptr;
}

/// The input cuDNN reads: x itself, or x padded spatially into the planned buffer.
Tensor dw_input(Context& ctx, const ConvGeo& g, const Tensor& x) {
  if (!g.padded) return x;
  const Shape s{g.N, g.Hp, g.Wp, g.C};
  Tensor xp(ctx.scratch(kSlotPadX, static_cast<size_t>(s.numel()) * dtype_size(x.dtype)), x.dtype, s);
  pad_nhwc(ctx, x, xp, g.top, g.left);
  return xp;
}

}  // namespace

// ---- ops (op_table.inc) -----------------------------------------------------------------

void depthwise_conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w,
                              const Tensor& bias, const Tensor& y, Activation act, const Tensor& pre) {
  const ConvGeo g = dw_geometry(p, x.shape, w.shape);
  const Tensor xin = dw_input(ctx, g, x);
  const PlanKey key = dw_key(kDwFwd, p, g, x.dtype, xin.data, w.data, y.data);
  DwPlan& plan = ctx.plan<DwPlan>(key, [&] { return build(ctx, kDwFwd, key, g, x.dtype); });
  const float alpha = 1.0f, beta = 0.0f;
  MPX_CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn(), &alpha, plan.x, xin.data, plan.w, w.data, plan.conv,
                                          static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), workspace(ctx, plan),
                                          plan.ws_bytes, &beta, plan.y, y.data));
  bias_activation(ctx, y, bias, act, pre);
}

void depthwise_conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                                    const Tensor& dx) {
  const ConvGeo g = dw_geometry(p, dx.shape, w.shape);
  Tensor dxin = dx;
  if (g.padded) {
    const Shape s{g.N, g.Hp, g.Wp, g.C};
    dxin = Tensor(ctx.scratch(kSlotPadDX, static_cast<size_t>(s.numel()) * dtype_size(dx.dtype)), dx.dtype, s);
  }
  const PlanKey key = dw_key(kDwBwdData, p, g, dx.dtype, w.data, dy.data, dxin.data);
  DwPlan& plan = ctx.plan<DwPlan>(key, [&] { return build(ctx, kDwBwdData, key, g, dx.dtype); });
  const float alpha = 1.0f, beta = 0.0f;
  MPX_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &alpha, plan.w, w.data, plan.y, dy.data, plan.conv,
                                               static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo),
                                               workspace(ctx, plan), plan.ws_bytes, &beta, plan.x, dxin.data));
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
  const Tensor xin = dw_input(ctx, g, x);
  // cuDNN writes dw in the operands' dtype: a float32 dw of 16-bit operands goes through a
  // 16-bit buffer and one cast, as conv2d_backward_filter does.
  Tensor dwout = dw;
  if (dw.dtype != x.dtype)
    dwout = Tensor(ctx.scratch(kSlotGrad16, static_cast<size_t>(dw.numel()) * dtype_size(x.dtype)), x.dtype,
                   dw.shape);
  const PlanKey key = dw_key(kDwBwdFilter, p, g, x.dtype, xin.data, dy.data, dwout.data);
  DwPlan& plan = ctx.plan<DwPlan>(key, [&] { return build(ctx, kDwBwdFilter, key, g, x.dtype); });
  const float alpha = 1.0f, beta = 0.0f;
  MPX_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &alpha, plan.x, xin.data, plan.y, dy.data, plan.conv,
                                                 static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo),
                                                 workspace(ctx, plan), plan.ws_bytes, &beta, plan.w, dwout.data));
  if (dwout.data != dw.data) cast(ctx, dwout, dw);
  if (!db.empty()) bias_backward(ctx, dy, db);
}

}  // namespace mpx::cuda
