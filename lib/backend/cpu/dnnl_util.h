// SPDX-License-Identifier: MIT
// Small oneDNN helpers of the CPU backend: NHWC / KRSC memory descriptors,
// memory objects without a buffer (the handle is set per call), the primitive
// plan with its argument map and user-mode scratchpad, and error wrapping.
#pragma once

#include <dnnl.hpp>

#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/cpu/context.h"
#include "backend/cpu/dnnl_compat.h"
#include "core/activation.h"
#include "core/error.h"

namespace mpx::cpu {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

/// A memory object whose buffer is set with set_data_handle() before each execution.
inline dnnl::memory unbound(const dnnl::memory::desc& md, const dnnl::engine& eng) {
  return dnnl::memory(md, eng, DNNL_MEMORY_NONE);
}

/// One cached primitive: its arguments (memory objects re-pointed per call) and
/// its scratchpad, allocated once with the plan. Executing allocates nothing.
struct DnnlPlan : Plan {
  struct Reorder {
    dnnl::reorder prim;
    std::unordered_map<int, dnnl::memory> args;
  };
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  std::unordered_map<int, dnnl::memory> user;  // user-layout memory of arguments that are reordered
  std::vector<Reorder> pre, post;              // user -> primitive layout (inputs), back (outputs)

  void bind(int arg, const void* p) {
    auto it = user.find(arg);
    (it != user.end() ? it->second : args.at(arg)).set_data_handle(const_cast<void*>(p));
  }
  void run(Context& ctx) {
    for (auto& r : pre) r.prim.execute(ctx.stream(), r.args);
    prim.execute(ctx.stream(), args);
    for (auto& r : post) r.prim.execute(ctx.stream(), r.args);
    ctx.stream().wait();
  }
  /// Binds argument `arg` whose user layout is user_md while the primitive chose prim_md
  /// (format_tag::any): equal layouts are used in place; otherwise a buffer of prim_md is
  /// allocated once and a cached reorder runs before (input) or after (output) the primitive.
  void add_arg(Context& ctx, int arg, const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md,
               bool output) {
    if (user_md == prim_md) {
      args[arg] = unbound(user_md, ctx.engine());
      return;
    }
    dnnl::memory inner(prim_md, ctx.engine());
    ctx.account(prim_md.get_size());
    dnnl::memory outer = unbound(user_md, ctx.engine());
    args[arg] = inner;
    user[arg] = outer;
    Reorder r;
    if (output) {
      r.prim = dnnl::reorder(inner, outer);
      r.args = {{DNNL_ARG_FROM, inner}, {DNNL_ARG_TO, outer}};
      post.push_back(std::move(r));
    } else {
      r.prim = dnnl::reorder(outer, inner);
      r.args = {{DNNL_ARG_FROM, outer}, {DNNL_ARG_TO, inner}};
      pre.push_back(std::move(r));
    }
  }
  /// Adds the scratchpad of pd (allocated by oneDNN, counted in the backend's memory).
  template <typename PD>
  void set_scratchpad(Context& ctx, const PD& pd) {
    const dnnl::memory::desc md = pd.scratchpad_desc();
    args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(md, ctx.engine());
    ctx.account(md.get_size());
    impl = pd.impl_info_str();
  }

  // The plan of one primitive P from its descriptor pd: the primitive, its arguments in their
  // user layouts (add_arg: reordered where pd chose others; a bias as it is, when not null)
  // and pd's scratchpad. P: dnnl::convolution_* or dnnl::inner_product_* of the same pass.
  // run_forward, run_backward_data and run_weight_gradient bind and run them.
  using Desc = dnnl::memory::desc;
  template <typename P>
  void set_forward(Context& ctx, const typename P::primitive_desc& pd, const Desc& src, const Desc& wei,
                   const Desc* bias, const Desc& dst) {
    prim = P(pd);
    add_arg(ctx, DNNL_ARG_SRC, src, pd.src_desc(), false);
    add_arg(ctx, DNNL_ARG_WEIGHTS, wei, pd.weights_desc(), false);
    if (bias) args[DNNL_ARG_BIAS] = unbound(*bias, ctx.engine());
    add_arg(ctx, DNNL_ARG_DST, dst, pd.dst_desc(), true);
    set_scratchpad(ctx, pd);
  }
  template <typename P>
  void set_backward_data(Context& ctx, const typename P::primitive_desc& pd, const Desc& diff_dst, const Desc& wei,
                         const Desc& diff_src) {
    prim = P(pd);
    add_arg(ctx, DNNL_ARG_DIFF_DST, diff_dst, pd.diff_dst_desc(), false);
    add_arg(ctx, DNNL_ARG_WEIGHTS, wei, pd.weights_desc(), false);
    add_arg(ctx, DNNL_ARG_DIFF_SRC, diff_src, pd.diff_src_desc(), true);
    set_scratchpad(ctx, pd);
  }
  template <typename P>
  void set_weight_gradient(Context& ctx, const typename P::primitive_desc& pd, const Desc& src, const Desc& diff_dst,
                           const Desc& diff_wei, const Desc* diff_bias) {
    prim = P(pd);
    add_arg(ctx, DNNL_ARG_SRC, src, pd.src_desc(), false);
    add_arg(ctx, DNNL_ARG_DIFF_DST, diff_dst, pd.diff_dst_desc(), false);
    add_arg(ctx, DNNL_ARG_DIFF_WEIGHTS, diff_wei, pd.diff_weights_desc(), true);
    if (diff_bias) args[DNNL_ARG_DIFF_BIAS] = unbound(*diff_bias, ctx.engine());
    set_scratchpad(ctx, pd);
  }
};

/// The one place that says which activations run as a oneDNN eltwise post-op of a
/// convolution or inner product: those whose post-op gives activation_value's float32
/// results bit for bit, NaN kept, and whose backward reads the output (a post-op cannot
/// also return the pre-activation). Measured on oneDNN 2.6.3 (AVX2 and AVX-512 jit):
///  - leaky_relu = eltwise_relu with alpha: equal bit for bit, NaN kept.
///  - relu = eltwise_relu with alpha 0: a jit max(x, 0) that turns NaN into 0, so not here;
///    conv2d_forward fuses it all the same (conv.cpp says why), dense keeps NaN.
///  - gelu (eltwise_gelu_erf), gelu_tanh (eltwise_gelu_tanh), silu (eltwise_swish): their
///    backward reads the pre-activation; and oneDNN's forms differ from ours (on a conv
///    output in [-19, 19]: gelu_erf up to 2.6e-7 absolute error against float64 where ours
///    has 1.1e-7, and zero or the wrong sign far in the negative tail; swish 4 ulp where
///    ours has 2).
/// An activation without a post-op runs in activation_epilogue (activation.cpp).
inline bool exact_post_op(Activation act) { return act.kind == ActKind::LeakyRelu; }

/// Binds a forward plan's arguments (src x, weights w, bias b when not null, dst y) and runs it
/// (convolutions, depthwise convolutions, inner products).
inline void run_forward(Context& ctx, DnnlPlan& plan, const void* x, const void* w, const void* b, void* y) {
  plan.bind(DNNL_ARG_SRC, x);
  plan.bind(DNNL_ARG_WEIGHTS, w);
  if (b) plan.bind(DNNL_ARG_BIAS, b);
  plan.bind(DNNL_ARG_DST, y);
  plan.run(ctx);
}

/// Binds a backward-data plan's arguments (diff dst dy, weights w, diff src dx) and runs it.
inline void run_backward_data(Context& ctx, DnnlPlan& plan, const void* dy, const void* w, void* dx) {
  plan.bind(DNNL_ARG_DIFF_DST, dy);
  plan.bind(DNNL_ARG_WEIGHTS, w);
  plan.bind(DNNL_ARG_DIFF_SRC, dx);
  plan.run(ctx);
}

/// Binds a weight-gradient plan's arguments (src x, diff dst dy, diff weights dw and, when db
/// is not null, diff bias) and runs it.
inline void run_weight_gradient(Context& ctx, DnnlPlan& plan, const void* x, const void* dy, float* dw, float* db) {
  plan.bind(DNNL_ARG_SRC, x);
  plan.bind(DNNL_ARG_DIFF_DST, dy);
  plan.bind(DNNL_ARG_DIFF_WEIGHTS, dw);
  if (db) plan.bind(DNNL_ARG_DIFF_BIAS, db);
  plan.run(ctx);
}

/// Attribute with a user scratchpad and, unless `fused` is None, its eltwise post-op.
inline dnnl::primitive_attr make_attr(Activation fused = Activation::None) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (!fused.is_none()) {
    MPX_CHECK(fused.kind == ActKind::Relu || fused.kind == ActKind::LeakyRelu);
    dnnl::post_ops ops;
    dnnlc::append_eltwise(ops, dnnl::algorithm::eltwise_relu, fused.alpha, 0.0f);
    attr.set_post_ops(ops);
  }
  return attr;
}

/// Plan-key bits of a fused activation (kind and parameter).
inline int64_t act_key(Activation a) {
  uint32_t bits = 0;
  static_assert(sizeof(bits) == sizeof(a.alpha), "float is 32 bits");
  std::memcpy(&bits, &a.alpha, sizeof(bits));
  return (static_cast<int64_t>(a.kind) << 32) | bits;
}

/// Runs make(); turns a dnnl::error into an mpx::Error naming the op and shapes. A plan it
/// makes is labelled with `what` (Context::kernels).
template <typename F>
auto dnnl_try(const std::string& what, F&& make) -> decltype(make()) {
  try {
    auto made = make();
    using R = std::remove_pointer_t<decltype(made)>;
    if constexpr (std::is_pointer_v<decltype(made)> && std::is_base_of_v<Plan, R>) made->what = what;
    return made;
  } catch (const dnnl::error& e) {
    throw Error("oneDNN could not create " + what + ": " + e.what());
  }
}

}  // namespace mpx::cpu
