// SPDX-License-Identifier: MIT
// The fused passes over the flat float32 arenas: unscale-and-check, the
// optimizer update (SGD/momentum/Nesterov, Adam, AdamW, AMSGrad; Keras formulas) that
// also writes the rounded 16-bit compute copy, and tensor statistics.
#include <cmath>
#include <limits>
#include <type_traits>

#include "backend/cpu/ops.h"

namespace mpx::cpu {

bool unscale_and_check(const Tensor& grads, float inv_scale) {
  float* g = grads.as<float>();
  const int64_t n = grads.numel();
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const float v = g[i] * inv_scale;
    g[i] = v;
    bad |= std::isfinite(v) ? 0 : 1;
  }
  return bad == 0;
}

void optimizer_step(Context& /*ctx*/, const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                    const std::vector<Tensor>& states, const Tensor& compute_copy) {
  float* w = master.as<float>();
  const float* g = grads.as<const float>();
  // The state arenas in core/optimizer_kind.h's order (nullptr where absent).
  auto arena = [&](size_t i) { return i < states.size() && !states[i].empty() ? states[i].as<float>() : nullptr; };
  float* m = arena(0);
  float* v = arena(1);
  const float lr = s.lr, wd = s.weight_decay;
  const bool has_copy = !compute_copy.empty();
  const Tensor copy_t = compute_copy;

  if (s.kind == OptimizerStep::Kind::Sgd) {
    const float mom = s.momentum;
    const bool use_m = mom != 0.0f && m;
    // The decay, the momentum and Nesterov as template arguments, with restrict pointers, as
    // Adam's loop below: no branch in the loop, which vectorizes with the scalar formula's bits.
    auto pass = [&](auto decay, auto momentum, auto nesterov) {
      for_blocks(master.numel(), [&](int64_t off, int64_t n) {
        float* __restrict wb = w + off;
        const float* __restrict gb = g + off;
        float* __restrict mb = m ? m + off : nullptr;  // plain SGD has no momentum arena
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          float gi = gb[i];
          if constexpr (decltype(decay)::value) gi += wd * wb[i];
          if constexpr (decltype(momentum)::value) {
            const float vi = mom * mb[i] - lr * gi;
            mb[i] = vi;
            if constexpr (decltype(nesterov)::value)
              wb[i] += mom * vi - lr * gi;
            else
              wb[i] += vi;
          } else {
            wb[i] -= lr * gi;
          }
        }
        if (has_copy) convert(w + off, DType::F32, elem_ptr(copy_t, off), copy_t.dtype, static_cast<size_t>(n));
      });
    };
    auto with_momentum = [&](auto decay) {
      if (!use_m)
        pass(decay, std::false_type{}, std::false_type{});
      else if (s.nesterov)
        pass(decay, std::true_type{}, std::true_type{});
      else
        pass(decay, std::true_type{}, std::false_type{});
    };
    if (wd != 0.0f)
      with_momentum(std::true_type{});
    else
      with_momentum(std::false_type{});
    return;
  }

  // Adam / AdamW (Keras): lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); w -= lr_t * m / (sqrt(v) + eps).
  // AMSGrad (Keras amsgrad=True): the denominator takes v_hat = max(v_hat, v), its third arena.
  const double t = static_cast<double>(s.t);
  const double b1t = std::pow(static_cast<double>(s.beta1), t), b2t = std::pow(static_cast<double>(s.beta2), t);
  const float lr_t = static_cast<float>(static_cast<double>(lr) * std::sqrt(1.0 - b2t) / (1.0 - b1t));
  const float b1 = s.beta1, b2 = s.beta2, eps = s.epsilon;
  const bool adamw = s.kind == OptimizerStep::Kind::AdamW;
  float* vh = s.kind == OptimizerStep::Kind::Amsgrad ? arena(2) : nullptr;
  // The weight decay's form and AMSGrad are template arguments, so that the loop has no branch
  // and vectorizes (sqrt and the division are correctly rounded in every lane: the same bits).
  enum Decay { kNone, kL2, kDecoupled };
  auto pass = [&](auto amsgrad, auto decay) {
    for_blocks(master.numel(), [&](int64_t off, int64_t n) {
      // The block's arrays as local restrict pointers: the captured ones are reloaded after
      // every store (the compiler cannot tell they are not stored to), which stops the vectorizer.
      float* __restrict wb = w + off;
      const float* __restrict gb = g + off;
      float* __restrict mb = m + off;
      float* __restrict vb = v + off;
      float* __restrict hb = vh ? vh + off : nullptr;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        float wi = wb[i];
        float gi = gb[i];
        if constexpr (decltype(decay)::value == kDecoupled) wi -= lr * wd * wi;
        if constexpr (decltype(decay)::value == kL2) gi += wd * wi;
        const float mi = b1 * mb[i] + (1.0f - b1) * gi;
        const float vi = b2 * vb[i] + (1.0f - b2) * gi * gi;
        mb[i] = mi;
        vb[i] = vi;
        float vd = vi;
        if constexpr (decltype(amsgrad)::value) {
          const float hi = hb[i];
          vd = hi >= vi ? hi : vi;  // a NaN v wins, as tf.maximum
          hb[i] = vd;
        }
        wb[i] = wi - lr_t * mi / (std::sqrt(vd) + eps);
      }
      if (has_copy) convert(w + off, DType::F32, elem_ptr(copy_t, off), copy_t.dtype, static_cast<size_t>(n));
    });
  };
  auto with_decay = [&](auto amsgrad) {
    if (wd == 0.0f)
      pass(amsgrad, std::integral_constant<int, kNone>{});
    else if (adamw)
      pass(amsgrad, std::integral_constant<int, kDecoupled>{});
    else
      pass(amsgrad, std::integral_constant<int, kL2>{});
  };
  if (vh)
    with_decay(std::true_type{});
  else
    with_decay(std::false_type{});
}

TensorStats stats(const Tensor& x) {
  const int64_t total = x.numel();
  double mn = std::numeric_limits<double>::infinity(), mx = -std::numeric_limits<double>::infinity();
  double sum_abs = 0.0;
  int64_t n_inf = 0, n_nan = 0, n_zero = 0;
#pragma omp parallel for schedule(static) reduction(min : mn) reduction(max : mx) \
    reduction(+ : sum_abs, n_inf, n_nan, n_zero) if (total > (1 << 15))
  for (int64_t b = 0; b < (total + kBlock - 1) / kBlock; ++b) {
    const int64_t off = b * kBlock, n = std::min(kBlock, total - off);
    float buf[kBlock];
    const float* p = load_block(x, off, n, buf);
    for (int64_t i = 0; i < n; ++i) {
      const float v = p[i];
      if (std::isnan(v)) {
        ++n_nan;
      } else if (std::isinf(v)) {
        ++n_inf;
      } else {
        if (v == 0.0f) ++n_zero;
        mn = std::min<double>(mn, v);
        mx = std::max<double>(mx, v);
        sum_abs += std::fabs(v);
      }
    }
  }
  TensorStats st;
  st.count = total;
  st.n_inf = n_inf;
  st.n_nan = n_nan;
  st.n_zero = n_zero;
  const int64_t finite = total - n_inf - n_nan;
  if (finite > 0) {
    st.min = mn;
    st.max = mx;
    st.mean_abs = sum_abs / static_cast<double>(finite);
  }
  return st;
}

}  // namespace mpx::cpu
