// SPDX-License-Identifier: MIT
// Convolution forward / backward-data / backward-filter through cuDNN's legacy
// convolution API, NHWC with KRSC filters, float32 compute (CUDNN_DATA_FLOAT):
// Tensor Core math for 16-bit operands, FMA-only math (no TF32) for float32. The
// algorithm of each shape comes from cuDNN's heuristic ranking (the _v7 queries; the
// default, the same every run) or from measuring (cudnnFind*AlgorithmEx, like
// cudnn.benchmark; cuda.conv_algo: search), within the workspace budget, deterministic
// algorithms only with cuda.deterministic (algo_choice.h). A choice is cached for the
// whole process, so every backend of a process uses the same algorithm for a shape;
// each Context caches its descriptors (llm.c's lookup_cache_or_build_graph_fwd).
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
// Twin of cpu/conv.cpp.
#include <cudnn.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/algo_choice.h"
#include "backend/cuda/check.h"
#include "backend/cuda/conv_geometry.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

using Geo = ConvGeo;

Geo geometry(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) { return conv_geometry(p, x, w, t); }

std::string conv_what(const char* op, const Geo& g, DType t) {
  return std::string(op) + " (" + dtype_name(t) + ") for x [" + std::to_string(g.N) + ", " + std::to_string(g.H) +
         ", " + std::to_string(g.W) + ", " + std::to_string(g.C) + "], w [" + std::to_string(g.K) + ", " +
         std::to_string(g.R) + ", " + std::to_string(g.S) + ", " + std::to_string(g.C) + "], stride " +
         std::to_string(g.sh) + "x" + std::to_string(g.sw) +
         (g.channels_padded() ? " (channels padded to " + std::to_string(g.Cp) + ")" : "");
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
                                             static_cast<int>(g.Cp), static_cast<int>(g.Hp), static_cast<int>(g.Wp)));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.K), static_cast<int>(g.P), static_cast<int>(g.Q)));
  // KRSC is cuDNN's NHWC filter layout.
  MPX_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan.w, dt, CUDNN_TENSOR_NHWC, static_cast<int>(g.K),
                                             static_cast<int>(g.Cp), static_cast<int>(g.R), static_cast<int>(g.S)));
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

template <typename Perf>
std::vector<AlgoCandidate> to_candidates(const Perf* perf, int n) {
  std::vector<AlgoCandidate> out;
  for (int i = 0; i < n; ++i) {
    const Perf& r = perf[i];
    AlgoCandidate c;
    c.algo = static_cast<int>(r.algo);
    c.ok = r.status == CUDNN_STATUS_SUCCESS;
    c.memory = r.memory;
    c.deterministic = r.determinism == CUDNN_DETERMINISTIC;
    c.tensor_op = r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    c.math = static_cast<int>(r.mathType);
    out.push_back(c);
  }
  return out;
}

// The math type a chosen algorithm runs with: float32 never uses TF32.
cudnnMathType_t math_for(DType t, int found) {
  return t == DType::F32 ? CUDNN_FMA_MATH : static_cast<cudnnMathType_t>(found);
}

const char* math_name(int m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "CUDNN_DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH: return "CUDNN_TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH: return "CUDNN_FMA_MATH";
    default: return "unknown";
  }
}

const char* op_name(ConvOp op) {
  return op == kConvFwd ? "convolution forward" : op == kConvBwdData ? "convolution backward data"
                                                                     : "convolution backward filter";
}

/// The buffers a measurement runs on: forward x, w, y; backward data w, dy, dx; backward
/// filter x, dy, dw (unused by the heuristic).
struct ConvData {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
};

/// cuDNN's ranked candidates for op: measured on d within tmp (search), or the _v7 heuristic's.
std::vector<AlgoCandidate> ranked(Context& ctx, ConvOp op, const ConvPlan& pl, const ConvData& d,
                                  const FindWorkspace* tmp) {
  cudnnHandle_t h = ctx.cudnn();
  int n = 0;
  if (op == kConvFwd) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    const int N = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    if (tmp)
      MPX_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, pl.x, d.a, pl.w, d.b, pl.conv, pl.y, d.out, N, &n,
                                                            perf, tmp->p, tmp->bytes));
    else
      MPX_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, pl.x, pl.w, pl.conv, pl.y, N, &n, perf));
    return to_candidates(perf, n);
  }
  if (op == kConvBwdData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    const int N = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    if (tmp)
      MPX_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, pl.w, d.a, pl.y, d.b, pl.conv, pl.x, d.out, N,
                                                                 &n, perf, tmp->p, tmp->bytes));
    else
      MPX_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, pl.w, pl.y, pl.conv, pl.x, N, &n, perf));
    return to_candidates(perf, n);
  }
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  const int N = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  if (tmp)
    MPX_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, pl.x, d.a, pl.y, d.b, pl.conv, pl.w, d.out, N,
                                                                 &n, perf, tmp->p, tmp->bytes));
  else
    MPX_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, pl.x, pl.y, pl.conv, pl.w, N, &n, perf));
  return to_candidates(perf, n);
}

/// The workspace of `algo` under the plan's current math type; false when cuDNN refuses it.
bool workspace_size(Context& ctx, ConvOp op, const ConvPlan& pl, int algo, size_t* ws) {
  cudnnStatus_t st;
  if (op == kConvFwd)
    st = cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn(), pl.x, pl.w, pl.conv, pl.y,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws);
  else if (op == kConvBwdData)
    st = cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.cudnn(), pl.w, pl.y, pl.conv, pl.x,
                                                      static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws);
  else
    st = cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.cudnn(), pl.x, pl.y, pl.conv, pl.w,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws);
  return st == CUDNN_STATUS_SUCCESS;
}

/// The first usable candidate (algo_choice.h) whose math type and workspace cuDNN accepts;
/// throws naming the shape when there is none.
AlgoChoice choose(Context& ctx, ConvOp op, ConvPlan& pl, const Geo& g, DType t,
                  const std::vector<AlgoCandidate>& cands, size_t budget, bool deterministic) {
  for (const AlgoCandidate& c : usable_candidates(cands, t == DType::F32, budget, deterministic)) {
    const cudnnMathType_t m = math_for(t, c.math);
    if (cudnnSetConvolutionMathType(pl.conv, m) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (!workspace_size(ctx, op, pl, c.algo, &ws) || ws > budget) continue;
    return AlgoChoice{c.algo, static_cast<int>(m), ws, c.deterministic};
  }
  throw Error("cuDNN: unsupported configuration, no " + std::string(deterministic ? "deterministic " : "") +
              "algorithm for " + conv_what(op_name(op), g, t) + " within a workspace of " +
              std::to_string(budget >> 20) + " MiB (" + std::to_string(cands.size()) + " ranked by cuDNN)" +
              (deterministic ? "; cuda.deterministic: false allows the others" : "; raise cuda.workspace_mb"));
}

/// The plan of op on g: its descriptors, and the algorithm from the process-wide cache (chosen
/// the first time the process sees the key, with the Context's settings).
ConvPlan* build(Context& ctx, ConvOp op, const PlanKey& key, const Geo& g, DType t, const ConvData& d) {
  auto plan = std::make_unique<ConvPlan>();
  make_descriptors(*plan, g, t);
  const AlgoSettings s = ctx.algo_settings();
  bool chosen_now = false;
  const AlgoChoice c = AlgoCache::process().get(
      algo_key(ctx.device(), key.v.data(), key.n, s),
      [&] {
        if (!s.search) return choose(ctx, op, *plan, g, t, ranked(ctx, op, *plan, d, nullptr), s.budget, s.deterministic);
        FindWorkspace tmp(s.budget);
        return choose(ctx, op, *plan, g, t, ranked(ctx, op, *plan, d, &tmp), tmp.bytes, s.deterministic);
      },
      &chosen_now);
  MPX_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, static_cast<cudnnMathType_t>(c.math)));
  if (op == kConvFwd) plan->fwd = static_cast<cudnnConvolutionFwdAlgo_t>(c.algo);
  if (op == kConvBwdData) plan->bwd_data = static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo);
  if (op == kConvBwdFilter) plan->bwd_filter = static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo);
  plan->ws_bytes = c.workspace;
  const std::string what = conv_what(op_name(op), g, t);
  spdlog::debug("cuDNN plan: {}: algorithm {} ({}deterministic), math {}, workspace {} bytes ({}{})", what, c.algo,
                c.deterministic ? "" : "non-", math_name(c.math), c.workspace, s.search ? "measured" : "heuristic",
                chosen_now ? "" : ", from the process cache");
  ctx.note_plan(PlanReport{"cudnn", what,
                           std::to_string(c.algo) + (c.deterministic ? " (deterministic)" : " (non-deterministic)") +
                               (s.search ? ", measured" : ", heuristic"),
                           math_name(c.math), c.workspace});
  return plan.release();
}

/// The input cuDNN reads: x itself, or x padded (spatially, in channels) into the planned buffer.
Tensor conv_input(Context& ctx, const Geo& g, const Tensor& x) {
  if (!g.padded) return x;
  const Shape s{g.N, g.Hp, g.Wp, g.Cp};
  Tensor xp(ctx.scratch(kSlotPadX, static_cast<size_t>(s.numel()) * dtype_size(x.dtype)), x.dtype, s);
  pad_nhwc(ctx, x, xp, g.top, g.left);
  return xp;
}

/// The filter cuDNN reads: w itself, or w with zero channels up to g.Cp.
Tensor conv_filter(Context& ctx, const Geo& g, const Tensor& w) {
  if (!g.channels_padded()) return w;
  const Shape s{g.K, g.R, g.S, g.Cp};
  Tensor wp(ctx.scratch(kSlotPadW, static_cast<size_t>(s.numel()) * dtype_size(w.dtype)), w.dtype, s);
  pad_nhwc(ctx, w, wp, 0, 0);
  return wp;
}

void* workspace(Context& ctx, const ConvPlan& plan) {
  return plan.ws_bytes ? ctx.scratch(kSlotWorkspace, plan.ws_bytes) : nullptr;
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
    make_descriptors(plan, g, t);
    const AlgoSettings s = ctx.algo_settings();
    for (ConvOp op : {kConvFwd, kConvBwdFilter})
      choose(ctx, op, plan, g, t, ranked(ctx, op, plan, ConvData{}, nullptr), s.budget, s.deterministic);
    try {
      choose(ctx, kConvBwdData, plan, g, t, ranked(ctx, kConvBwdData, plan, ConvData{}, nullptr), s.budget,
             s.deterministic);
    } catch (const Error& e) {
      out.input_grad = false;
      out.input_grad_reason = e.what();
    }
  } catch (const Error& e) {
    return {false, e.what()};
  }
  return out;
}

void conv2d_forward(Context& ctx, const Conv2dParams& p, const Tensor& x, const Tensor& w, const Tensor& bias,
                    const Tensor& y, Activation act, const Tensor& pre) {
  const Geo g = geometry(p, x.shape, w.shape, x.dtype);
  if (y.numel() == 0) return;
  const Tensor xin = conv_input(ctx, g, x);
  const Tensor win = conv_filter(ctx, g, w);
  const PlanKey key = conv_key(kConvFwd, p, g, x.dtype, xin.data, win.data, y.data);
  ConvPlan& plan = ctx.plan<ConvPlan>(
      key, [&] { return build(ctx, kConvFwd, key, g, x.dtype, ConvData{xin.data, win.data, y.data}); });
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = workspace(ctx, plan);
  MPX_CUDNN_CHECK(cudnnConvolutionForward(ctx.cudnn(), &alpha, plan.x, xin.data, plan.w, win.data, plan.conv,
                                          plan.fwd, ws, plan.ws_bytes, &beta, plan.y, y.data));
  bias_activation(ctx, y, bias, act, pre);
}

void conv2d_backward_data(Context& ctx, const Conv2dParams& p, const Tensor& dy, const Tensor& w,
                          const Tensor& dx) {
  const Geo g = geometry(p, dx.shape, w.shape, dx.dtype);
  if (dx.numel() == 0) return;
  const Tensor win = conv_filter(ctx, g, w);
  Tensor dxin = dx;
  if (g.padded) {
    const Shape s{g.N, g.Hp, g.Wp, g.Cp};
    dxin = Tensor(ctx.scratch(kSlotPadDX, static_cast<size_t>(s.numel()) * dtype_size(dx.dtype)), dx.dtype, s);
  }
  const PlanKey key = conv_key(kConvBwdData, p, g, dx.dtype, win.data, dy.data, dxin.data);
  ConvPlan& plan = ctx.plan<ConvPlan>(
      key, [&] { return build(ctx, kConvBwdData, key, g, dx.dtype, ConvData{win.data, dy.data, dxin.data}); });
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = workspace(ctx, plan);
  MPX_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &alpha, plan.w, win.data, plan.y, dy.data, plan.conv,
                                               plan.bwd_data, ws, plan.ws_bytes, &beta, plan.x, dxin.data));
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
  const PlanKey key = conv_key(kConvBwdFilter, p, g, x.dtype, xin.data, dy.data, dwout.data);
  ConvPlan& plan = ctx.plan<ConvPlan>(
      key, [&] { return build(ctx, kConvBwdFilter, key, g, x.dtype, ConvData{xin.data, dy.data, dwout.data}); });
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = workspace(ctx, plan);
  MPX_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &alpha, plan.x, xin.data, plan.y, dy.data, plan.conv,
                                                 plan.bwd_filter, ws, plan.ws_bytes, &beta, plan.w, dwout.data));
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
