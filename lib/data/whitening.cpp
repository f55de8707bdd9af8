// SPDX-License-Identifier: MIT
// Patch whitening (whitening.h): patch second moments in float64, a cyclic
// Jacobi eigendecomposition, the scaled eigenvectors with both signs.
#include "data/whitening.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"

namespace mpx {

SymmetricEigen symmetric_eigen(const std::vector<double>& a_in, int n) {
  MPX_CHECK_MSG(n > 0 && a_in.size() == static_cast<size_t>(n) * static_cast<size_t>(n),
                "symmetric_eigen: " + std::to_string(a_in.size()) + " values for n = " + std::to_string(n));
  std::vector<double> a = a_in;
  std::vector<double> v(static_cast<size_t>(n) * static_cast<size_t>(n), 0.0);  // columns: eigenvectors
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i) * n + i] = 1.0;
  auto A = [&](int i, int j) -> double& { return a[static_cast<size_t>(i) * n + j]; };
  auto V = [&](int i, int j) -> double& { return v[static_cast<size_t>(i) * n + j]; };
  double norm = 0;
  for (double x : a) norm += x * x;
  norm = std::sqrt(norm);
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j) off += A(i, j) * A(i, j);
    if (std::sqrt(off) <= 1e-15 * norm || off == 0.0) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        if (A(p, q) == 0.0) continue;
        // The rotation that zeroes A(p, q) (Golub & Van Loan, the symmetric Schur decomposition).
        const double theta = (A(q, q) - A(p, p)) / (2.0 * A(p, q));
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double akp = A(k, p), akq = A(k, q);
          A(k, p) = c * akp - s * akq;
          A(k, q) = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double apk = A(p, k), aqk = A(q, k);
          A(p, k) = c * apk - s * aqk;
          A(q, k) = s * apk + c * aqk;
        }
        for (int k = 0; k < n; ++k) {
          const double vkp = V(k, p), vkq = V(k, q);
          V(k, p) = c * vkp - s * vkq;
          V(k, q) = s * vkp + c * vkq;
        }
      }
  }
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return A(x, x) > A(y, y); });
  SymmetricEigen e;
  e.values.resize(static_cast<size_t>(n));
  e.vectors.resize(static_cast<size_t>(n) * static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int col = order[static_cast<size_t>(r)];
    e.values[static_cast<size_t>(r)] = A(col, col);
    int big = 0;
    for (int k = 1; k < n; ++k)
      if (std::fabs(V(k, col)) > std::fabs(V(big, col))) big = k;
    const double sign = V(big, col) < 0 ? -1.0 : 1.0;
    for (int k = 0; k < n; ++k) e.vectors[static_cast<size_t>(r) * n + k] = sign * V(k, col);
  }
  return e;
}

PatchWhitening patch_whitening(const Dataset& ds, int64_t images, int R, int S, const std::vector<double>& mean,
                               const std::vector<double>& std, double eps) {
  const int H = ds.H, W = ds.W, C = ds.C;
  if (R < 1 || S < 1 || R > H || S > W)
    throw ConfigError("patch whitening: a " + std::to_string(R) + "x" + std::to_string(S) + " patch does not fit the " +
                      std::to_string(H) + "x" + std::to_string(W) + " images of '" + ds.name + "'");
  if (mean.size() != static_cast<size_t>(C) || std.size() != static_cast<size_t>(C))
    throw ConfigError("patch whitening: mean and std need one value per channel (" + std::to_string(C) + ")");
  if (!(eps >= 0)) throw ConfigError("patch whitening: eps must be >= 0");
  const int64_t count = images <= 0 ? ds.size() : std::min<int64_t>(images, ds.size());
  if (count == 0) throw DataError("patch whitening: the data set '" + ds.name + "' holds no images");
  const int D = R * S * C;
  PatchWhitening w;
  w.R = R, w.S = S, w.C = C;
  w.covariance.assign(static_cast<size_t>(D) * D, 0.0);
  std::vector<double> img(static_cast<size_t>(H) * W * C), patch(static_cast<size_t>(D));
  int64_t patches = 0;
  for (int64_t n = 0; n < count; ++n) {
    const uint8_t* src = ds.images.data() + n * ds.image_bytes();
    for (int64_t i = 0; i < static_cast<int64_t>(img.size()); ++i) {
      const int c = static_cast<int>(i % C);
      img[static_cast<size_t>(i)] = (static_cast<double>(src[i]) / 255.0 - mean[static_cast<size_t>(c)]) /
                                    std[static_cast<size_t>(c)];
    }
    for (int y = 0; y + R <= H; ++y)
      for (int x = 0; x + S <= W; ++x) {
        for (int r = 0; r < R; ++r)
          for (int s = 0; s < S; ++s)
            for (int c = 0; c < C; ++c)
              patch[static_cast<size_t>((r * S + s) * C + c)] =
                  img[(static_cast<size_t>(y + r) * W + static_cast<size_t>(x + s)) * C + c];
        for (int i = 0; i < D; ++i) {  // upper triangle; mirrored below
          const double pi = patch[static_cast<size_t>(i)];
          double* row = w.covariance.data() + static_cast<size_t>(i) * D;
          for (int j = i; j < D; ++j) row[j] += pi * patch[static_cast<size_t>(j)];
        }
        ++patches;
      }
  }
  for (int i = 0; i < D; ++i)
    for (int j = i; j < D; ++j) {
      double& u = w.covariance[static_cast<size_t>(i) * D + j];
      u /= static_cast<double>(patches);
      w.covariance[static_cast<size_t>(j) * D + i] = u;
    }
  w.eigen = symmetric_eigen(w.covariance, D);
  w.weights.resize(static_cast<size_t>(2 * D) * D);
  for (int f = 0; f < D; ++f) {
    const double scale = 1.0 / std::sqrt(std::max(w.eigen.values[static_cast<size_t>(f)], 0.0) + eps);
    for (int k = 0; k < D; ++k) {
      const double v = w.eigen.vectors[static_cast<size_t>(f) * D + k] * scale;
      w.weights[static_cast<size_t>(f) * D + k] = static_cast<float>(v);
      w.weights[static_cast<size_t>(D + f) * D + k] = static_cast<float>(-v);
    }
  }
  return w;
}

}  // namespace mpx
