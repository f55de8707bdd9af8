// SPDX-License-Identifier: MIT
// Softmax cross-entropy in float32 from float32 logits (max subtracted, so
// exp never overflows), with the loss sum, the correct count and dlogits, and
// label smoothing (Keras' categorical cross-entropy: target (1 - e) onehot + e / K).
#include <cmath>
#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace mpx::cpu {

void softmax_cross_entropy(Context& /*ctx*/, const Tensor& logits, const Tensor& labels, float grad_scale,
                           const Tensor& loss_sum_out, const Tensor& correct_out, const Tensor& dlogits, float label_smoothing) {
  const float e = label_smoothing, keep = 1.0f - e, spread = e / static_cast<float>(logits.shape[1]);
  const int64_t N = logits.shape[0], K = logits.shape[1];
  const float* z = logits.as<const float>();
  const int32_t* lab = labels.as<const int32_t>();
  float* dz = dlogits.empty() ? nullptr : dlogits.as<float>();
  const float g = N > 0 ? grad_scale / static_cast<float>(N) : 0.0f;
  int64_t bad = -1;
  double loss = 0.0, correct = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : loss, correct)
  for (int64_t n = 0; n < N; ++n) {
    const float* zi = z + n * K;
    const int32_t y = lab[n];
    if (y < 0 || y >= K) {
#pragma omp critical
      bad = n;
      continue;
    }
    float m = zi[0];
    int64_t arg = 0;
    for (int64_t k = 1; k < K; ++k)
      if (zi[k] > m) {
        m = zi[k];
        arg = k;
      }
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) s += std::exp(zi[k] - m);
    // -log p[y] = log(s) + (m - z[y]): no large lse minus large logit. Smoothed: -(1 - e) log p[y]
    // - e mean_k log p[k] = log(s) + (1 - e) (m - z[y]) + e (m - mean_k z[k]).
    if (e > 0.0f) {
      float zsum = 0.0f;
      for (int64_t k = 0; k < K; ++k) zsum += zi[k];
      loss += static_cast<double>(std::log(s) + (keep * (m - zi[y]) + e * (m - zsum / static_cast<float>(K))));
    } else {
      loss += static_cast<double>(std::log(s) + (m - zi[y]));
    }
    correct += arg == y ? 1.0 : 0.0;
    if (dz) {
      const float inv = 1.0f / s;
      float* d = dz + n * K;
      for (int64_t k = 0; k < K; ++k) d[k] = g * (std::exp(zi[k] - m) * inv - ((k == y ? keep : 0.0f) + spread));
    }
  }
  if (bad >= 0)
    throw DataError("softmax_cross_entropy: label " + std::to_string(lab[bad]) + " of row " + std::to_string(bad) +
                    " is outside [0, " + std::to_string(K) + ") for logits " + logits.str());
  loss_sum_out.as<float>()[0] = static_cast<float>(loss);
  correct_out.as<float>()[0] = static_cast<float>(correct);
}

}  // namespace mpx::cpu
