// SPDX-License-Identifier: MIT
// Dense (fully connected) layer through cuBLASLt: x [N, Cin], w [Cout, Cin],
// y [N, Cout], row-major, i.e. the column-major products below. 16-bit (or
// float32) A/B, CUBLAS_COMPUTE_32F (never TF32), output rounded once; bias and
// the activations cuBLASLt has (epilogue_for) run as cuBLASLt epilogues when the bias
// has the output's dtype, everything else (relu included: NaN stays NaN, epilogue_rule.h)
// as one kernel after the matmul
// (bias_activation); the bias gradient is a deterministic column sum (activation.cu).
// One plan (descriptors, layouts, heuristic algorithm) per shape, dtype, epilogue and
// pointer alignment: the heuristic ranks several algorithms and the first that runs is
// kept (first_that_runs.h). Twin of cpu/dense.cpp.
#include <cublasLt.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/epilogue_rule.h"
#include "backend/cuda/first_that_runs.h"
#include "backend/cuda/ops.h"

namespace mpx::cuda {

namespace {

/// Workspace a matmul algorithm may use (cuBLASLt's recommendation for Hopper is 32 MiB).
constexpr size_t kMatmulWorkspace = size_t{32} << 20;
/// Algorithms asked of the heuristic per product; the first that runs is kept (first_that_runs.h).
constexpr int kHeuristicCandidates = 8;

enum DenseOp : int64_t { kDenseFwd = 201, kDenseBwdData = 202, kDenseBwdWeights = 203 };

struct MatmulPlan : Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t ws_bytes = 0;
  bool epilogue = false;  // the wanted epilogue (bias, activation, aux) is fused

  ~MatmulPlan() override {
    auto log = [](const char* what, cublasStatus_t s) {
      if (s != CUBLAS_STATUS_SUCCESS) spdlog::error("cuBLASLt: {} failed: {}", what, cublasGetStatusString(s));
    };
    if (a) log("cublasLtMatrixLayoutDestroy", cublasLtMatrixLayoutDestroy(a));
    if (b) log("cublasLtMatrixLayoutDestroy", cublasLtMatrixLayoutDestroy(b));
    if (d) log("cublasLtMatrixLayoutDestroy", cublasLtMatrixLayoutDestroy(d));
    if (op) log("cublasLtMatmulDescDestroy", cublasLtMatmulDescDestroy(op));
  }
};

/// One column-major product D (m x n) = op(A) (m x k) * op(B) (k x n).
struct Gemm {
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  int64_t rows_a, cols_a, lda;  // A as stored (column-major)
  int64_t rows_b, cols_b, ldb;
  int64_t ldd;
  DType ab, dt;                 // operand dtype, output dtype
  cublasLtEpilogue_t epilogue;
  const void *pa, *pb, *pbias;  // for the alignment of the plan
  void* pd;
  void* paux = nullptr;         // GELU_AUX epilogues: the pre-activation, [m x n] with ld m
};

bool epilogue_has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool epilogue_has_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool epilogue_has_activation(cublasLtEpilogue_t e) {
  return e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS;
}

/// The one place that says which activations cuBLASLt fuses into the forward matmul
/// (epilogue_rule.h says which may be fused at all):
///  - relu: never (cuBLASLt's RELU epilogue turns NaN into 0; the relu kernel keeps it);
///  - gelu_tanh: GELU / GELU_BIAS, or GELU_AUX / GELU_AUX_BIAS when the backward wants the
///    pre-activation (the aux matrix; its leading dimension m must be a multiple of 8).
///    cuBLASLt's GELU is the tanh approximation (PyTorch fuses it only for
///    approximate='tanh'), so gelu (the erf form) is not fused.
/// Otherwise BIAS or DEFAULT, and bias_activation() does the rest after the matmul. With a
/// bias that cannot be fused (another dtype), nothing is: the bias comes before the activation.
cublasLtEpilogue_t epilogue_for(Activation act, const Tensor& bias, bool fuse_bias, const Tensor& pre, int64_t m) {
  if (!bias.empty() && !fuse_bias) return CUBLASLT_EPILOGUE_DEFAULT;
  const cublasLtEpilogue_t plain = fuse_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (!cublaslt_fuses_activation(act.kind)) return plain;
  switch (act.kind) {
    case ActKind::GeluTanh:
      if (pre.empty()) return fuse_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      if (m % 8 == 0 && pointer_alignment(pre.data) >= 16)
        return fuse_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      break;
    default:
      break;
  }
  return plain;
}

std::string gemm_what(const char* op, const Gemm& g) {
  return std::string(op) + " (" + dtype_name(g.ab) + " -> " + dtype_name(g.dt) + ", m=" + std::to_string(g.m) +
         ", n=" + std::to_string(g.n) + ", k=" + std::to_string(g.k) + ")";
}

/// Descriptors and layouts of one product (no algorithm yet).
std::unique_ptr<MatmulPlan> make_plan(const Gemm& g) {
  auto plan = std::make_unique<MatmulPlan>();
  MPX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MPX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof(g.ta)));
  MPX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb, sizeof(g.tb)));
  MPX_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof(g.epilogue)));
  if (epilogue_has_bias(g.epilogue))
    MPX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.pbias, sizeof(g.pbias)));
  if (epilogue_has_aux(g.epilogue)) {
    const int64_t ld = g.m;
    MPX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.paux, sizeof(g.paux)));
    MPX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  plan->epilogue = g.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  MPX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, cuda_dtype(g.ab), static_cast<uint64_t>(g.rows_a),
                                              static_cast<uint64_t>(g.cols_a), g.lda));
  MPX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, cuda_dtype(g.ab), static_cast<uint64_t>(g.rows_b),
                                              static_cast<uint64_t>(g.cols_b), g.ldb));
  MPX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, cuda_dtype(g.dt), static_cast<uint64_t>(g.m),
                                              static_cast<uint64_t>(g.n), g.ldd));
  return plan;
}

/// Up to kHeuristicCandidates algorithms the heuristic ranks for the plan, best first (empty
/// when it has none); `error` names the status when the heuristic itself fails.
std::vector<cublasLtMatmulHeuristicResult_t> heuristic(Context& ctx, const MatmulPlan& plan, const Gemm& g,
                                                       std::string& error) {
  cublasLtMatmulPreference_t pref = nullptr;
  MPX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<void, void (*)(void*)> pref_guard(pref, [](void* p) {
    const cublasStatus_t s = cublasLtMatmulPreferenceDestroy(static_cast<cublasLtMatmulPreference_t>(p));
    if (s != CUBLAS_STATUS_SUCCESS) spdlog::error("cuBLASLt: cublasLtMatmulPreferenceDestroy failed");
  });
  const size_t ws = kMatmulWorkspace;
  MPX_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Arena views sit at any element offset: tell the heuristic the real alignments.
  const uint32_t al_a = static_cast<uint32_t>(pointer_alignment(g.pa));
  const uint32_t al_b = static_cast<uint32_t>(pointer_alignment(g.pb));
  const uint32_t al_d = static_cast<uint32_t>(pointer_alignment(g.pd));
  MPX_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  MPX_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  MPX_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
  MPX_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(kHeuristicCandidates);
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), plan.op, plan.a, plan.b, plan.d, plan.d,
                                                           pref, kHeuristicCandidates, results.data(), &found);
  if (st != CUBLAS_STATUS_SUCCESS) {
    error = std::string("cublasLtMatmulAlgoGetHeuristic: ") + cublasGetStatusString(st);
    return {};
  }
  std::vector<cublasLtMatmulHeuristicResult_t> ok;
  for (int i = 0; i < found; ++i)
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) ok.push_back(results[static_cast<size_t>(i)]);
  return ok;
}

/// Runs the product once with candidate r (its output is overwritten by the real call right
/// after): "" when it ran, else why not.
std::string try_candidate(Context& ctx, const MatmulPlan& plan, const Gemm& g,
                          const cublasLtMatmulHeuristicResult_t& r) {
  cublasLtMatmulHeuristicResult_t check{};
  cublasStatus_t s = cublasLtMatmulAlgoCheck(ctx.cublaslt(), plan.op, plan.a, plan.b, plan.d, plan.d, &r.algo, &check);
  if (s != CUBLAS_STATUS_SUCCESS) return std::string("cublasLtMatmulAlgoCheck: ") + cublasGetStatusString(s);
  void* ws = r.workspaceSize ? ctx.scratch(kSlotWorkspace, r.workspaceSize) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  s = cublasLtMatmul(ctx.cublaslt(), plan.op, &alpha, g.pa, plan.a, g.pb, plan.b, &beta, g.pd, plan.d, g.pd, plan.d,
                     &r.algo, ws, r.workspaceSize, ctx.stream());
  if (s != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();  // a refused launch leaves nothing queued
    return std::string("cublasLtMatmul: ") + cublasGetStatusString(s);
  }
  return "";
}

int algo_id(const cublasLtMatmulAlgo_t& algo) {
  int id = -1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written) !=
      CUBLAS_STATUS_SUCCESS)
    return -1;
  return id;
}

/// The plan of g with the first of the heuristic's candidates that runs; its plan is nullptr
/// (reasons in failures / heuristic_error) when none does.
PlanAttempt<MatmulPlan> build(Context& ctx, const Gemm& g) {
  PlanAttempt<MatmulPlan> a;
  std::unique_ptr<MatmulPlan> plan = make_plan(g);
  const std::vector<cublasLtMatmulHeuristicResult_t> cands = heuristic(ctx, *plan, g, a.heuristic_error);
  const std::optional<size_t> i = first_that_runs(
      cands, [&](const cublasLtMatmulHeuristicResult_t& r) { return try_candidate(ctx, *plan, g, r); }, a.failures);
  if (!i) return a;
  plan->algo = cands[*i].algo;
  plan->ws_bytes = cands[*i].workspaceSize;
  if (*i > 0)
    spdlog::warn("cuBLASLt: {}: the heuristic's first {} algorithm(s) did not run ({}); using candidate {}",
                 gemm_what("matmul", g), *i, a.failures.back(), *i + 1);
  a.plan = plan.release();
  return a;
}

/// D = op(A) op(B) [with g.epilogue]. Returns true when the epilogue ran fused; false when
/// cuBLASLt has no algorithm for it and the plain product ran (the caller finishes with
/// bias_activation()).
bool run_gemm(Context& ctx, DenseOp which, Gemm g) {
  const cublasLtEpilogue_t wanted = g.epilogue;
  PlanKey key;
  key << which << static_cast<int64_t>(g.ab) << static_cast<int64_t>(g.dt) << g.m << g.n << g.k << wanted
      << pointer_alignment(g.pa) << pointer_alignment(g.pb) << pointer_alignment(g.pd)
      << (g.pbias ? pointer_alignment(g.pbias) : 0) << (g.paux ? pointer_alignment(g.paux) : 0);
  MatmulPlan& plan = ctx.plan<MatmulPlan>(key, [&] {
    bool fused = false;
    const PlanAttempt<MatmulPlan> a = epilogue_or_plain<MatmulPlan>(
        wanted != CUBLASLT_EPILOGUE_DEFAULT,
        [&](bool with_epilogue) {
          if (!with_epilogue && wanted != CUBLASLT_EPILOGUE_DEFAULT) {
            spdlog::debug("cuBLASLt: {}: no algorithm with epilogue {} ran; the epilogue runs as a kernel",
                          gemm_what("matmul", g), static_cast<int>(wanted));
            g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
          }
          return build(ctx, g);
        },
        fused);
    MatmulPlan* p = a.plan;
    if (!p)
      throw Error(none_ran_message("cuBLASLt: unsupported configuration, no algorithm for " + gemm_what("matmul", g),
                                   a.failures, a.heuristic_error));
    const std::string what = gemm_what(which == kDenseFwd       ? "dense forward"
                                       : which == kDenseBwdData ? "dense backward data"
                                                                : "dense backward weights",
                                       g);
    spdlog::debug("cuBLASLt plan: {}: algorithm id {}, epilogue {}, workspace {} bytes", what, algo_id(p->algo),
                  p->epilogue ? static_cast<int>(g.epilogue) : 0, p->ws_bytes);
    ctx.note_plan(PlanReport{"cublaslt", what, "id " + std::to_string(algo_id(p->algo)),
                             "CUBLAS_COMPUTE_32F", p->ws_bytes});
    return p;
  });
  if (plan.epilogue && epilogue_has_bias(wanted))
    MPX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.pbias, sizeof(g.pbias)));
  if (plan.epilogue && epilogue_has_aux(wanted))
    MPX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.paux, sizeof(g.paux)));
  void* ws = plan.ws_bytes ? ctx.scratch(kSlotWorkspace, plan.ws_bytes) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  MPX_CUBLAS_CHECK(cublasLtMatmul(ctx.cublaslt(), plan.op, &alpha, g.pa, plan.a, g.pb, plan.b, &beta, g.pd, plan.d,
                                  g.pd, plan.d, &plan.algo, ws, plan.ws_bytes, ctx.stream()));
  return plan.epilogue || wanted == CUBLASLT_EPILOGUE_DEFAULT;
}

/// `t` as a tensor of `dtype`: itself, or (a float32 layer's 16-bit input) a float32 view of
/// the widening slot, filled from `t` when `fill_it`. cuBLASLt multiplies A and B of one type.
Tensor as_dtype(Context& ctx, const Tensor& t, DType dtype, bool fill_it) {
  if (t.dtype == dtype) return t;
  Tensor w = t;
  w.dtype = dtype;
  w.data = ctx.scratch(kSlotWiden, static_cast<size_t>(t.numel()) * dtype_size(dtype));
  if (fill_it) cast(ctx, t, w);
  return w;
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------

// y^T (Co x N) = w^T (w stored Ci x Co, transposed) * x^T (Ci x N).
void dense_forward(Context& ctx, const Tensor& x_in, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act, const Tensor& pre) {
  const int64_t N = x_in.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const Tensor x = N > 0 && Ci > 0 ? as_dtype(ctx, x_in, w.dtype, true) : x_in;
  if (N == 0 || Co == 0) return;
  if (Ci == 0) {  // empty sum: y = act(bias)
    fill(ctx, y, 0.0f);
    bias_activation(ctx, y, bias, act, pre);
    return;
  }
  const bool fuse_bias = !bias.empty() && bias.dtype == y.dtype;
  const cublasLtEpilogue_t ep = epilogue_for(act, bias, fuse_bias, pre, Co);
  const Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, Co, N, Ci, Ci, Co, Ci, Ci, N, Ci, Co, x.dtype, y.dtype, ep,
               w.data, x.data, epilogue_has_bias(ep) ? bias.data : nullptr, y.data,
               epilogue_has_aux(ep) ? pre.data : nullptr};
  if (!run_gemm(ctx, kDenseFwd, g)) {  // no algorithm with the epilogue: all of it after the product
    bias_activation(ctx, y, bias, act, pre);
    return;
  }
  // What the epilogue did not do (nothing when it did it all).
  bias_activation(ctx, y, epilogue_has_bias(ep) ? Tensor() : bias, epilogue_has_activation(ep) ? Activation() : act,
                  epilogue_has_aux(ep) || epilogue_has_activation(ep) ? Tensor() : pre);
}

// dx^T (Ci x N) = w (stored Ci x Co) * dy^T (Co x N).
void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx_out) {
  const int64_t N = dx_out.shape[0], Co = w.shape[0], Ci = w.shape[1];
  if (N == 0 || Ci == 0) return;
  if (Co == 0) {
    fill(ctx, dx_out, 0.0f);
    return;
  }
  const Tensor dx = as_dtype(ctx, dx_out, dy.dtype, false);  // a 16-bit dx: float32, then one rounding
  const Gemm g{CUBLAS_OP_N, CUBLAS_OP_N, Ci, N, Co, Ci, Co, Ci, Co, N, Co, Ci, dy.dtype, dx.dtype,
               CUBLASLT_EPILOGUE_DEFAULT, w.data, dy.data, nullptr, dx.data};
  run_gemm(ctx, kDenseBwdData, g);
  if (dx.data != dx_out.data) cast(ctx, dx, dx_out);
}

// dw^T (Ci x Co) = x^T (Ci x N) * dy (dy stored Co x N, transposed). dw may be float32
// with 16-bit operands (cuBLASLt's 16F/16BF x 16F/16BF -> 32F).
void dense_backward_weights(Context& ctx, const Tensor& x_in, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  const int64_t N = x_in.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const Tensor x = N > 0 && Co > 0 && Ci > 0 ? as_dtype(ctx, x_in, dy.dtype, true) : x_in;
  if (N == 0) {
    fill(ctx, dw, 0.0f);
    if (!db.empty()) fill(ctx, db, 0.0f);
    return;
  }
  if (Co > 0 && Ci > 0) {
    const Gemm g{CUBLAS_OP_N, CUBLAS_OP_T, Ci, Co, N, Ci, N, Ci, Co, N, Co, Ci, x.dtype, dw.dtype,
                 CUBLASLT_EPILOGUE_DEFAULT, x.data, dy.data, nullptr, dw.data};
    run_gemm(ctx, kDenseBwdWeights, g);
  }
  if (!db.empty() && Co > 0) bias_backward(ctx, dy, db);
}

}  // namespace mpx::cuda
