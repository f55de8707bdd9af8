// SPDX-License-Identifier: MIT
// Numerical gradient checks of a whole Model (Caffe's GradientChecker): central
// differences of a random projection of the logits, objective = sum(proj * logits),
// against the analytic gradients of backward(proj) for the master weights and the
// float32 input. Kinks (relu, max-pool) are detected by comparing the one-sided
// differences and skipped (counted).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.h"
#include "core/rng.h"
#include "config/config.h"
#include "nn/model.h"

namespace support {

inline std::vector<float> download_f32(mpx::Backend& be, const mpx::Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == mpx::DType::F32) {
    be.download(v.data(), t);
  } else {
    mpx::Buffer b = be.alloc(v.size() * 4, "test download");
    const mpx::Tensor f = b.view(mpx::DType::F32, t.shape);
    be.cast(t, f);
    be.download(v.data(), f);
  }
  return v;
}

inline std::vector<float> random_vec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  mpx::Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

/// n uint8 images of h x w x c on the backend, byte i being (i * mul + i / div) % 256: inputs
/// that every run of a test rebuilds alike.
struct FixedImages {
  mpx::Buffer buf;
  mpx::Tensor x;
};
inline FixedImages fixed_images(mpx::Backend& be, int64_t n, int64_t h, int64_t w, int64_t c, size_t mul = 37,
                                size_t div = 7) {
  std::vector<uint8_t> xh(static_cast<size_t>(n * h * w * c));
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = static_cast<uint8_t>((i * mul + i / div) % 256);
  FixedImages f{be.alloc(xh.size(), "test input"), {}};
  f.x = f.buf.view(mpx::DType::U8, mpx::Shape{n, h, w, c});
  be.upload(f.x, xh.data());
  return f;
}

/// The gradients (m.grads(), widened) of one training step of m on n images of h x w x c fixed
/// bytes (fixed_images' defaults), with a random projection of the logits as their gradient:
/// forward (dropout seed 7, step 3), then backward.
inline std::vector<float> image_step_grads(mpx::Model& m, mpx::Backend& be, int64_t n, int64_t h, int64_t w,
                                           int64_t c, int64_t classes) {
  const FixedImages in = fixed_images(be, n, h, w, c);
  const std::vector<float> ph = random_vec(static_cast<size_t>(n * classes), 4);
  mpx::Buffer pb = be.alloc(ph.size() * 4, "test projection");
  const mpx::Tensor proj = pb.view(mpx::DType::F32, mpx::Shape{n, classes});
  be.upload(proj, ph.data());
  m.forward(in.x, true, 7, 3);
  m.backward(proj);
  return download_f32(be, m.grads());
}

struct GradCheckOptions {
  double step = 5e-3;        // central-difference step
  double threshold = 1e-2;   // |analytic - numeric| / max(|analytic|, |numeric|, 1)
  bool kinks = false;        // skip coordinates where the one-sided differences disagree (relu/max-pool)
  int max_coords = 120;      // per tensor (random subset beyond that)
  bool training = true;
  uint64_t dropout_seed = 7, step_index = 3;
  uint64_t seed = 1;
};

struct GradCheckResult {
  int checked = 0, skipped = 0, failed = 0;
  double max_error = 0;
  std::string first_failure;
};

/// Checks d(sum proj*logits)/d(master) and d/d(input) for a float32-policy model.
/// x: host float32 [n, H, W, C] values; shape gives [n, H, W, C].
inline GradCheckResult gradcheck_model(mpx::Model& m, mpx::Backend& be, const std::vector<float>& x_host,
                                       mpx::Shape x_shape, const GradCheckOptions& o = {}) {
  using namespace mpx;
  GradCheckResult r;
  const int64_t n = x_shape[0];
  const int classes = m.num_classes();
  Buffer xb = be.alloc(x_host.size() * 4, "gradcheck input");
  Buffer pb = be.alloc(static_cast<size_t>(n * classes) * 4, "gradcheck projection");
  const Tensor x = xb.view(DType::F32, x_shape);
  const Tensor proj = pb.view(DType::F32, Shape{n, classes});
  const std::vector<float> proj_host = random_vec(static_cast<size_t>(n * classes), o.seed ^ 0x51ULL);
  be.upload(x, x_host.data());
  be.upload(proj, proj_host.data());

  auto objective = [&]() {
    const Tensor logits = m.forward_float(x, o.training, o.dropout_seed, o.step_index);
    const std::vector<float> l = download_f32(be, logits);
    double s = 0;
    for (size_t i = 0; i < l.size(); ++i) s += static_cast<double>(proj_host[i]) * l[i];
    return s;
  };

  // Analytic gradients.
  const double f0 = objective();
  m.backward(proj);
  const std::vector<float> gw = download_f32(be, m.grads());
  const std::vector<float> gx = download_f32(be, m.input_grad());

  auto check = [&](const char* what, int64_t count, const std::vector<float>& analytic, auto&& set) {
    std::vector<int64_t> idx(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) idx[static_cast<size_t>(i)] = i;
    if (count > o.max_coords) {
      Rng rng(o.seed ^ static_cast<uint64_t>(count));
      for (int64_t i = count - 1; i > 0; --i)
        std::swap(idx[static_cast<size_t>(i)], idx[rng.uniform_int(static_cast<uint64_t>(i + 1))]);
      idx.resize(static_cast<size_t>(o.max_coords));
    }
    for (int64_t i : idx) {
      set(i, +o.step);
      const double fp = objective();
      set(i, -o.step);
      const double fm = objective();
      set(i, 0.0);
      const double numeric = (fp - fm) / (2 * o.step);
      const double a = analytic[static_cast<size_t>(i)];
      if (o.kinks) {
        const double fwd = (fp - f0) / o.step, bwd = (f0 - fm) / o.step;
        if (std::fabs(fwd - bwd) > o.threshold * std::max({std::fabs(fwd), std::fabs(bwd), 1.0})) {
          ++r.skipped;
          continue;
        }
      }
      ++r.checked;
      const double err = std::fabs(a - numeric) / std::max({std::fabs(a), std::fabs(numeric), 1.0});
      r.max_error = std::max(r.max_error, err);
      if (err > o.threshold) {
        if (r.failed == 0)
          r.first_failure = fmt::format("{}[{}]: analytic {} numeric {} (error {})", what, i, a, numeric, err);
        ++r.failed;
      }
    }
  };

  // Master weights: perturb one value, refresh the compute copy (no-op under float32).
  std::vector<float> w = download_f32(be, m.master());
  check("master", m.num_params(), gw, [&](int64_t i, double d) {
    const float v = static_cast<float>(w[static_cast<size_t>(i)] + d);
    be.upload(m.master().flat_view(i, Shape{1}), &v);
    m.refresh_compute_copy();
  });
  // Input.
  std::vector<float> xv = x_host;
  check("input", static_cast<int64_t>(xv.size()), gx, [&](int64_t i, double d) {
    xv[static_cast<size_t>(i)] = static_cast<float>(x_host[static_cast<size_t>(i)] + d);
    be.upload(x, xv.data());
  });
  return r;
}

// ---- small models built in code ------------------------------------------------

inline mpx::LayerConfig make_layer(mpx::LayerType type) {
  mpx::LayerConfig l;
  l.type = type;
  return l;
}
inline mpx::LayerConfig conv_layer(int64_t filters, int kernel, int stride = 1,
                                   mpx::Padding padding = mpx::Padding::Valid,
                                   mpx::ActivationName activation = mpx::ActivationName::Linear) {
  mpx::LayerConfig l = make_layer(mpx::LayerType::Conv2d);
  l.filters = filters;
  l.kernel_h = l.kernel_w = kernel;
  l.stride_h = l.stride_w = stride;
  l.padding = padding;
  l.activation = activation;
  return l;
}
inline mpx::LayerConfig dense_layer(int64_t units, mpx::ActivationName activation = mpx::ActivationName::Linear) {
  mpx::LayerConfig l = make_layer(mpx::LayerType::Dense);
  l.units = units;
  l.activation = activation;
  return l;
}
inline mpx::LayerConfig pool_layer(mpx::LayerType type, int size, int stride = 0,
                                   mpx::Padding padding = mpx::Padding::Valid) {
  mpx::LayerConfig l = make_layer(type);
  l.pool_h = l.pool_w = size;
  l.pool_stride_h = l.pool_stride_w = stride;
  l.padding = padding;
  return l;
}
inline mpx::LayerConfig residual_layer(std::vector<mpx::LayerConfig> layers) {
  mpx::LayerConfig l = make_layer(mpx::LayerType::Residual);
  l.layers = std::move(layers);
  return l;
}
inline mpx::Config model_config(std::vector<mpx::LayerConfig> layers) {
  mpx::Config c;
  c.model.layers = std::move(layers);
  return c;
}

}  // namespace support
