// SPDX-License-Identifier: MIT
// The step without host synchronisation on the CUDA backend (Backend::*_state ops, the
// double-buffered staged upload, CUDA graphs) against the CPU backend's twins and against
// the host-driven ops, bit for bit: the StepState after a scripted sequence of finite and
// non-finite steps (growth, backoff, the min_scale floor, fixed and no scaling), the scaled
// loss gradient, the unscale verdict, the optimizer gated by the verdict; the staged upload
// while the compute stream is busy; graphs replayed against the same ops run uncaptured.
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/step_state.h"
#include "core/error.h"
#include "cuda/cuda_compare.h"
#include "support/float_bits.h"
#include "support/skip.h"

using namespace cudatest;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// A StepState on both backends.
Dual state_dual(const StepState& st) { return from_bytes(DType::U8, Shape{sizeof(StepState)}, &st); }

StepState read_state(Backend& b, const Tensor& t) {
  StepState st;
  b.download(&st, t);
  return st;
}

void set_state(const Dual& d, const StepState& st) {
  be().cpu->upload(d.c, &st);
  be().gpu->upload(d.g, &st);
}

/// Every field but the scratch flag `bad` (the CPU's unscale never writes it) and `pad`.
void expect_same_state(const StepState& c, const StepState& g, const std::string& what) {
  INFO(what);
  CHECK(g.scale == c.scale);
  CHECK(g.good_steps == c.good_steps);
  CHECK(g.skipped_total == c.skipped_total);
  CHECK(g.consecutive_skips == c.consecutive_skips);
  CHECK(g.applied_total == c.applied_total);
  CHECK(g.finite == c.finite);
  CHECK(g.last_skip_reason == c.last_skip_reason);
  CHECK(support::same_or_both_nan(g.loss_sum, c.loss_sum));  // NaN payloads differ between CPU and GPU
  CHECK(g.correct == c.correct);
  CHECK(g.counted == c.counted);
  CHECK(g.steps == c.steps);
  CHECK(g.skipped == c.skipped);
  CHECK(g.nonfinite_loss_steps == c.nonfinite_loss_steps);
  CHECK(g.max_consecutive_skips == c.max_consecutive_skips);
}

void expect_same_state(const Dual& d, const std::string& what) {
  expect_same_state(read_state(*be().cpu, d.c), read_state(*be().gpu, d.g), what);
}

/// Bit equality of two tensors of one backend, any two NaNs equal (support/float_bits.h).
void expect_equal_bytes(Backend& b, const Tensor& x, const Tensor& y, const std::string& what) {
  const std::vector<uint8_t> a = raw(b, x), c = raw(b, y);
  REQUIRE(a.size() == c.size());
  REQUIRE(x.dtype == y.dtype);
  const size_t n = a.size() / dtype_size(x.dtype);
  const size_t first = support::first_difference_nan_equal(a.data(), c.data(), a.size(), x.dtype);
  INFO(what << ": first differing element " << first << " of " << n << " (" << dtype_name(x.dtype) << ")");
  CHECK(first == n);
}

Dual scalar(float v) { return from_floats(DType::F32, Shape{1}, {v}); }

std::vector<OptimizerStep> optimizer_cases(std::vector<std::string>& names) {
  std::vector<OptimizerStep> out;
  OptimizerStep s;
  s.kind = OptimizerStep::Kind::Sgd;
  out.push_back(s), names.push_back("sgd");
  s.momentum = 0.9f;
  out.push_back(s), names.push_back("sgd momentum");
  s.nesterov = true;
  s.weight_decay = 1e-4f;
  out.push_back(s), names.push_back("sgd nesterov + l2");
  OptimizerStep a;
  a.kind = OptimizerStep::Kind::Adam;
  out.push_back(a), names.push_back("adam");
  a.weight_decay = 1e-4f;
  out.push_back(a), names.push_back("adam + l2");
  a.kind = OptimizerStep::Kind::AdamW;
  a.weight_decay = 0.01f;
  a.beta2 = 0.99f;
  out.push_back(a), names.push_back("adamw");
  return out;
}

}  // namespace

TEST_CASE("cuda: unscale_and_check_state + loss_scale_update_state follow the CPU twins over a scripted run",
          "[cuda][step]") {
  struct Step {
    int grad_bad;  // 0 none, 1 inf, 2 NaN, 3 -inf
    float loss;    // the step's loss sum (may be inf/NaN)
  };
  // finite x3 (growth at the 3rd), overflow x3 (backoff to the floor), non-finite loss, finite x2,
  // NaN gradient with an inf loss, finite x4 (growth again), overflow once, finite.
  const std::vector<Step> script{{0, 101.5f}, {0, 99.25f},  {0, 97.0f},  {1, 96.5f}, {2, 96.0f}, {3, 95.5f},
                                 {0, kNaN},   {0, 94.0f},   {0, 93.5f},  {2, kInf}, {0, 92.0f}, {0, 91.0f},
                                 {0, 90.5f},  {0, 90.0f},   {1, 89.0f},  {0, 88.5f}};
  struct RuleCase {
    const char* name;
    LossScaleRule rule;
    double initial;
    int world;
  };
  std::vector<RuleCase> rules;
  {
    LossScaleRule r;
    r.mode = LossScaleRule::Mode::Dynamic;
    r.growth_interval = 3;
    r.min_scale = 2.0;
    rules.push_back({"dynamic", r, 8.0, 1});
    rules.push_back({"dynamic, world 4", r, 8.0, 4});
    rules.push_back({"dynamic at the float32 ceiling", r, 1.7014118346046923e38, 1});  // 2^127: never grows
    r.backoff_factor = 0.25;
    r.growth_factor = 3.0;
    rules.push_back({"dynamic, odd factors", r, 1000.0, 2});
    r.mode = LossScaleRule::Mode::Fixed;
    rules.push_back({"fixed", r, 128.0, 1});
    r.mode = LossScaleRule::Mode::None;
    rules.push_back({"none", r, 1.0, 1});
  }
  Rng rng(21);
  const int64_t n = 40961;
  for (const RuleCase& rc : rules) {
    StepState init;
    init.scale = rc.initial;
    Dual state = state_dual(init);
    for (size_t i = 0; i < script.size(); ++i) {
      const std::string what = std::string(rc.name) + " step " + std::to_string(i);
      std::vector<float> v = random_floats(rng, n, -60000.0f, 60000.0f);
      const size_t at = static_cast<size_t>(rng.uniform_int(static_cast<uint64_t>(n)));
      if (script[i].grad_bad == 1) v[at] = kInf;
      if (script[i].grad_bad == 2) v[at] = kNaN;
      if (script[i].grad_bad == 3) v[at] = -kInf;
      Dual grads = from_floats(DType::F32, Shape{n}, v);
      Dual loss = scalar(script[i].loss);
      Dual correct = scalar(static_cast<float>(i % 7));
      be().cpu->unscale_and_check_state(grads.c, loss.c, state.c, rc.world);
      be().gpu->unscale_and_check_state(grads.g, loss.g, state.g, rc.world);
      const StepState after_check = read_state(*be().gpu, state.g);
      INFO(what);
      CHECK(after_check.finite == ((script[i].grad_bad == 0 && std::isfinite(script[i].loss)) ? 1 : 0));
      CHECK(after_check.bad == (script[i].grad_bad != 0 ? 1 : 0));
      expect_bits(grads, what + " unscaled gradients");
      expect_same_state(state, what + " verdict");
      be().cpu->loss_scale_update_state(state.c, rc.rule, loss.c, correct.c, 64);
      be().gpu->loss_scale_update_state(state.g, rc.rule, loss.g, correct.g, 64);
      expect_same_state(state, what + " update");
    }
    // The run went through the branches it was written for.
    const StepState c = read_state(*be().cpu, state.c);
    INFO(rc.name);
    CHECK(c.steps == static_cast<int64_t>(script.size()));
    CHECK(c.skipped_total == 6);
    CHECK(c.applied_total == 10);
    CHECK(c.nonfinite_loss_steps == 2);
    CHECK(c.max_consecutive_skips == 4);
    CHECK(c.counted == 14 * 64);
    CHECK(c.last_skip_reason == kStepSkipBackwardOverflow);
  }
}

TEST_CASE("cuda: unscale_and_check_state equals unscale_and_check (grads and verdict), empty gradients",
          "[cuda][step]") {
  Rng rng(22);
  const int64_t n = 1000003;
  for (int world : {1, 3}) {
    std::vector<float> v = random_floats(rng, n, -70000.0f, 70000.0f);
    StepState st;
    st.scale = 32768.0;
    Dual a = from_floats(DType::F32, Shape{n}, v);  // the state op
    Dual b = from_floats(DType::F32, Shape{n}, v);  // the host-driven op
    Dual state = state_dual(st);
    Dual loss = scalar(2.5f);
    be().cpu->unscale_and_check_state(a.c, loss.c, state.c, world);
    be().gpu->unscale_and_check_state(a.g, loss.g, state.g, world);
    CHECK(be().gpu->unscale_and_check(b.g, step_inv_scale(st, world)));
    expect_bits(a, "unscale_and_check_state world " + std::to_string(world));
    expect_equal_bytes(*be().gpu, a.g, b.g, "state op vs host-driven op on the GPU");
    expect_same_state(state, "verdict");
    CHECK(read_state(*be().gpu, state.g).finite == 1);
    // A non-finite loss with finite gradients: the gradients are still unscaled, the verdict is 0.
    Dual nan_loss = scalar(kNaN);
    Dual c = from_floats(DType::F32, Shape{n}, v);
    be().cpu->unscale_and_check_state(c.c, nan_loss.c, state.c, world);
    be().gpu->unscale_and_check_state(c.g, nan_loss.g, state.g, world);
    expect_bits(c, "unscaled with a NaN loss");
    CHECK(read_state(*be().gpu, state.g).finite == 0);
    expect_same_state(state, "verdict, NaN loss");
  }
  // No gradients at all: the verdict is the loss's.
  StepState st;
  Dual state = state_dual(st);
  for (float l : {1.0f, kInf}) {
    Dual loss = scalar(l);
    be().cpu->unscale_and_check_state(Tensor(), loss.c, state.c, 1);
    be().gpu->unscale_and_check_state(Tensor(), loss.g, state.g, 1);
    CHECK(read_state(*be().gpu, state.g).finite == (l == 1.0f ? 1 : 0));
    expect_same_state(state, "no gradients");
  }
}

TEST_CASE("cuda: softmax_cross_entropy_scaled equals softmax_cross_entropy with the host's grad_scale",
          "[cuda][step][loss]") {
  Rng rng(23);
  for (int K : {10, 100}) {
    const int N = K == 10 ? 1000 : 77;
    Dual z = random_dual(rng, DType::F32, Shape{N, K}, -8.0f, 8.0f);
    std::vector<int32_t> lab(static_cast<size_t>(N));
    for (auto& l : lab) l = static_cast<int32_t>(rng.uniform_int(static_cast<uint64_t>(K)));
    Dual labels = from_bytes(DType::I32, Shape{N}, lab.data());
    for (double scale : {32768.0, 3.0, 0.125, 1.0e9})
      for (double weight : {1.0, 0.25, 1.0 / 3.0}) {
        const std::string what = "K=" + std::to_string(K) + " scale " + std::to_string(scale) + " weight " +
                                 std::to_string(weight);
        StepState st;
        st.scale = scale;
        Dual state = state_dual(st);
        Dual loss = poisoned(DType::F32, Shape{1}), correct = poisoned(DType::F32, Shape{1});
        Dual dz = poisoned(DType::F32, Shape{N, K});
        Dual loss_h = poisoned(DType::F32, Shape{1}), correct_h = poisoned(DType::F32, Shape{1});
        Dual dz_h = poisoned(DType::F32, Shape{N, K});
        for (Backend* b : {be().cpu.get(), be().gpu.get()}) {
          const bool gpu = b == be().gpu.get();
          b->softmax_cross_entropy_scaled(gpu ? z.g : z.c, gpu ? labels.g : labels.c, gpu ? state.g : state.c,
                                          weight, gpu ? loss.g : loss.c, gpu ? correct.g : correct.c,
                                          gpu ? dz.g : dz.c);
          b->softmax_cross_entropy(gpu ? z.g : z.c, gpu ? labels.g : labels.c, step_grad_scale(st, weight),
                                   gpu ? loss_h.g : loss_h.c, gpu ? correct_h.g : correct_h.c,
                                   gpu ? dz_h.g : dz_h.c);
          expect_equal_bytes(*b, gpu ? dz.g : dz.c, gpu ? dz_h.g : dz_h.c,
                             what + (gpu ? " cuda" : " cpu") + " dlogits, state vs host scale");
          expect_equal_bytes(*b, gpu ? loss.g : loss.c, gpu ? loss_h.g : loss_h.c, what + " loss sum");
          expect_equal_bytes(*b, gpu ? correct.g : correct.c, gpu ? correct_h.g : correct_h.c, what + " correct");
        }
        expect_close(dz, 1e-5, what + " dlogits cuda vs cpu");
        expect_close(loss, 1e-5, what + " loss sum cuda vs cpu");
        expect_bits(correct, what + " correct count cuda vs cpu");
        // The op reads the state and never writes it.
        expect_same_state(state, what + " state untouched");
        CHECK(read_state(*be().gpu, state.g).scale == scale);
      }
  }
}

TEST_CASE("cuda: optimizer_step_state skips on finite=0 and equals optimizer_step on finite=1", "[cuda][step]") {
  Rng rng(24);
  const int64_t n = 100003;
  std::vector<std::string> names;
  const std::vector<OptimizerStep> cases = optimizer_cases(names);
  LossScaleRule rule;  // advances applied_total (Adam's t) on a finite step
  rule.mode = LossScaleRule::Mode::None;
  for (size_t ci = 0; ci < cases.size(); ++ci)
    for (DType copy_t : {DType::F32, DType::F16, DType::BF16})  // F32 here: no compute copy
      for (int64_t t0 : {int64_t{1}, int64_t{7}, int64_t{4000}}) {
        const OptimizerStep& s = cases[ci];
        const bool sgd = s.kind == OptimizerStep::Kind::Sgd;
        if (sgd && t0 != 1) continue;  // t is Adam's
        const bool has_copy = copy_t != DType::F32;
        const DType ct = has_copy ? copy_t : DType::F16;
        const std::string what = names[ci] + " copy " + dtype_name(copy_t) + " t " + std::to_string(t0);
        INFO(what);
        const std::vector<float> w0 = random_floats(rng, n), g0 = random_floats(rng, n, -0.1f, 0.1f),
                                 m0 = random_floats(rng, n, -0.01f, 0.01f), v0 = random_floats(rng, n, 1e-6f, 1e-3f);
        // Set A runs the state op, set B the host-driven op; both start equal.
        Dual wa = from_floats(DType::F32, Shape{n}, w0), wb = from_floats(DType::F32, Shape{n}, w0);
        Dual ga = from_floats(DType::F32, Shape{n}, g0), gb = from_floats(DType::F32, Shape{n}, g0);
        Dual ma = from_floats(DType::F32, Shape{n}, m0), mb = from_floats(DType::F32, Shape{n}, m0);
        Dual va = from_floats(DType::F32, Shape{n}, v0), vb = from_floats(DType::F32, Shape{n}, v0);
        Dual ca = poisoned(ct, Shape{n}), cb = poisoned(ct, Shape{n});
        const float lr = sgd ? 0.05f : 1e-3f;
        Dual lr_dev = scalar(lr);
        Dual loss = scalar(1.0f), correct = scalar(0.0f);
        StepState st;
        st.applied_total = t0 - 1;
        st.finite = 0;
        Dual state = state_dual(st);
        auto run_state_op = [&](Backend& b, bool gpu) {
          b.optimizer_step_state(s, gpu ? wa.g : wa.c, gpu ? ga.g : ga.c, gpu ? ma.g : ma.c,
                                 sgd ? Tensor() : (gpu ? va.g : va.c), has_copy ? (gpu ? ca.g : ca.c) : Tensor(),
                                 gpu ? state.g : state.c, gpu ? lr_dev.g : lr_dev.c);
        };
        // finite = 0: nothing changes, on either backend.
        for (Backend* b : {be().cpu.get(), be().gpu.get()}) {
          const bool gpu = b == be().gpu.get();
          const std::vector<uint8_t> w_before = raw(*b, gpu ? wa.g : wa.c), m_before = raw(*b, gpu ? ma.g : ma.c),
                                     v_before = raw(*b, gpu ? va.g : va.c), c_before = raw(*b, gpu ? ca.g : ca.c);
          run_state_op(*b, gpu);
          CHECK(raw(*b, gpu ? wa.g : wa.c) == w_before);
          CHECK(raw(*b, gpu ? ma.g : ma.c) == m_before);
          CHECK(raw(*b, gpu ? va.g : va.c) == v_before);
          CHECK(raw(*b, gpu ? ca.g : ca.c) == c_before);
        }
        // finite = 1: three steps, t advancing through loss_scale_update_state.
        st.finite = 1;
        set_state(state, st);
        for (int k = 0; k < 3; ++k) {
          OptimizerStep h = s;
          h.lr = lr;
          h.t = t0 + k;
          for (Backend* b : {be().cpu.get(), be().gpu.get()}) {
            const bool gpu = b == be().gpu.get();
            run_state_op(*b, gpu);
            b->loss_scale_update_state(gpu ? state.g : state.c, rule, gpu ? loss.g : loss.c,
                                       gpu ? correct.g : correct.c, 1);
            b->optimizer_step(h, gpu ? wb.g : wb.c, gpu ? gb.g : gb.c, gpu ? mb.g : mb.c,
                              sgd ? Tensor() : (gpu ? vb.g : vb.c), has_copy ? (gpu ? cb.g : cb.c) : Tensor());
          }
        }
        CHECK(read_state(*be().gpu, state.g).applied_total == t0 + 2);
        expect_bits(wa, what + " master, state op cuda vs cpu");
        expect_bits(ma, what + " state1, state op cuda vs cpu");
        if (!sgd) expect_bits(va, what + " state2, state op cuda vs cpu");
        if (has_copy) expect_bits(ca, what + " compute copy, state op cuda vs cpu");
        expect_equal_bytes(*be().gpu, wa.g, wb.g, what + " master, state op vs optimizer_step on the GPU");
        expect_equal_bytes(*be().gpu, ma.g, mb.g, what + " state1, state op vs optimizer_step on the GPU");
        if (!sgd) expect_equal_bytes(*be().gpu, va.g, vb.g, what + " state2, state op vs optimizer_step on the GPU");
        if (has_copy) expect_equal_bytes(*be().gpu, ca.g, cb.g, what + " copy, state op vs optimizer_step on the GPU");
      }
}

namespace {

/// Work that keeps the compute stream busy for a while (float32 matmuls without TF32).
struct Busy {
  Buffer xb, wb, yb;
  Tensor x, w, y;
  Busy() {
    Backend& g = *be().gpu;
    const int64_t d = 2048;
    xb = g.alloc(sizeof(float) * d * d, "busy x");
    wb = g.alloc(sizeof(float) * d * d, "busy w");
    yb = g.alloc(sizeof(float) * d * d, "busy y");
    x = xb.view(DType::F32, Shape{d, d});
    w = wb.view(DType::F32, Shape{d, d});
    y = yb.view(DType::F32, Shape{d, d});
    g.fill(x, 0.5f);
    g.fill(w, 0.25f);
  }
  void run(int times) {
    for (int i = 0; i < times; ++i) be().gpu->dense_forward(x, w, Tensor(), y, Activation::None);
  }
};

std::vector<float> pattern(int64_t n, int i) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[static_cast<size_t>(k)] = static_cast<float>((i + 1) * 1000 + (k % 997));
  return v;
}

}  // namespace

TEST_CASE("cuda: staged upload, two slots alternately while the compute stream is busy", "[cuda][staging]") {
  Backend& g = *be().gpu;
  Busy busy;
  busy.run(1);  // the matmul plan, outside the loop
  g.synchronize();
  const int64_t n = 1 << 20;  // 4 MiB a batch
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  Buffer dst[2] = {g.alloc(bytes, "staged dst 0"), g.alloc(bytes, "staged dst 1")};
  const int iters = 8;
  std::vector<Buffer> out;
  for (int i = 0; i < iters; ++i) out.push_back(g.alloc(bytes, "staged out"));
  for (int i = 0; i < iters; ++i) {
    const int slot = i % 2;
    auto* host = static_cast<float*>(g.staging(slot, bytes));  // waits for this slot's previous copy
    const std::vector<float> v = pattern(n, i);
    std::memcpy(host, v.data(), bytes);
    // Two pieces, to exercise the offset.
    g.upload_staged(slot, dst[slot].data(), 0, bytes / 2);
    g.upload_staged(slot, static_cast<char*>(dst[slot].data()) + bytes / 2, bytes / 2, bytes - bytes / 2);
    busy.run(3);  // the copy of the next batch runs ahead of this
    g.copy(out[static_cast<size_t>(i)].view(DType::F32, Shape{n}), dst[slot].view(DType::F32, Shape{n}));
    g.release_staged(slot);
  }
  for (int i = 0; i < iters; ++i) {
    std::vector<float> got(static_cast<size_t>(n));
    g.download(got.data(), out[static_cast<size_t>(i)].view(DType::F32, Shape{n}));
    INFO("batch " << i);
    CHECK(got == pattern(n, i));
  }
  // Growing keeps the contents (as the CPU backend); an upload past the end is an error.
  auto* p = static_cast<float*>(g.staging(0, bytes));
  p[0] = 42.0f;
  p = static_cast<float*>(g.staging(0, 2 * bytes));
  CHECK(p[0] == 42.0f);
  CHECK_THROWS_AS(g.upload_staged(0, dst[0].data(), 2 * bytes - 4, 8), Error);
}

namespace {

/// The buffers of one training-step tail: loss, unscale, optimizer, scaler update.
struct StepBuffers {
  static constexpr int64_t N = 256, K = 10, n = 300007;
  Buffer logits_b, labels_b, loss_b, correct_b, dlogits_b, gsrc_b, grads_b, master_b, m_b, v_b, copy_b, state_b,
      lr_b;
  Tensor logits, labels, loss, correct, dlogits, gsrc, grads, master, m, v, copy, state, lr;

  StepBuffers(const std::vector<float>& z, const std::vector<int32_t>& lab, const std::vector<float>& g0,
              const std::vector<float>& w0, const StepState& st, float lr0) {
    Backend& g = *be().gpu;
    auto make = [&](Buffer& b, Tensor& t, DType dt, Shape s, const char* what) {
      b = g.alloc(static_cast<size_t>(s.numel()) * dtype_size(dt), what);
      t = b.view(dt, s);
    };
    make(logits_b, logits, DType::F32, Shape{N, K}, "logits");
    make(labels_b, labels, DType::I32, Shape{N}, "labels");
    make(loss_b, loss, DType::F32, Shape{1}, "loss");
    make(correct_b, correct, DType::F32, Shape{1}, "correct");
    make(dlogits_b, dlogits, DType::F32, Shape{N, K}, "dlogits");
    make(gsrc_b, gsrc, DType::F32, Shape{n}, "grads source");
    make(grads_b, grads, DType::F32, Shape{n}, "grads");
    make(master_b, master, DType::F32, Shape{n}, "master");
    make(m_b, m, DType::F32, Shape{n}, "m");
    make(v_b, v, DType::F32, Shape{n}, "v");
    make(copy_b, copy, DType::BF16, Shape{n}, "copy");
    make(state_b, state, DType::U8, Shape{sizeof(StepState)}, "state");
    make(lr_b, lr, DType::F32, Shape{1}, "lr");
    g.upload(logits, z.data());
    g.upload(labels, lab.data());
    g.upload(gsrc, g0.data());
    g.upload(master, w0.data());
    g.fill(m, 0.0f);
    g.fill(v, 0.0f);
    g.fill(copy, 0.0f);
    g.upload(state, &st);
    g.upload(lr, &lr0);
  }

  /// The ops of one step, all of them capturable.
  void ops(const LossScaleRule& rule) {
    Backend& g = *be().gpu;
    OptimizerStep s;
    s.kind = OptimizerStep::Kind::Adam;
    s.weight_decay = 1e-4f;
    g.copy(grads, gsrc);
    g.softmax_cross_entropy_scaled(logits, labels, state, 0.5, loss, correct, dlogits);
    g.unscale_and_check_state(grads, loss, state, 2);
    g.optimizer_step_state(s, master, grads, m, v, copy, state, lr);
    g.loss_scale_update_state(state, rule, loss, correct, N);
  }
};

void expect_same_buffers(const StepBuffers& a, const StepBuffers& b, const std::string& what) {
  Backend& g = *be().gpu;
  const std::pair<const char*, std::pair<Tensor, Tensor>> pairs[] = {
      {"loss", {a.loss, b.loss}},       {"correct", {a.correct, b.correct}}, {"dlogits", {a.dlogits, b.dlogits}},
      {"grads", {a.grads, b.grads}},    {"master", {a.master, b.master}},    {"m", {a.m, b.m}},
      {"v", {a.v, b.v}},                {"copy", {a.copy, b.copy}},          {"state", {a.state, b.state}}};
  for (const auto& p : pairs) expect_equal_bytes(g, p.second.first, p.second.second, what + " " + p.first);
}

}  // namespace

TEST_CASE("cuda: a captured step tail replayed 3 times equals the same ops run uncaptured", "[cuda][graph]") {
  Backend& g = *be().gpu;
  if (!g.supports_graphs()) {  // MPX_CUDA_SYNC_DEBUG builds
    CHECK_FALSE(g.graph_begin_capture());
    return;
  }
  Rng rng(25);
  std::vector<float> z = random_floats(rng, StepBuffers::N * StepBuffers::K, -4.0f, 4.0f);
  std::vector<int32_t> lab(static_cast<size_t>(StepBuffers::N));
  for (auto& l : lab) l = static_cast<int32_t>(rng.uniform_int(StepBuffers::K));
  std::vector<float> g0 = random_floats(rng, StepBuffers::n, -3000.0f, 3000.0f);
  const std::vector<float> w0 = random_floats(rng, StepBuffers::n);
  LossScaleRule rule;
  rule.growth_interval = 2;
  rule.min_scale = 1.0 / 64;
  StepState st;
  st.scale = 1024.0;
  for (bool overflow : {false, true}) {
    if (overflow) g0[12345] = kInf;  // every step skipped: weights untouched, the scale backs off
    const std::string what = overflow ? "skipped steps" : "applied steps";
    StepBuffers cap(z, lab, g0, w0, st, 1e-3f), ref(z, lab, g0, w0, st, 1e-3f);
    // Warm-up: one step on both, uncaptured (scratch and plans exist before the capture).
    cap.ops(rule);
    ref.ops(rule);
    REQUIRE(g.graph_begin_capture());
    cap.ops(rule);
    const int id = g.graph_end_capture();
    REQUIRE(id >= 0);
    for (int k = 0; k < 3; ++k) {
      const float lr = 1e-3f * static_cast<float>(k + 2);  // a new learning rate every step
      g.upload(cap.lr, &lr);
      g.upload(ref.lr, &lr);
      g.graph_launch(id);
      ref.ops(rule);
    }
    g.synchronize();
    expect_same_buffers(cap, ref, what + ": graph vs uncaptured");
    const StepState after = read_state(g, cap.state);
    INFO(what);
    CHECK(after.steps == 4);
    if (overflow) {
      CHECK(after.skipped_total == 4);
      CHECK(after.applied_total == 0);
      CHECK(after.scale == 1024.0 / 16);
      std::vector<float> w(w0.size());
      g.download(w.data(), cap.master);
      CHECK(w == w0);
    } else {
      CHECK(after.applied_total == 4);
      CHECK(after.scale == 1024.0 * 4);  // grown after steps 2 and 4: the graph read the scale every launch
    }
  }
}

TEST_CASE("cuda: staged uploads feeding a graph that releases the slot (event record node)", "[cuda][graph][staging]") {
  Backend& g = *be().gpu;
  if (!g.supports_graphs()) MPX_SKIP("this build has no CUDA graphs (MPX_CUDA_SYNC_DEBUG)");
  Busy busy;
  busy.run(1);
  const int64_t n = 1 << 18;
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  Buffer dst[2] = {g.alloc(bytes, "staged dst 0"), g.alloc(bytes, "staged dst 1")};
  Buffer acc_b = g.alloc(bytes, "accumulator");
  const Tensor acc = acc_b.view(DType::F32, Shape{n});
  g.fill(acc, 0.0f);
  g.synchronize();
  int graph[2];
  for (int slot = 0; slot < 2; ++slot) {
    REQUIRE(g.graph_begin_capture());
    const Tensor d = dst[slot].view(DType::F32, Shape{n});
    g.add(acc, d, acc);
    g.release_staged(slot);
    graph[slot] = g.graph_end_capture();
  }
  const int iters = 10;
  std::vector<float> expect(static_cast<size_t>(n), 0.0f);
  for (int i = 0; i < iters; ++i) {
    const int slot = i % 2;
    auto* host = static_cast<float*>(g.staging(slot, bytes));
    const std::vector<float> v = pattern(n, i);
    std::memcpy(host, v.data(), bytes);
    for (size_t k = 0; k < v.size(); ++k) expect[k] += v[k];  // small integers: exact in float32
    g.upload_staged(slot, dst[slot].data(), 0, bytes);
    busy.run(2);
    g.graph_launch(graph[slot]);
  }
  std::vector<float> got(static_cast<size_t>(n));
  g.download(got.data(), acc);
  CHECK(got == expect);
}

TEST_CASE("cuda: graph capture refuses what synchronizes or allocates, and the stream works afterwards",
          "[cuda][graph]") {
  Backend& g = *be().gpu;
  if (!g.supports_graphs()) MPX_SKIP("this build has no CUDA graphs (MPX_CUDA_SYNC_DEBUG)");
  Buffer b = g.alloc(sizeof(float) * 1024, "capture errors");
  const Tensor t = b.view(DType::F32, Shape{1024});
  std::vector<float> host(1024, 1.0f);
  REQUIRE(g.graph_begin_capture());
  CHECK_THROWS_WITH(g.synchronize(), Catch::Contains("not allowed while capturing"));
  // The capture was abandoned: ending it is an error, and the stream runs ops again.
  CHECK_THROWS_WITH(g.graph_end_capture(), Catch::Contains("without a capture in progress"));
  g.fill(t, 3.0f);
  std::vector<float> back(1024);
  g.download(back.data(), t);
  CHECK(back == std::vector<float>(1024, 3.0f));

  REQUIRE(g.graph_begin_capture());
  CHECK_THROWS_WITH(g.upload(t, host.data()), Catch::Contains("upload"));
  REQUIRE(g.graph_begin_capture());
  CHECK_THROWS_WITH(g.stats(t), Catch::Contains("stats"));
  REQUIRE(g.graph_begin_capture());
  CHECK_THROWS_WITH(g.alloc(64, "in capture"), Catch::Contains("alloc"));

  // A scratch slot that would have to grow: the loss's per-row results for more rows than ever.
  const int64_t N = 3 << 20;
  Buffer zb = g.alloc(sizeof(float) * N, "big logits"), lb = g.alloc(sizeof(int32_t) * N, "big labels");
  Buffer sb = g.alloc(2 * sizeof(float), "big loss");
  const Tensor z = zb.view(DType::F32, Shape{N, 1}), labels = lb.view(DType::I32, Shape{N});
  const Tensor loss = sb.view(DType::F32, Shape{1});
  const Tensor correct(static_cast<float*>(sb.data()) + 1, DType::F32, Shape{1});
  g.fill(z, 0.5f);
  g.fill(labels, 0.0f);
  REQUIRE(g.graph_begin_capture());
  CHECK_THROWS_WITH(g.softmax_cross_entropy(z, labels, 1.0f, loss, correct, Tensor()),
                    Catch::Contains("scratch") && Catch::Contains("warm-up"));
  // Uncaptured, the same call grows the slot and works.
  g.softmax_cross_entropy(z, labels, 1.0f, loss, correct, Tensor());
  float c = 0.0f;
  g.download(&c, correct);
  CHECK(c == static_cast<float>(N));
  CHECK_THROWS_AS(g.graph_launch(1 << 20), Error);
}
