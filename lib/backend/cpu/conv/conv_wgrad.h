// SPDX-License-Identifier: MIT
// The weight gradient of a stride-1 convolution as GEMMs over tiles of NHWC rows
// (docs/cpu-performance.md, "The GEMM weight gradient").
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpx::cpu {

struct WgradGeo {
  int64_t N, H, W, C, K, R, S, P, Q;
  int64_t pt, pl;  // top and left padding
};

// MPX_CONV_WGRAD (wgrad_mode(), switches.h; docs/environment.md): unset (the few-channel
// kernel where it applies, else oneDNN's), onednn, auto (that plus the GEMM kernel where
// wgrad_gemm_rule says) or gemm (the GEMM kernel wherever it applies, Winograd's weight
// gradient included). Which kernel runs: conv_choose.h.

/// Whether conv_wgrad_gemm computes this convolution (stride 1 in both directions).
bool wgrad_gemm_applies(const WgradGeo& g, int stride_h, int stride_w);

/// Whether MPX_CONV_WGRAD=auto runs conv_wgrad_gemm for this shape: a fixed rule by shape and
/// ISA (docs/cpu-performance.md, "The GEMM weight gradient").
bool wgrad_gemm_rule(const WgradGeo& g);

/// Floats of scratch conv_wgrad_gemm needs with `threads` OpenMP threads.
size_t wgrad_gemm_scratch(const WgradGeo& g, int threads);

/// dw[k,r,s,c] = sum_{n,p,q} dy[n,p,q,k] * x[n, p-pt+r, q-pl+s, c] (zero outside x), and
/// db[k] = sum dy[...,k] when db is not null. x NHWC, dy NHWC, dw KRSC, all float32;
/// `scratch` holds wgrad_gemm_scratch(g, omp_get_max_threads()) floats.
void conv_wgrad_gemm(const WgradGeo& g, const float* x, const float* dy, float* dw, float* db, float* scratch);

/// db[k] = sum over the M rows of dy ([M, K], row-major) of dy[m, k]: a convolution's (or any
/// NHWC layer's) bias gradient. Blocks of 64 rows are summed in float32 and the block sums
/// in double, each thread over its own rows; the threads' sums are added in thread order,
/// so the result depends only on M, K and the thread count.
void bias_gradient_rows(const float* dy, int64_t M, int64_t K, float* db);

}  // namespace mpx::cpu
