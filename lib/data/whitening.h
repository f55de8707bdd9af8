// SPDX-License-Identifier: MIT
// Patch whitening from training-set statistics: the weights of a first
// convolution whose filters are the eigenvectors of the covariance of the
// images' R x S patches, scaled by 1 / sqrt(eigenvalue + eps), each with both
// signs (airbench94's whitening layer; docs/fast-cifar.md, "Patch whitening").
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace mpx {

/// The symmetric eigendecomposition of an n x n matrix (row-major, float64): eigenvalues
/// in descending order and the matching unit eigenvectors, one per row of `vectors`
/// (n x n, row-major), each with its largest-magnitude component positive (the first of
/// equal ones). Cyclic Jacobi rotations until the off-diagonal part vanishes.
struct SymmetricEigen {
  std::vector<double> values;
  std::vector<double> vectors;
};
SymmetricEigen symmetric_eigen(const std::vector<double>& a, int n);

struct PatchWhitening {
  int R = 0, S = 0, C = 0;
  /// The second-moment matrix of the patches, (r, s, c)-major: [R*S*C x R*S*C].
  std::vector<double> covariance;
  SymmetricEigen eigen;
  /// Filters [2 * R*S*C, R, S, C] (the KRSC layout of conv2d kernels): filter i < R*S*C is
  /// eigenvector i / sqrt(eigenvalue i + eps), filter R*S*C + i its negative.
  std::vector<float> weights;
};

/// From the first `images` records of `ds` (all when 0 or more than it has), each pixel
/// normalized as the model's input is, (x / 255 - mean[c]) / std[c]: every R x S patch at
/// stride 1 without padding, their mean outer product (not centred, as airbench94), its
/// eigendecomposition and the whitening filters. Throws ConfigError when the image is
/// smaller than the patch or mean/std do not have C values.
PatchWhitening patch_whitening(const Dataset& ds, int64_t images, int R, int S, const std::vector<double>& mean,
                               const std::vector<double>& std, double eps);

}  // namespace mpx
