// SPDX-License-Identifier: MIT
// The dense layers' plain loops on float32, x [N, Ci], w [Co, Ci], y [N, Co]: the obviously
// correct reference of the family, run under MPX_CPU_REFERENCE=1 (dense_choose.h).
#pragma once

#include <cstdint>

namespace mpx::cpu::dense_detail {

/// y = x w^T + b (b may be null; the activation follows in activation_epilogue).
void dense_forward_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* w, const float* b,
                         float* y);
/// dx = dy w.
void dense_backward_data_loops(int64_t N, int64_t Ci, int64_t Co, const float* dy, const float* w, float* dx);
/// dw = dy^T x, db = the sum of dy's rows (when db is not null).
void dense_backward_weights_loops(int64_t N, int64_t Ci, int64_t Co, const float* x, const float* dy, float* dw,
                                  float* db);

}  // namespace mpx::cpu::dense_detail
