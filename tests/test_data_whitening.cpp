// SPDX-License-Identifier: MIT
// Patch whitening (data/whitening.h): the eigendecomposition checked by its
// defining equations in float64 (A v = lambda v, V orthonormal, the trace), the
// covariance against a direct sum over the patches, and the filters by what
// they do: the whitened patches have second moments lambda / (lambda + eps) and
// no cross moments.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "data/whitening.h"

using namespace mpx;

namespace {

/// max |A v - lambda v| over the eigenpairs and max |V V^T - I|.
void check_eigen(const std::vector<double>& a, int n, const SymmetricEigen& e, double tol) {
  REQUIRE(e.values.size() == static_cast<size_t>(n));
  double scale = 0;
  for (double x : a) scale = std::max(scale, std::fabs(x));
  for (int r = 0; r < n; ++r) {
    if (r > 0) CHECK(e.values[r - 1] >= e.values[r]);  // descending
    const double* v = e.vectors.data() + static_cast<size_t>(r) * n;
    int big = 0;
    for (int k = 0; k < n; ++k) {
      double av = 0;
      for (int j = 0; j < n; ++j) av += a[static_cast<size_t>(k) * n + j] * v[j];
      INFO("pair " << r << " row " << k);
      CHECK(std::fabs(av - e.values[r] * v[k]) <= tol * scale);
      if (std::fabs(v[k]) > std::fabs(v[big])) big = k;
    }
    CHECK(v[big] > 0);  // the sign convention
    for (int q = 0; q < n; ++q) {
      double dot = 0;
      for (int k = 0; k < n; ++k) dot += v[k] * e.vectors[static_cast<size_t>(q) * n + k];
      CHECK(std::fabs(dot - (q == r ? 1.0 : 0.0)) <= 1e-12);
    }
  }
  double trace = 0, sum = 0;
  for (int i = 0; i < n; ++i) trace += a[static_cast<size_t>(i) * n + i];
  for (double l : e.values) sum += l;
  CHECK(sum == Approx(trace).epsilon(1e-12));
}

Dataset random_images(int64_t n, int H, int W, int C, uint64_t seed) {
  Dataset ds;
  ds.name = "test";
  ds.H = H, ds.W = W, ds.C = C;
  ds.labels.assign(static_cast<size_t>(n), 0);
  ds.images.resize(static_cast<size_t>(n * H * W * C));
  Rng rng(seed);
  // Correlated channels and neighbours (a smooth field plus noise), as natural images have.
  for (int64_t i = 0; i < n; ++i)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        const double base = 128 + 60 * std::sin(0.7 * x + 0.3 * y + static_cast<double>(i));
        for (int c = 0; c < C; ++c) {
          const double v = base * (1.0 - 0.2 * c) + rng.uniform(-30, 30);
          ds.images[static_cast<size_t>(((i * H + y) * W + x) * C + c)] =
              static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
        }
      }
  return ds;
}

}  // namespace

TEST_CASE("symmetric_eigen: the defining equations hold, eigenvalues descending", "[data][whitening]") {
  Rng rng(5);
  for (int n : {1, 2, 5, 12, 27}) {
    // B B^T + a repeated eigenvalue block: positive semi-definite, with ties.
    std::vector<double> b(static_cast<size_t>(n) * n), a(static_cast<size_t>(n) * n, 0.0);
    for (auto& x : b) x = rng.uniform(-1, 1);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n / 2; ++k) a[static_cast<size_t>(i) * n + j] += b[i * n + k] * b[j * n + k];
    INFO("n = " << n);
    check_eigen(a, n, symmetric_eigen(a, n), 1e-12);
  }
  // A diagonal matrix: the eigenvalues are its entries, sorted.
  const std::vector<double> d = {1, 0, 0, 0, 3, 0, 0, 0, 2};
  const SymmetricEigen e = symmetric_eigen(d, 3);
  CHECK(e.values == std::vector<double>{3, 2, 1});
}

TEST_CASE("patch_whitening: covariance of 2x2x3 patches, filters that whiten them", "[data][whitening]") {
  const Dataset ds = random_images(40, 8, 7, 3, 11);
  const std::vector<double> mean = {0.45, 0.4, 0.35}, sd = {0.25, 0.24, 0.26};
  const double eps = 5e-4;
  const PatchWhitening w = patch_whitening(ds, 30, 2, 2, mean, sd, eps);
  const int D = 12;
  REQUIRE(w.weights.size() == static_cast<size_t>(2 * D * D));

  // The patches, normalized as the model's input: (x / 255 - mean) / std, (r, s, c) order.
  std::vector<std::vector<double>> patches;
  for (int64_t n = 0; n < 30; ++n)
    for (int y = 0; y + 2 <= ds.H; ++y)
      for (int x = 0; x + 2 <= ds.W; ++x) {
        std::vector<double> p;
        for (int r = 0; r < 2; ++r)
          for (int s = 0; s < 2; ++s)
            for (int c = 0; c < 3; ++c) {
              const uint8_t v = ds.images[static_cast<size_t>(((n * ds.H + y + r) * ds.W + x + s) * 3 + c)];
              p.push_back((v / 255.0 - mean[c]) / sd[c]);
            }
        patches.push_back(p);
      }
  REQUIRE(patches.size() == 30u * 7 * 6);
  for (int i = 0; i < D; ++i)
    for (int j = 0; j < D; ++j) {
      double m = 0;
      for (const auto& p : patches) m += p[i] * p[j];
      m /= static_cast<double>(patches.size());
      CHECK(w.covariance[static_cast<size_t>(i) * D + j] == Approx(m).epsilon(1e-12).margin(1e-12));
    }
  check_eigen(w.covariance, D, w.eigen, 1e-11);

  // Filter f applied to the patches: second moment lambda_f / (lambda_f + eps) (float32 weights:
  // 1e-5 relative), no cross moments between filters; filter D + f is filter f negated.
  std::vector<std::vector<double>> out(D, std::vector<double>(patches.size()));
  for (int f = 0; f < D; ++f)
    for (size_t k = 0; k < patches.size(); ++k) {
      double dot = 0;
      for (int i = 0; i < D; ++i) dot += w.weights[static_cast<size_t>(f) * D + i] * patches[k][i];
      out[f][k] = dot;
    }
  for (int f = 0; f < D; ++f) {
    for (int i = 0; i < D; ++i) CHECK(w.weights[static_cast<size_t>(D + f) * D + i] == -w.weights[f * D + i]);
    for (int g = 0; g < D; ++g) {
      double m = 0;
      for (size_t k = 0; k < patches.size(); ++k) m += out[f][k] * out[g][k];
      m /= static_cast<double>(patches.size());
      const double lam = w.eigen.values[f];
      INFO("filters " << f << ", " << g);
      CHECK(std::fabs(m - (f == g ? lam / (lam + eps) : 0.0)) <= 1e-5);
    }
  }
}

TEST_CASE("patch_whitening: bad arguments are config errors", "[data][whitening]") {
  const Dataset ds = random_images(2, 3, 3, 1, 1);
  CHECK_THROWS_AS(patch_whitening(ds, 0, 4, 2, {0.5}, {0.2}, 1e-3), ConfigError);
  CHECK_THROWS_WITH(patch_whitening(ds, 0, 2, 2, {0.5, 0.1}, {0.2, 0.2}, 1e-3),
                    Catch::Contains("mean and std need one value per channel (1)"));
  CHECK_NOTHROW(patch_whitening(ds, 0, 3, 3, {0.5}, {0.2}, 1e-3));
}
