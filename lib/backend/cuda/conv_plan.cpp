// SPDX-License-Identifier: MIT
// cuDNN convolution plans (conv_plan.h): the legacy convolution API's descriptors, the
// ranked candidates (the _v7 heuristic, or cudnnFind*AlgorithmEx under cuda.conv_algo:
// search), the first usable one (algo_choice.h), and the call of each pass.
#include "backend/cuda/conv_plan.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

const char* pass_name(ConvPass pass, ConvGroups groups) {
  const bool dw = groups == ConvGroups::Depthwise;
  switch (pass) {
    case ConvPass::Forward: return dw ? "depthwise convolution forward" : "convolution forward";
    case ConvPass::BackwardData: return dw ? "depthwise convolution backward data" : "convolution backward data";
    case ConvPass::BackwardFilter:
      return dw ? "depthwise convolution backward filter" : "convolution backward filter";
  }
  return "convolution";
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

/// The math type a chosen algorithm runs with: float32 never uses TF32.
cudnnMathType_t math_for(DType t, int found) {
  return t == DType::F32 ? CUDNN_FMA_MATH : static_cast<cudnnMathType_t>(found);
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

/// cuDNN's ranked candidates for the pass: measured on d within tmp (search), or the _v7
/// heuristic's (tmp null; d unused).
std::vector<AlgoCandidate> ranked(Context& ctx, ConvPass pass, const ConvPlan& pl, const ConvData& d,
                                  const FindWorkspace* tmp) {
  cudnnHandle_t h = ctx.cudnn();
  int n = 0;
  if (pass == ConvPass::Forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    const int N = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    if (tmp)
      MPX_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, pl.x, d.a, pl.w, d.b, pl.conv, pl.y, d.out, N, &n,
                                                            perf, tmp->p, tmp->bytes));
    else
      MPX_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, pl.x, pl.w, pl.conv, pl.y, N, &n, perf));
    return to_candidates(perf, n);
  }
  if (pass == ConvPass::BackwardData) {
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
bool workspace_size(Context& ctx, ConvPass pass, const ConvPlan& pl, int algo, size_t* ws) {
  cudnnStatus_t st;
  if (pass == ConvPass::Forward)
    st = cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn(), pl.x, pl.w, pl.conv, pl.y,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws);
  else if (pass == ConvPass::BackwardData)
    st = cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.cudnn(), pl.w, pl.y, pl.conv, pl.x,
                                                      static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws);
  else
    st = cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx.cudnn(), pl.x, pl.y, pl.conv, pl.w,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws);
  return st == CUDNN_STATUS_SUCCESS;
}

/// The first usable candidate (algo_choice.h) whose math type and workspace cuDNN accepts;
/// throws naming the shape when there is none.
AlgoChoice choose(Context& ctx, ConvPass pass, ConvGroups groups, ConvPlan& pl, const ConvGeo& g, DType t,
                  const std::vector<AlgoCandidate>& cands, size_t budget, bool deterministic) {
  for (const AlgoCandidate& c : usable_candidates(cands, t == DType::F32, budget, deterministic)) {
    const cudnnMathType_t m = math_for(t, c.math);
    if (cudnnSetConvolutionMathType(pl.conv, m) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (!workspace_size(ctx, pass, pl, c.algo, &ws) || ws > budget) continue;
    return AlgoChoice{c.algo, static_cast<int>(m), ws, c.deterministic};
  }
  throw Error("cuDNN: unsupported configuration, no " + std::string(deterministic ? "deterministic " : "") +
              "algorithm for " + conv_what(pass, groups, g, t) + " within a workspace of " +
              std::to_string(budget >> 20) + " MiB (" + std::to_string(cands.size()) + " ranked by cuDNN)" +
              (deterministic ? "; cuda.deterministic: false allows the others" : "; raise cuda.workspace_mb"));
}

/// The plan of the pass on g: its descriptors, and the algorithm from the process-wide cache
/// (chosen the first time the process sees the key, with the Context's settings).
ConvPlan* build(Context& ctx, ConvPass pass, ConvGroups groups, const PlanKey& key, const ConvGeo& g, DType t,
                const ConvData& d) {
  auto plan = std::make_unique<ConvPlan>();
  make_conv_descriptors(*plan, groups, g, t);
  const AlgoSettings s = ctx.algo_settings();
  bool chosen_now = false;
  const AlgoChoice c = AlgoCache::process().get(
      algo_key(ctx.device(), key.v.data(), key.n, s),
      [&] {
        if (!s.search)
          return choose(ctx, pass, groups, *plan, g, t, ranked(ctx, pass, *plan, d, nullptr), s.budget,
                        s.deterministic);
        FindWorkspace tmp(s.budget);
        return choose(ctx, pass, groups, *plan, g, t, ranked(ctx, pass, *plan, d, &tmp), tmp.bytes, s.deterministic);
      },
      &chosen_now);
  MPX_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, static_cast<cudnnMathType_t>(c.math)));
  plan->algo = c.algo;
  plan->ws_bytes = c.workspace;
  const std::string what = conv_what(pass, groups, g, t);
  spdlog::debug("cuDNN plan: {}: algorithm {} ({}deterministic), math {}, workspace {} bytes ({}{})", what, c.algo,
                c.deterministic ? "" : "non-", math_name(c.math), c.workspace, s.search ? "measured" : "heuristic",
                chosen_now ? "" : ", from the process cache");
  ctx.note_plan(PlanReport{"cudnn", what,
                           std::to_string(c.algo) + (c.deterministic ? " (deterministic)" : " (non-deterministic)") +
                               (s.search ? ", measured" : ", heuristic"),
                           math_name(c.math), c.workspace});
  return plan.release();
}

}  // namespace

ConvPlan::~ConvPlan() {
  auto log = [](const char* what, cudnnStatus_t s) {
    if (s != CUDNN_STATUS_SUCCESS) spdlog::error("cuDNN: {} failed: {}", what, cudnnGetErrorString(s));
  };
  if (x) log("cudnnDestroyTensorDescriptor", cudnnDestroyTensorDescriptor(x));
  if (y) log("cudnnDestroyTensorDescriptor", cudnnDestroyTensorDescriptor(y));
  if (w) log("cudnnDestroyFilterDescriptor", cudnnDestroyFilterDescriptor(w));
  if (conv) log("cudnnDestroyConvolutionDescriptor", cudnnDestroyConvolutionDescriptor(conv));
}

std::string conv_what(ConvPass pass, ConvGroups groups, const ConvGeo& g, DType t) {
  const bool dw = groups == ConvGroups::Depthwise;
  return std::string(pass_name(pass, groups)) + " (" + dtype_name(t) + ") for x [" + std::to_string(g.N) + ", " +
         std::to_string(g.H) + ", " + std::to_string(g.W) + ", " + std::to_string(g.C) + "], w [" +
         std::to_string(g.K) + ", " + std::to_string(g.R) + ", " + std::to_string(g.S) + ", " +
         std::to_string(dw ? 1 : g.C) + "], stride " + std::to_string(g.sh) + "x" + std::to_string(g.sw) +
         (g.channels_padded() ? " (channels padded to " + std::to_string(g.Cp) + ")" : "");
}

void make_conv_descriptors(ConvPlan& plan, ConvGroups groups, const ConvGeo& g, DType t) {
  const bool dw = groups == ConvGroups::Depthwise;
  // A depthwise plan's channels are never padded: padding would change the groups.
  MPX_CHECK_MSG(!dw || !g.channels_padded(), "depthwise convolution with padded channels");
  const cudnnDataType_t dt = cudnn_dtype(t);
  MPX_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.x));
  MPX_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.y));
  MPX_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan.w));
  MPX_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan.conv));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.Cp), static_cast<int>(g.Hp), static_cast<int>(g.Wp)));
  MPX_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NHWC, dt, static_cast<int>(g.N),
                                             static_cast<int>(g.K), static_cast<int>(g.P), static_cast<int>(g.Q)));
  // cuDNN's NHWC filter layout: KRSC, with C the channels one filter reads.
  MPX_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan.w, dt, CUDNN_TENSOR_NHWC, static_cast<int>(g.K),
                                             dw ? 1 : static_cast<int>(g.Cp), static_cast<int>(g.R),
                                             static_cast<int>(g.S)));
  MPX_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan.conv, g.ph, g.pw, g.sh, g.sw, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
  if (dw) MPX_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan.conv, static_cast<int>(g.C)));
  MPX_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, t == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  int n = 0, c = 0, h = 0, w = 0;
  MPX_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(plan.conv, plan.x, plan.w, &n, &c, &h, &w));
  MPX_CHECK_MSG(n == g.N && c == g.K && h == g.P && w == g.Q,
                "cuDNN output shape differs from Conv2dParams (padding translation bug)");
}

AlgoChoice choose_conv_heuristic(Context& ctx, ConvPass pass, ConvGroups groups, ConvPlan& plan, const ConvGeo& g,
                                 DType t, const AlgoSettings& s) {
  return choose(ctx, pass, groups, plan, g, t, ranked(ctx, pass, plan, ConvData{}, nullptr), s.budget,
                s.deterministic);
}

ConvPlan& conv_plan(Context& ctx, ConvPass pass, ConvGroups groups, const Conv2dParams& p, const ConvGeo& g,
                    DType t, const ConvData& d) {
  // Op codes 101-103 (full) and 131-133 (depthwise): a full and a depthwise convolution of
  // one shape never share a plan.
  const int64_t op = (groups == ConvGroups::Depthwise ? 130 : 100) + static_cast<int64_t>(pass);
  PlanKey key;
  key << op << static_cast<int64_t>(t) << g.N << g.H << g.W << g.C << g.K << g.R << g.S << p.stride_h << p.stride_w
      << p.pad_top << p.pad_left << p.pad_bottom << p.pad_right << pointer_alignment(d.a) << pointer_alignment(d.b)
      << pointer_alignment(d.out);
  return ctx.plan<ConvPlan>(key, [&] { return build(ctx, pass, groups, key, g, t, d); });
}

Tensor conv_input(Context& ctx, const ConvGeo& g, const Tensor& x) {
  if (!g.padded) return x;
  const Shape s{g.N, g.Hp, g.Wp, g.Cp};
  Tensor xp(ctx.scratch(kSlotPadX, static_cast<size_t>(s.numel()) * dtype_size(x.dtype)), x.dtype, s);
  pad_nhwc(ctx, x, xp, g.top, g.left);
  return xp;
}

Tensor conv_input_grad(Context& ctx, const ConvGeo& g, const Tensor& dx) {
  if (!g.padded) return dx;
  const Shape s{g.N, g.Hp, g.Wp, g.Cp};
  return Tensor(ctx.scratch(kSlotPadDX, static_cast<size_t>(s.numel()) * dtype_size(dx.dtype)), dx.dtype, s);
}

void run_conv(Context& ctx, ConvPass pass, const ConvPlan& plan, const ConvData& d) {
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = plan.ws_bytes ? ctx.scratch(kSlotWorkspace, plan.ws_bytes) : nullptr;
  cudnnHandle_t h = ctx.cudnn();
  switch (pass) {
    case ConvPass::Forward:
      MPX_CUDNN_CHECK(cudnnConvolutionForward(h, &alpha, plan.x, d.a, plan.w, d.b, plan.conv,
                                              static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), ws, plan.ws_bytes,
                                              &beta, plan.y, d.out));
      return;
    case ConvPass::BackwardData:
      MPX_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &alpha, plan.w, d.a, plan.y, d.b, plan.conv,
                                                   static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo), ws,
                                                   plan.ws_bytes, &beta, plan.x, d.out));
      return;
    case ConvPass::BackwardFilter:
      MPX_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &alpha, plan.x, d.a, plan.y, d.b, plan.conv,
                                                     static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo), ws,
                                                     plan.ws_bytes, &beta, plan.w, d.out));
      return;
  }
}

}  // namespace mpx::cuda
