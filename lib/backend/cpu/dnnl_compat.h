// SPDX-License-Identifier: MIT
// The primitive descriptors the CPU backend creates, written once for both oneDNN APIs
// it builds against (docs/cpu-performance.md, "Which oneDNN"): 2.x builds a primitive_desc
// from an operation descriptor (op::desc), 3.x takes the engine and the memory
// descriptors directly. A null bias means "no bias".
#pragma once

#include <dnnl.hpp>

namespace mpx::cpu::dnnlc {

using md = dnnl::memory::desc;
using dims = dnnl::memory::dims;

#if DNNL_VERSION_MAJOR >= 3
inline constexpr bool kV3 = true;
#else
inline constexpr bool kV3 = false;
#endif

/// Appends an eltwise post-op (scale 1 where 2.x takes one).
inline void append_eltwise(dnnl::post_ops& ops, dnnl::algorithm alg, float alpha, float beta) {
#if DNNL_VERSION_MAJOR >= 3
  ops.append_eltwise(alg, alpha, beta);
#else
  ops.append_eltwise(1.0f, alg, alpha, beta);
#endif
}

// ---- convolution (direct) ----------------------------------------------------------

inline dnnl::convolution_forward::primitive_desc conv_fwd(const dnnl::engine& eng, const md& src, const md& wei,
                                                          const md* bias, const md& dst, const dims& strides,
                                                          const dims& pl, const dims& pr,
                                                          const dnnl::primitive_attr& attr) {
  using cf = dnnl::convolution_forward;
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  return bias ? cf::primitive_desc(eng, prop, alg, src, wei, *bias, dst, strides, pl, pr, attr)
              : cf::primitive_desc(eng, prop, alg, src, wei, dst, strides, pl, pr, attr);
#else
  return cf::primitive_desc(bias ? cf::desc(prop, alg, src, wei, *bias, dst, strides, pl, pr)
                                 : cf::desc(prop, alg, src, wei, dst, strides, pl, pr),
                            attr, eng);
#endif
}

inline dnnl::convolution_backward_data::primitive_desc conv_bwd_data(
    const dnnl::engine& eng, const md& diff_src, const md& wei, const md& diff_dst, const dims& strides,
    const dims& pl, const dims& pr, const dnnl::convolution_forward::primitive_desc& hint,
    const dnnl::primitive_attr& attr) {
  using cb = dnnl::convolution_backward_data;
  const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  return cb::primitive_desc(eng, alg, diff_src, wei, diff_dst, strides, pl, pr, hint, attr);
#else
  return cb::primitive_desc(cb::desc(alg, diff_src, wei, diff_dst, strides, pl, pr), attr, eng, hint);
#endif
}

inline dnnl::convolution_backward_weights::primitive_desc conv_bwd_weights(
    const dnnl::engine& eng, const md& src, const md& diff_wei, const md* diff_bias, const md& diff_dst,
    const dims& strides, const dims& pl, const dims& pr, const dnnl::convolution_forward::primitive_desc& hint,
    const dnnl::primitive_attr& attr) {
  using cw = dnnl::convolution_backward_weights;
  const auto alg = dnnl::algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  return diff_bias ? cw::primitive_desc(eng, alg, src, diff_wei, *diff_bias, diff_dst, strides, pl, pr, hint, attr)
                   : cw::primitive_desc(eng, alg, src, diff_wei, diff_dst, strides, pl, pr, hint, attr);
#else
  return cw::primitive_desc(diff_bias ? cw::desc(alg, src, diff_wei, *diff_bias, diff_dst, strides, pl, pr)
                                      : cw::desc(alg, src, diff_wei, diff_dst, strides, pl, pr),
                            attr, eng, hint);
#endif
}

// ---- inner product -----------------------------------------------------------------

inline dnnl::inner_product_forward::primitive_desc ip_fwd(const dnnl::engine& eng, const md& src, const md& wei,
                                                          const md* bias, const md& dst,
                                                          const dnnl::primitive_attr& attr) {
  using ip = dnnl::inner_product_forward;
  const auto prop = dnnl::prop_kind::forward_training;
#if DNNL_VERSION_MAJOR >= 3
  return bias ? ip::primitive_desc(eng, prop, src, wei, *bias, dst, attr)
              : ip::primitive_desc(eng, prop, src, wei, dst, attr);
#else
  return ip::primitive_desc(bias ? ip::desc(prop, src, wei, *bias, dst) : ip::desc(prop, src, wei, dst), attr, eng);
#endif
}

inline dnnl::inner_product_backward_data::primitive_desc ip_bwd_data(
    const dnnl::engine& eng, const md& diff_src, const md& wei, const md& diff_dst,
    const dnnl::inner_product_forward::primitive_desc& hint, const dnnl::primitive_attr& attr) {
  using ib = dnnl::inner_product_backward_data;
#if DNNL_VERSION_MAJOR >= 3
  return ib::primitive_desc(eng, diff_src, wei, diff_dst, hint, attr);
#else
  return ib::primitive_desc(ib::desc(diff_src, wei, diff_dst), attr, eng, hint);
#endif
}

inline dnnl::inner_product_backward_weights::primitive_desc ip_bwd_weights(
    const dnnl::engine& eng, const md& src, const md& diff_wei, const md* diff_bias, const md& diff_dst,
    const dnnl::inner_product_forward::primitive_desc& hint, const dnnl::primitive_attr& attr) {
  using iw = dnnl::inner_product_backward_weights;
#if DNNL_VERSION_MAJOR >= 3
  return diff_bias ? iw::primitive_desc(eng, src, diff_wei, *diff_bias, diff_dst, hint, attr)
                   : iw::primitive_desc(eng, src, diff_wei, diff_dst, hint, attr);
#else
  return iw::primitive_desc(diff_bias ? iw::desc(src, diff_wei, *diff_bias, diff_dst) : iw::desc(src, diff_wei, diff_dst),
                            attr, eng, hint);
#endif
}

// ---- batch normalization (data and its gradient in the same layout) ---------------------

inline dnnl::batch_normalization_forward::primitive_desc bn_fwd(const dnnl::engine& eng, dnnl::prop_kind prop,
                                                                const md& data, float epsilon,
                                                                dnnl::normalization_flags flags,
                                                                const dnnl::primitive_attr& attr) {
  using bf = dnnl::batch_normalization_forward;
#if DNNL_VERSION_MAJOR >= 3
  return bf::primitive_desc(eng, prop, data, data, epsilon, flags, attr);
#else
  return bf::primitive_desc(bf::desc(prop, data, epsilon, flags), attr, eng);
#endif
}

inline dnnl::batch_normalization_backward::primitive_desc bn_bwd(
    const dnnl::engine& eng, const md& data, float epsilon, dnnl::normalization_flags flags,
    const dnnl::batch_normalization_forward::primitive_desc& hint, const dnnl::primitive_attr& attr) {
  using bb = dnnl::batch_normalization_backward;
  const auto prop = dnnl::prop_kind::backward;
#if DNNL_VERSION_MAJOR >= 3
  return bb::primitive_desc(eng, prop, data, data, data, epsilon, flags, hint, attr);
#else
  return bb::primitive_desc(bb::desc(prop, data, data, epsilon, flags), attr, eng, hint);
#endif
}

// ---- pooling (no dilation) ---------------------------------------------------------

inline dnnl::pooling_forward::primitive_desc pool_fwd(const dnnl::engine& eng, dnnl::algorithm alg, const md& src,
                                                      const md& dst, const dims& strides, const dims& kernel,
                                                      const dims& pl, const dims& pr,
                                                      const dnnl::primitive_attr& attr) {
  using pf = dnnl::pooling_forward;
  const auto prop = dnnl::prop_kind::forward_training;
#if DNNL_VERSION_MAJOR >= 3
  return pf::primitive_desc(eng, prop, alg, src, dst, strides, kernel, dims(kernel.size(), 0), pl, pr, attr);
#else
  return pf::primitive_desc(pf::desc(prop, alg, src, dst, strides, kernel, pl, pr), attr, eng);
#endif
}

inline dnnl::pooling_backward::primitive_desc pool_bwd(const dnnl::engine& eng, dnnl::algorithm alg,
                                                       const md& diff_src, const md& diff_dst, const dims& strides,
                                                       const dims& kernel, const dims& pl, const dims& pr,
                                                       const dnnl::pooling_forward::primitive_desc& hint,
                                                       const dnnl::primitive_attr& attr) {
  using pb = dnnl::pooling_backward;
#if DNNL_VERSION_MAJOR >= 3
  return pb::primitive_desc(eng, alg, diff_src, diff_dst, strides, kernel, dims(kernel.size(), 0), pl, pr, hint,
                            attr);
#else
  return pb::primitive_desc(pb::desc(alg, diff_src, diff_dst, strides, kernel, pl, pr), attr, eng, hint);
#endif
}

// ---- binary ------------------------------------------------------------------------

inline dnnl::binary::primitive_desc binary(const dnnl::engine& eng, dnnl::algorithm alg, const md& src0,
                                           const md& src1, const md& dst) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::binary::primitive_desc(eng, alg, src0, src1, dst);
#else
  return dnnl::binary::primitive_desc(dnnl::binary::desc(alg, src0, src1, dst), eng);
#endif
}

}  // namespace mpx::cpu::dnnlc
