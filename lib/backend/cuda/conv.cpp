// SPDX-License-Identifier: MIT
// Convolution forward / backward-data / backward-filter through cuDNN's legacy
// convolution API, NHWC with KRSC filters, float32 compute (CUDNN_DATA_FLOAT):
// Tensor Core math for 16-bit operands, FMA-only math (no TF32) for float32. The
// algorithm of each shape is chosen once by measurement (cudnnFind*AlgorithmEx,
// like cudnn.benchmark) within the workspace budget, preferring deterministic
// algorithms, and cached with its descriptors (llm.c's lookup_cache_or_build_graph_fwd).
//
// Asymmetric padding (Keras "same" with an even kernel or a stride > 1) cannot be
// expressed with cuDNN's symmetric pads: cuDNN gets the smaller pad of each
// dimension, and the input is padded explicitly by the difference into a planned
// buffer (pad_nhwc, conv_pad.cu); backward-data computes the gradient of that padded
// input and crops it into dx. Bias and activation run as one epilogue kernel after the
// convolution (activation.cu; cuDNN's legacy API fuses no GELU/SiLU), which also writes
// the pre-activation when asked; the bias gradient is a deterministic column sum.
// Twin of cpu/conv.cpp.
#include <cudnn.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

struct Geo {
  int64_t N, H, W, C, K, R, S, P, Q;
  int sh, sw;
  int ph, pw;       // symmetric pads given to cuDNN
  int top, left;    // where x sits inside the explicitly padded input
  int64_t Hp, Wp;   // input extent cuDNN sees
  bool padded;      // explicit padding needed
};

Geo geometry(const Conv2dParams& p, const Shape& x, const Shape& w) {
  Geo g{};
  g.N = x[0], g.H = x[1], g.W = x[2], g.C = x[3];
  g.K = w[0], g.R = w[1], g.S = w[2];
  g.P = p.out_h(static_cast<int>(g.H));
  g.Q = p.out_w(static_cast<int>(g.W));
  g.sh = p.stride_h, g.sw = p.stride_w;
  g.ph = std::min(p.pad_top, p.pad_bottom);
  g.pw = std::min(p.pad_left, p.pad_right);
  g.top = p.pad_top - g.ph;
  g.left = p.pad_left - g.pw;
  g.Hp = g.H + (p.pad_top - g.ph) + (p.pad_bottom - g.ph);
  g.Wp = g.W + (p.pad_left - g.pw) + (p.pad_right - g.pw);
  g.padded = g.Hp != g.H || g.Wp != g.W;
  return g;
}

std::string conv_what(const char* op, const Geo& g, DType t) {
  return std::string(op) + " (" + dtype_name(t) + ") for x [" + std::to_string(g.N) + ", " + std::to_string(g.H) +
         ", " + std::to_string(g.W) + ", " + std::to_string(g.C) + "], w [" + std::to_string(g.K) + ", " +
         std::to_string(g.R) + ", " + std::to_string(g.S) + ", " + std::to_string(g.C) + "], stride " +
         std::to_string(g.sh) + "x" + std::to_string(g.sw);
}

enum ConvOp : int64_t { kConvFwd = 101, kConvBwdData = 102, kConvBwdFilter = 103 };

/// Also keyed by the alignment of the three data pointers: weights are views into the
/// parameter arena at any element offset, and cuDNN's fastest kernels need aligned operands.
PlanKey conv_key(ConvOp op, const Conv2dParams& p, const Geo& g, DType t, const void* a, const void* b,
                 const void* c) {
  PlanKey k;
  k << op << static_cast<int64_t>(t) << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w
    << p.pad_top << p.pad_left << p.pad_bottom << p.pad_right << pointer_alignment(a) << pointer_alignment(b)
    << pointer_alignment(c);
  return k;
}

/// Descriptors, algorithm and workspace of one (op, shape, dtype).
struct ConvPlan : Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  size_t ws_bytes = 0;

  ~ConvPlan() override {
    auto log = [](const char* what, cudnnStatus_t s) {
      if (s != CUDNN_STATUS_SUCCESS) spdlog::error("cuDNN: {} failed: {}", what, cudnnGetErrorString(s));
    };
    if (x) log("cudnnDestroyTensorDescriptor", cudnnDestroyTensorDescriptor(x));
    if (y) log("cudnnDestroyTensorDescriptor", cudnnDestroyTensorDescriptor(y));
    if (w) log("cudnnDestroyFilterDescriptor", cudnnDestroyFilterDescriptor(w));
    if (conv) log("cudnnDestroyConvolutionDescriptor", cudnnDestroyConvolutionDescriptor(conv));
  }
};

void make_descriptors(ConvPlan& plan, const Geo& g, DType t) {
  const cudnnDataType_t dt = cudnn_dtype(t);
  MPX_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.x));
  MPX_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.y));
  MPX_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan.w));
  MPX_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan.conv));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.C), static_cast<int>(g.Hp), static_cast<int>(g.Wp)));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.K), static_cast<int>(g.P), static_cast<int>(g.Q)));
  // KRSC is cuDNN's NHWC filter layout.
  MPX_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan.w, dt, CUDNN_TENSOR_NHWC, static_cast<int>(g.K),
                                             static_cast<int>(g.C), static_cast<int>(g.R), static_cast<int>(g.S)));
  MPX_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan.conv, g.ph, g.pw, g.sh, g.sw, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
  MPX_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, t == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  int n = 0, c = 0, h = 0, w = 0;
  MPX_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan.conv, plan.x, plan.w, &n, &c, &h, &w));
  MPX_CHECK_MSG(n == g.N && c == g.K && h == g.P && w == g.Q,
                "cuDNN output shape differs from Conv2dParams (padding translation bug)");
}

/// A temporary workspace of up to `budget` bytes for the measurement (freed after it).
struct FindWorkspace {
  void* p = nullptr;
  size_t bytes = 0;
  explicit FindWorkspace(size_t budget) {
    for (size_t b = budget; b >= (size_t{1} << 20); b /= 2) {
      if (cudaMalloc(&p, b) == cudaSuccess) {
        bytes = b;
        return;
      }
      cudaGetLastError();  // clear the allocation failure and try half
      p = nullptr;
    }
  }
  ~FindWorkspace() {
    if (p) {
      const cudaError_t e = cudaFree(p);
      if (e != cudaSuccess) spdlog::error("CUDA: cudaFree (find workspace) failed: {}", cudaGetErrorString(e));
    }
  }
  FindWorkspace(const FindWorkspace&) = delete;
  FindWorkspace& operator=(const FindWorkspace&) = delete;
};

/// Candidate order: successful results within the budget, float32 without Tensor Core
/// (TF32) math, deterministic ones first; each list is already sorted by time.
template <typename Perf>
std::vector<Perf> candidates(const Perf* perf, int n, DType t, size_t budget) {
  std::vector<Perf> det, nondet;
  for (int i = 0; i < n; ++i) {
    const Perf& r = perf[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > budget) continue;
    if (t == DType::F32 && (r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    (r.determinism == CUDNN_DETERMINISTIC ? det : nondet).push_back(r);
  }
  det.insert(det.end(), nondet.begin(), nondet.end());
  return det;
}

// The math type a chosen algorithm runs with: float32 never uses TF32.
cudnnMathType_t math_for(DType t, cudnnMathType_t found) { return t == DType::F32 ? CUDNN_FMA_MATH : found; }

ConvPlan* build_forward(Context& ctx, const Geo& g, DType t, const void* x, const void* w, void* y) {
  auto plan = std::make_unique<ConvPlan>();
  make_descriptors(*plan, g, t);
  FindWorkspace tmp(ctx.workspace_budget());
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  MPX_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(ctx.cudnn(), plan->x, x, plan->w, w, plan->conv, plan->y, y,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf, tmp.p, tmp.bytes));
  for (const auto& r : candidates(perf, n, t, tmp.bytes)) {
    if (cudnnSetConvolutionMathType(plan->conv, math_for(t, r.mathType)) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn(), plan->x, plan->w, plan->conv, plan->y, r.algo, &ws) !=
        CUDNN_STATUS_SUCCESS)
      continue;
    plan->fwd = r.algo;
    plan->ws_bytes = ws;
    return plan.release();
  }
  throw Error("cuDNN: unsupported configuration, no algorithm for " + conv_what("convolution forward", g, t) +
              " within a workspace of " + std::to_string(tmp.bytes >> 20) + " MiB");
}

ConvPlan* build_backward_data(Context& ctx, const Geo& g, DType t, const void* w, const void* dy, void* dx) {
  auto plan = std::make_unique<ConvPlan>();
  make_descriptors(*plan, g, t);
  FindWorkspace tmp(ctx.workspace_budget());
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int n = 0;
  MPX_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(ctx.cudnn(), plan->w, w, plan->y, dy, plan->conv,
                                                             plan->x, dx, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n,
                                                             perf, tmp.p, tmp.bytes));
  for (const auto& r : candidates(perf, n, t, tmp.bytes)) {
    if (cudnnSetConvolutionMathType(plan->conv, math_for(t, r.mathType)) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.cudnn(), plan->w, plan->y, plan->conv, plan->x, r.algo,
                                                     &ws) != CUDNN_STATUS_SUCCESS)
      continue;
    plan->bwd_data = r.algo;
    plan->ws_bytes = ws;
    return plan.release();
  }
  throw Error("cuDNN: unsupported configuration, no algorithm for " + conv_what("convolution backward data", g, t) +
              " within a workspace of " + std::to_string(tmp.bytes >> 20) + " MiB");
}

ConvPlan* build_backward_filter(Context& ctx, const Geo& g, DType t, const void* x, const void* dy, void* dw) {
  auto plan = std::make_unique<ConvPlan>();
  make_descriptors(*plan, g, t);
  FindWorkspace tmp(ctx.workspace_budget());
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int n = 0;
  MPX_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(ctx.cudnn(), plan->x, x, plan->y, dy, plan->conv,
                                                               plan->w, dw, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                               &n, perf, tmp.p, tmp.bytes));
  for (const auto& r : candidates(perf, n, t, tmp.bytes)) {
    if (cudnnSetConvolutionMathType(plan->conv, math_for(t, r.mathType)) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.cudnn(), plan->x, plan->y, plan->conv, plan->w, r.algo,
                                                       &ws) != CUDNN_STATUS_SUCCESS)
      continue;
    plan->bwd_filter = r.algo;
    plan->ws_bytes = ws;
    return plan.release();
  }
  throw Error("cuDNN: unsupported configuration, no algorithm for " +
              conv_what("convolution backward filter", g, t) + " within a workspace of " +
              std::to_string(tmp.bytes >> 20) + " MiB");
}

/// The input cuDNN reads: x itself, or x padded explicitly into the planned buffer.
Tensor conv_input(Context& ctx, const Geo& g, const Tensor& x) {
  if (!g.padded) return x;
  const Shape s{g.N, g.Hp, g.Wp, g.C};
  Tensor xp(ctx.scratch(kSlotPadX, static_cast<size_t>(s.numel()) * dtype_size(x.dtype)), x.dtype, s);
  pad_nhwc(ctx, x, xp, g.top, g.left);
  return xp;
}

void* workspace(Context& ctx, const ConvPlan& plan) {
  return plan.ws_bytes ? ctx.scratch(kSlotWorkspace, plan.ws_bytes) : nullptr;
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------

void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre) {
  const Geo g = geometry(p, x.shape, w.shape);
  if (y.numel() == 0) return;
  const Tensor xin = conv_input(ctx, g, x);
  ConvPlan& plan = ctx.plan<ConvPlan>(conv_key(kConvFwd, p, g, x.dtype, xin.data, w.data, y.data),
                                      [&] { return build_forward(ctx, g, x.dtype, xin.data, w.data, y.data); });
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = workspace(ctx, plan);
  MPX_CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn(), &alpha, plan.x, xin.data, plan.w, w.data, plan.conv, plan.fwd,
                                          ws, plan.ws_bytes, &beta, plan.y, y.data));
  bias_activation(ctx, y, bias, act, pre);
}

void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) {
  const Geo g = geometry(p, dx.shape, w.shape);
  if (dx.numel() == 0) return;
  Tensor dxin = dx;
  if (g.padded) {
    const Shape s{g.N, g.Hp, g.Wp, g.C};
    dxin = Tensor(ctx.scratch(kSlotPadDX, static_cast<size_t>(s.numel()) * dtype_size(dx.dtype)), dx.dtype, s);
  }
  ConvPlan& plan = ctx.plan<ConvPlan>(conv_key(kConvBwdData, p, g, dx.dtype, w.data, dy.data, dxin.data), [&] {
    return build_backward_data(ctx, g, dx.dtype, w.data, dy.data, dxin.data);
  });
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = workspace(ctx, plan);
  MPX_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &alpha, plan.w, w.data, plan.y, dy.data, plan.conv,
                                               plan.bwd_data, ws, plan.ws_bytes, &beta, plan.x, dxin.data));
  if (g.padded) crop_nhwc(ctx, dxin, dx, g.top, g.left);
}

void conv2d_backward_filter(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& dy,
                            const Tensor& dw, const Tensor& db) {
  const Geo g = geometry(p, x.shape, dw.shape);
  if (x.numel() == 0 || dy.numel() == 0) {  // an empty batch has zero gradients
    fill(ctx, dw, 0.0f);
    if (!db.empty()) fill(ctx, db, 0.0f);
    return;
  }
  const Tensor xin = conv_input(ctx, g, x);
  // cuDNN writes dw in the operands' dtype; a float32 dw of 16-bit operands goes through
  // a 16-bit buffer (the gradient Keras computes in the compute dtype) and one cast.
  Tensor dwout = dw;
  if (dw.dtype != x.dtype)
    dwout = Tensor(ctx.scratch(kSlotGrad16, static_cast<size_t>(dw.numel()) * dtype_size(x.dtype)), x.dtype,
                   dw.shape);
  ConvPlan& plan = ctx.plan<ConvPlan>(conv_key(kConvBwdFilter, p, g, x.dtype, xin.data, dy.data, dwout.data), [&] {
    return build_backward_filter(ctx, g, x.dtype, xin.data, dy.data, dwout.data);
  });
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = workspace(ctx, plan);
  MPX_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &alpha, plan.x, xin.data, plan.y, dy.data, plan.conv,
                                                 plan.bwd_filter, ws, plan.ws_bytes, &beta, plan.w, dwout.data));
  if (dwout.data != dw.data) cast(ctx, dwout, dw);
  if (!db.empty()) bias_backward(ctx, dy, db);
}

}  // namespace mpx::cuda
