// SPDX-License-Identifier: MIT
// AMSGrad (three state arenas m, v, v_hat; core/optimizer_kind.h) on the CUDA backend
// against the CPU backend, bit for bit: the host-driven pass and the device-state pass
// (optimizer_step_state: lr and t read from device memory, nothing when the step is not
// finite), with and without a 16-bit compute copy, over steps whose gradients shrink so
// that v falls below v_hat and the maximum is what the update reads.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "backend/op_params.h"
#include "cuda/cuda_compare.h"

using namespace cudatest;

namespace {

/// A StepState on both backends (plain data, the same bytes).
Dual step_state(int64_t applied_total, bool finite) {
  StepState st;
  st.applied_total = applied_total;
  st.finite = finite ? 1 : 0;
  return from_bytes(DType::U8, Shape{static_cast<int64_t>(sizeof(StepState))}, &st);
}

/// Gradients of step k: large at first, then a tenth, so that v decays below v_hat.
Dual gradients(Rng& rng, int64_t n, int k) {
  const float scale = k < 2 ? 1.0f : 0.1f;
  return random_dual(rng, DType::F32, Shape{n}, -scale, scale);
}

}  // namespace

TEST_CASE("cuda: AMSGrad, host-driven and device-state passes, bit for bit with the CPU", "[cuda][fused][amsgrad]") {
  Rng rng(41);
  const int64_t n = 50021;
  OptimizerStep s;
  s.kind = OptimizerStep::Kind::Amsgrad;
  s.lr = 2e-3f;
  s.beta1 = 0.9f, s.beta2 = 0.99f, s.epsilon = 1e-7f;
  for (float wd : {0.0f, 1e-3f})
    for (DType copy_t : {DType::F32, DType::F16, DType::BF16}) {  // F32 here: no compute copy
      const bool has_copy = copy_t != DType::F32;
      const std::string what = std::string("amsgrad wd ") + std::to_string(wd) + " copy " + dtype_name(copy_t);
      INFO(what);
      s.weight_decay = wd;
      Dual w = random_dual(rng, DType::F32, Shape{n});
      Dual m = random_dual(rng, DType::F32, Shape{n}, -0.01f, 0.01f);
      Dual v = random_dual(rng, DType::F32, Shape{n}, 1e-6f, 1e-3f);
      Dual vhat = random_dual(rng, DType::F32, Shape{n}, 1e-6f, 2e-3f);
      Dual copy = poisoned(has_copy ? copy_t : DType::F16, Shape{n});
      // Host-driven steps 1..3.
      for (int k = 0; k < 3; ++k) {
        Dual g = gradients(rng, n, k);
        s.t = k + 1;
        be().cpu->optimizer_step(s, w.c, g.c, {m.c, v.c, vhat.c}, has_copy ? copy.c : Tensor());
        be().gpu->optimizer_step(s, w.g, g.g, {m.g, v.g, vhat.g}, has_copy ? copy.g : Tensor());
      }
      expect_bits(w, what + " master after the host-driven steps");
      expect_bits(vhat, what + " v_hat after the host-driven steps");
      // Device-state steps 4..5 (t = applied_total + 1), then one that is not finite.
      Dual lr = from_floats(DType::F32, Shape{1}, {1.5e-3f});
      for (int k = 3; k < 6; ++k) {
        Dual g = gradients(rng, n, k);
        Dual st = step_state(k, /*finite=*/k < 5);
        be().cpu->optimizer_step_state(s, w.c, g.c, {m.c, v.c, vhat.c}, has_copy ? copy.c : Tensor(), st.c, lr.c);
        be().gpu->optimizer_step_state(s, w.g, g.g, {m.g, v.g, vhat.g}, has_copy ? copy.g : Tensor(), st.g, lr.g);
      }
      expect_bits(w, what + " master");
      expect_bits(m, what + " m");
      expect_bits(v, what + " v");
      expect_bits(vhat, what + " v_hat");
      if (has_copy) expect_bits(copy, what + " compute copy");
    }
}
