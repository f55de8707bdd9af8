// SPDX-License-Identifier: MIT
// Dense (fully connected) layer: x [N, Cin], w [Cout, Cin] (Keras kernel
// transposed, cuBLAS-friendly), y [N, Cout]. 16-bit as in conv.cpp: oneDNN's native
// 16-bit kernels where the CPU has them (native16.h), else widened to float32.
// oneDNN inner product (bias fused; the activation a post-op where dnnl_util.h's
// exact_post_op says so, else activation_epilogue's pass, which also keeps relu's NaN) with
// the user layouts nc / oi / nc, one cached plan per shape, run on fixed chunks of rows (see
// below); the plain loops stay for MPX_CPU_REFERENCE=1.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <string>

#include "backend/cpu/dnnl_util.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/ops.h"

namespace mpx::cpu {

namespace {

// y = x w^T + b (the activation follows in activation_epilogue).
void dense_forward_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* w, const float* b,
                         float* y) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < Co; ++o) {
      const float* xi = x + n * Ci;
      const float* wo = w + o * Ci;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < Ci; ++i) acc += xi[i] * wo[i];
      acc += b ? b[o] : 0.0f;
      y[n * Co + o] = acc;
    }
}

void dense_backward_data_loops(int64_t N, int64_t Ci, int64_t Co, const float* dy, const float* w, float* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* d = dx + n * Ci;
    std::memset(d, 0, sizeof(float) * static_cast<size_t>(Ci));
    for (int64_t o = 0; o < Co; ++o) {
      const float g = dy[n * Co + o];
      const float* wo = w + o * Ci;
      for (int64_t i = 0; i < Ci; ++i) d[i] += g * wo[i];
    }
  }
}

void dense_backward_weights_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* dy, float* dw,
                                  float* db) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < Co; ++o) {
    float* d = dw + o * Ci;
    std::memset(d, 0, sizeof(float) * static_cast<size_t>(Ci));
    float bsum = 0.0f;
    for (int64_t n = 0; n < N; ++n) {
      const float g = dy[n * Co + o];
      bsum += g;
      const float* xi = x + n * Ci;
      for (int64_t i = 0; i < Ci; ++i) d[i] += g * xi[i];
    }
    if (db) db[o] = bsum;
  }
}

// ---- oneDNN inner product -------------------------------------------------------------
//
// oneDNN's gemm-based inner product changes a row's last bits with the batch size (its
// sgemm picks other kernels and blockings for another M; measured: rows of a batch of 3
// differ from the same rows of a batch of 5), while the model runs a partial last batch as
// a row slice and expects the same rows (test_nn "a partial batch uses row slices and gives
// the same rows"). Forward and backward-data therefore always run the primitive on chunks
// of kRows rows: full chunks in place, the last partial chunk through padded scratch. With
// one fixed M, a row's result depends only on that row (checked; no gemm row reads another),
// so every row comes out the same in any batch. Backward-weights sums over the batch and
// runs once on all N rows.

enum DenseOp : int64_t { kDenseFwd = 201, kDenseBwdData = 202, kDenseBwdWeights = 203 };
// The native 16-bit path (native16.h): the same ops on 16-bit operands.
enum DenseNativeOp : int64_t { kNativeFwd = 211, kNativeBwdData = 212, kNativeBwdWeights = 213 };

// The chunk: the configs' batch sizes (128, 256) are multiples, so a full batch runs
// without copies. Smaller chunks are slow for a long Cin: 256 rows of 5408 -> 10 forward
// took 60 ms in chunks of 32, 1.7 ms in chunks of 64, 1.25 ms in chunks of 128, 0.87 ms
// in one call of 256 (2 threads, AVX2); the plain loop takes ~6 ms.
constexpr int64_t kRows = 128;

struct DenseDescs {
  dnnl::memory::desc src, wei, wei_any, bias, dst;
};

// x [N, Cin] "nc", w [Cout, Cin] "oi", y [N, Cout] "nc": the user layouts. oneDNN 2.6 runs
// its gemm-based inner product on them directly (no reorders; checked on AVX2). Its AMX
// and AVX512-FP16 kernels want blocked weights (wei_any; with "oi" oneDNN 3.2 picks its
// gemm or reference kernel for 16-bit operands).
DenseDescs dense_descs(int64_t N, int64_t Ci, int64_t Co, dt src_t = dt::f32, dt wei_t = dt::f32,
                       dt dst_t = dt::f32) {
  DenseDescs d;
  d.src = dnnl::memory::desc({N, Ci}, src_t, tag::nc);
  d.wei = dnnl::memory::desc({Co, Ci}, wei_t, tag::oi);
  d.wei_any = dnnl::memory::desc({Co, Ci}, wei_t, tag::any);
  d.bias = dnnl::memory::desc({Co}, dt::f32, tag::x);
  d.dst = dnnl::memory::desc({N, Co}, dst_t, tag::nc);
  return d;
}

std::string dense_what(const char* op, int64_t N, int64_t Ci, int64_t Co) {
  return std::string(op) + " for x [" + std::to_string(N) + ", " + std::to_string(Ci) + "], w [" +
         std::to_string(Co) + ", " + std::to_string(Ci) + "]";
}

dnnl::inner_product_forward::primitive_desc dense_fwd_pd(Context& ctx, const DenseDescs& d, bool bias,
                                                         Activation fused = Activation::None) {
  // No fused ReLU post-op: oneDNN's ReLU turns NaN into 0 (measured: jit max(x, 0)),
  // and the backend keeps NaN so that check_numerics sees it (exact_post_op, dnnl_util.h).
  return dnnlc::ip_fwd(ctx.engine(), d.src, d.wei, bias ? &d.bias : nullptr, d.dst, make_attr(fused));
}

/// A primitive over kRows rows. A partial last chunk goes through the two temporary
/// scratch slots, [kRows, in_cols] and [kRows, out_cols] (grown once, shared with other ops;
/// what the rows past the chunk hold does not matter: no gemm row reads another).
struct RowsPlan : DnnlPlan {
  int arg_in = 0, arg_out = 0;
  int64_t in_cols = 0, out_cols = 0;
  size_t in_size = sizeof(float), out_size = sizeof(float);  // bytes per element
  bool usable = true;                                        // make_native (native16.h)

  /// Runs rows [0, N) of in -> out in chunks of kRows (the other arguments already bound).
  void run_rows(Context& ctx, const void* in, void* out, int64_t N) {
    const size_t in_row = in_size * static_cast<size_t>(in_cols), out_row = out_size * static_cast<size_t>(out_cols);
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t n = std::min(kRows, N - r0);
      const char* src = static_cast<const char*>(in) + static_cast<size_t>(r0) * in_row;
      char* dst = static_cast<char*>(out) + static_cast<size_t>(r0) * out_row;
      if (n == kRows) {
        bind(arg_in, src);
        bind(arg_out, dst);
        run(ctx);
      } else {
        float* pad_in = ctx.scratch(kSlotTmp0, (kRows * in_row + 3) / 4);
        float* pad_out = ctx.scratch(kSlotTmp1, (kRows * out_row + 3) / 4);
        std::memcpy(pad_in, src, in_row * static_cast<size_t>(n));
        bind(arg_in, pad_in);
        bind(arg_out, pad_out);
        run(ctx);
        std::memcpy(dst, pad_out, out_row * static_cast<size_t>(n));
      }
    }
  }
};

RowsPlan& dense_fwd_plan(Context& ctx, int64_t Ci, int64_t Co, bool bias, Activation fused) {
  PlanKey k;
  k << kDenseFwd << kRows << Ci << Co << (bias ? 1 : 0) << act_key(fused);
  return ctx.plan<RowsPlan>(k, [&] {
    return dnnl_try(dense_what("inner product forward", kRows, Ci, Co), [&] {
      auto plan = std::make_unique<RowsPlan>();
      const DenseDescs d = dense_descs(kRows, Ci, Co);
      const auto pd = dense_fwd_pd(ctx, d, bias, fused);
      plan->prim = dnnl::inner_product_forward(pd);
      plan->add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      if (bias) plan->args[DNNL_ARG_BIAS] = unbound(d.bias, ctx.engine());
      plan->add_arg(ctx, DNNL_ARG_DST, d.dst, pd.dst_desc(), true);
      plan->set_scratchpad(ctx, pd);
      plan->arg_in = DNNL_ARG_SRC, plan->arg_out = DNNL_ARG_DST, plan->in_cols = Ci, plan->out_cols = Co;
      return plan.release();
    });
  });
}

RowsPlan& dense_bwd_data_plan(Context& ctx, int64_t Ci, int64_t Co) {
  PlanKey k;
  k << kDenseBwdData << kRows << Ci << Co;
  return ctx.plan<RowsPlan>(k, [&] {
    return dnnl_try(dense_what("inner product backward data", kRows, Ci, Co), [&] {
      auto plan = std::make_unique<RowsPlan>();
      const DenseDescs d = dense_descs(kRows, Ci, Co);
      const auto hint = dense_fwd_pd(ctx, d, false);
      const auto pd = dnnlc::ip_bwd_data(ctx.engine(), d.src, d.wei, d.dst, hint, make_attr());
      plan->prim = dnnl::inner_product_backward_data(pd);
      plan->add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_SRC, d.src, pd.diff_src_desc(), true);
      plan->set_scratchpad(ctx, pd);
      plan->arg_in = DNNL_ARG_DIFF_DST, plan->arg_out = DNNL_ARG_DIFF_SRC, plan->in_cols = Co, plan->out_cols = Ci;
      return plan.release();
    });
  });
}

DnnlPlan& dense_bwd_weights_plan(Context& ctx, int64_t N, int64_t Ci, int64_t Co, bool bias) {
  PlanKey k;
  k << kDenseBwdWeights << N << Ci << Co << (bias ? 1 : 0);
  return ctx.plan<DnnlPlan>(k, [&] {
    return dnnl_try(dense_what("inner product backward weights", N, Ci, Co), [&] {
      auto plan = std::make_unique<DnnlPlan>();
      const DenseDescs d = dense_descs(N, Ci, Co);
      const auto hint = dense_fwd_pd(ctx, d, bias);
      const auto pd = dnnlc::ip_bwd_weights(ctx.engine(), d.src, d.wei, bias ? &d.bias : nullptr, d.dst, hint,
                                            make_attr());
      plan->prim = dnnl::inner_product_backward_weights(pd);
      plan->add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      plan->add_arg(ctx, DNNL_ARG_DIFF_WEIGHTS, d.wei, pd.diff_weights_desc(), true);
      if (bias) plan->args[DNNL_ARG_DIFF_BIAS] = unbound(d.bias, ctx.engine());
      plan->set_scratchpad(ctx, pd);
      return plan.release();
    });
  });
}

// ---- the native 16-bit path (native16.h): 16-bit operands, float32 accumulation ----------

PlanKey dense_native_key(DenseNativeOp op, DType t, int64_t N, int64_t Ci, int64_t Co, int64_t flags) {
  PlanKey k;
  k << op << static_cast<int64_t>(t) << N << Ci << Co << flags;
  return k;
}

/// Whether this op in dtype t may take the native path; records the widened ones.
bool dense_wants_native(Context& ctx, DType t, const PlanKey& key) {
  if (t == DType::F32) return false;
  const bool native = path16(t).native && !reference_loops();
  if (!native) ctx.note_math16(t, key, false);
  return native;
}

std::string dense_native_what(const char* op, DType t, int64_t N, int64_t Ci, int64_t Co) {
  return fmt::format("{} {} for x [{}, {}], w [{}, {}]", op, dtype_name(t), N, Ci, Co, Ci);
}

bool dense_native_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                          Activation act, const Tensor& pre) {
  const DType t = x.dtype;
  const int64_t N = x.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const Activation fused = pre.empty() && exact_post_op(act) ? act : Activation::None;
  // 16-bit output straight from oneDNN when no epilogue is left (conv_native.cpp does the same).
  const bool direct = pre.empty() && (act.is_none() || !fused.is_none());
  PlanKey key = dense_native_key(kNativeFwd, t, kRows, Ci, Co, (bias.empty() ? 0 : 1) | (direct ? 2 : 0));
  key << act_key(fused);
  if (!dense_wants_native(ctx, t, key)) return false;
  RowsPlan& plan = ctx.plan<RowsPlan>(key, [&] {
    return make_native<RowsPlan>(ctx, dense_native_what("inner product forward", t, kRows, Ci, Co), [&](RowsPlan& pl) {
      const DenseDescs d = dense_descs(kRows, Ci, Co, dnnl_dtype(t), dnnl_dtype(t), direct ? dnnl_dtype(t) : dt::f32);
      const auto pd = dnnlc::ip_fwd(ctx.engine(), d.src, d.wei_any, bias.empty() ? nullptr : &d.bias, d.dst,
                                    make_attr(fused));
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.prim = dnnl::inner_product_forward(pd);
      pl.add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      pl.add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      if (!bias.empty()) pl.args[DNNL_ARG_BIAS] = unbound(d.bias, ctx.engine());
      pl.add_arg(ctx, DNNL_ARG_DST, d.dst, pd.dst_desc(), true);
      pl.set_scratchpad(ctx, pd);
      pl.arg_in = DNNL_ARG_SRC, pl.arg_out = DNNL_ARG_DST, pl.in_cols = Ci, pl.out_cols = Co;
      pl.in_size = dtype_size(t), pl.out_size = direct ? dtype_size(t) : sizeof(float);
      return pl.impl;
    });
  });
  ctx.note_math16(t, key, plan.usable);
  if (!plan.usable) return false;
  plan.bind(DNNL_ARG_WEIGHTS, w.data);
  if (!bias.empty()) plan.bind(DNNL_ARG_BIAS, f32_in(ctx, kSlotB, bias));
  float* yf = direct ? nullptr : f32_out(ctx, kSlotY, y);
  plan.run_rows(ctx, x.data, direct ? y.data : static_cast<void*>(yf), N);
  if (!direct) activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
  return true;
}

bool dense_native_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  const DType t = dy.dtype;
  const int64_t N = dx.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const PlanKey key = dense_native_key(kNativeBwdData, t, kRows, Ci, Co, 0);
  if (!dense_wants_native(ctx, t, key)) return false;
  RowsPlan& plan = ctx.plan<RowsPlan>(key, [&] {
    const std::string what = dense_native_what("inner product backward data", t, kRows, Ci, Co);
    return make_native<RowsPlan>(ctx, what, [&](RowsPlan& pl) {
      const DenseDescs d = dense_descs(kRows, Ci, Co, dnnl_dtype(t), dnnl_dtype(t), dnnl_dtype(t));
      const auto hint = dnnlc::ip_fwd(ctx.engine(), d.src, d.wei_any, nullptr, d.dst, make_attr());
      const auto pd = dnnlc::ip_bwd_data(ctx.engine(), d.src, d.wei_any, d.dst, hint, make_attr());
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.prim = dnnl::inner_product_backward_data(pd);
      pl.add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      pl.add_arg(ctx, DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc(), false);
      pl.add_arg(ctx, DNNL_ARG_DIFF_SRC, d.src, pd.diff_src_desc(), true);
      pl.set_scratchpad(ctx, pd);
      pl.arg_in = DNNL_ARG_DIFF_DST, pl.arg_out = DNNL_ARG_DIFF_SRC, pl.in_cols = Co, pl.out_cols = Ci;
      pl.in_size = pl.out_size = dtype_size(t);
      return pl.impl;
    });
  });
  ctx.note_math16(t, key, plan.usable);
  if (!plan.usable) return false;
  plan.bind(DNNL_ARG_WEIGHTS, w.data);
  plan.run_rows(ctx, dy.data, dx.data, N);
  return true;
}

bool dense_native_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                   const Tensor& db) {
  const DType t = x.dtype;
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const PlanKey key = dense_native_key(kNativeBwdWeights, t, N, Ci, Co, db.empty() ? 0 : 1);
  if (!dense_wants_native(ctx, t, key)) return false;
  NativePlan& plan = ctx.plan<NativePlan>(key, [&] {
    const std::string what = dense_native_what("inner product backward weights", t, N, Ci, Co);
    return make_native<NativePlan>(ctx, what, [&](NativePlan& pl) {
      // float32 weight gradient, rounded to dw's dtype below (as on the widened path).
      const DenseDescs d = dense_descs(N, Ci, Co, dnnl_dtype(t), dt::f32, dnnl_dtype(t));
      const DenseDescs h = dense_descs(N, Ci, Co, dnnl_dtype(t), dnnl_dtype(t), dnnl_dtype(t));
      const auto hint = dnnlc::ip_fwd(ctx.engine(), h.src, h.wei_any, db.empty() ? nullptr : &h.bias, h.dst,
                                      make_attr());
      const auto pd = dnnlc::ip_bwd_weights(ctx.engine(), d.src, d.wei_any, db.empty() ? nullptr : &d.bias, d.dst,
                                            hint, make_attr());
      if (is_reference_impl(pd.impl_info_str())) return std::string(pd.impl_info_str());
      pl.prim = dnnl::inner_product_backward_weights(pd);
      pl.add_arg(ctx, DNNL_ARG_SRC, d.src, pd.src_desc(), false);
      pl.add_arg(ctx, DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc(), false);
      pl.add_arg(ctx, DNNL_ARG_DIFF_WEIGHTS, d.wei, pd.diff_weights_desc(), true);
      if (!db.empty()) pl.args[DNNL_ARG_DIFF_BIAS] = unbound(d.bias, ctx.engine());
      pl.set_scratchpad(ctx, pd);
      return pl.impl;
    });
  });
  ctx.note_math16(t, key, plan.usable);
  if (!plan.usable) return false;
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  plan.bind(DNNL_ARG_SRC, x.data);
  plan.bind(DNNL_ARG_DIFF_DST, dy.data);
  plan.bind(DNNL_ARG_DIFF_WEIGHTS, dwf);
  if (dbf) plan.bind(DNNL_ARG_DIFF_BIAS, dbf);
  plan.run(ctx);
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
  return true;
}

}  // namespace

void dense_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                   Activation act, const Tensor& pre) {
  if (dense_native_forward(ctx, x, w, bias, y, act, pre)) return;
  const int64_t N = x.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* wf = f32_in(ctx, kSlotW, w);
  const float* bf = bias.empty() ? nullptr : f32_in(ctx, kSlotB, bias);
  float* yf = f32_out(ctx, kSlotY, y);
  if (reference_loops()) {
    dense_forward_loops(N, Ci, Co, xf, wf, bf, yf);
    activation_epilogue(act, yf, y, pre);
    return;
  }
  const Activation fused = pre.empty() && exact_post_op(act) ? act : Activation::None;
  RowsPlan& plan = dense_fwd_plan(ctx, Ci, Co, bf != nullptr, fused);
  plan.bind(DNNL_ARG_WEIGHTS, wf);
  if (bf) plan.bind(DNNL_ARG_BIAS, bf);
  plan.run_rows(ctx, xf, yf, N);
  activation_epilogue(fused.is_none() ? act : Activation::None, yf, y, pre);
}

void dense_backward_data(Context& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx) {
  if (dense_native_backward_data(ctx, dy, w, dx)) return;
  const int64_t N = dx.shape[0], Co = w.shape[0], Ci = w.shape[1];
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  const float* wf = f32_in(ctx, kSlotW, w);
  float* dxf = f32_out(ctx, kSlotDX, dx);
  if (reference_loops()) {
    dense_backward_data_loops(N, Ci, Co, dyf, wf, dxf);
  } else {
    RowsPlan& plan = dense_bwd_data_plan(ctx, Ci, Co);
    plan.bind(DNNL_ARG_WEIGHTS, wf);
    plan.run_rows(ctx, dyf, dxf, N);
  }
  f32_commit(dxf, dx);
}

void dense_backward_weights(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& db) {
  if (dense_native_backward_weights(ctx, x, dy, dw, db)) return;
  const int64_t N = x.shape[0], Co = dw.shape[0], Ci = dw.shape[1];
  const float* xf = f32_in(ctx, kSlotX, x);
  const float* dyf = f32_in(ctx, kSlotDY, dy);
  float* dwf = f32_out(ctx, kSlotDW, dw);
  float* dbf = db.empty() ? nullptr : f32_out(ctx, kSlotDB, db);
  if (reference_loops()) {
    dense_backward_weights_loops(N, Ci, Co, xf, dyf, dwf, dbf);
  } else {
    DnnlPlan& plan = dense_bwd_weights_plan(ctx, N, Ci, Co, dbf != nullptr);
    plan.bind(DNNL_ARG_SRC, xf);
    plan.bind(DNNL_ARG_DIFF_DST, dyf);
    plan.bind(DNNL_ARG_DIFF_WEIGHTS, dwf);
    if (dbf) plan.bind(DNNL_ARG_DIFF_BIAS, dbf);
    plan.run(ctx);
  }
  f32_commit(dwf, dw);
  if (dbf) f32_commit(dbf, db);
}

}  // namespace mpx::cpu
