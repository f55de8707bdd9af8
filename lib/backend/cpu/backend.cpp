// SPDX-License-Identifier: MIT
// CpuBackend: the Backend of host memory. Each *_impl forwards to the op group
// in its own file (memory.cpp, conv.cpp, ...); the op table's are generated from
// backend/op_table.inc. This file only wires them and owns the Context (scratch,
// oneDNN engine/stream, plan cache).
#include <omp.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <string>

#include <fmt/format.h>

#include "backend/backend.h"
#include "core/env.h"
#include "backend/step_state.h"
#include "core/error.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/switches.h"
#include "core/half.h"

namespace mpx {
namespace cpu {

namespace {
std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}
// MPX_CPU_PROFILE=1 (profiling(), switches.h): wall time per op, printed to stderr when the
// backend goes away (ops run synchronously on the CPU, so the time of a call is the op's time).

struct OpTimes {
  struct Entry {
    double wall = 0.0, cpu = 0.0;
    int64_t calls = 0;
  };
  std::map<std::string, Entry> t;
  ~OpTimes() {
    if (t.empty()) return;
    double wall = 0.0, cpu = 0.0;
    for (const auto& [k, v] : t) wall += v.wall, cpu += v.cpu;
    std::fprintf(stderr, "MPX_CPU_PROFILE: %.3f s wall, %.3f s process CPU in backend ops\n", wall, cpu);
    for (const auto& [k, v] : t)
      std::fprintf(stderr, "  %-26s wall %9.3f ms %5.1f%%  cpu %9.3f ms %5.1f%% %7lld calls\n", k.c_str(),
                   v.wall * 1e3, 100.0 * v.wall / wall, v.cpu * 1e3, 100.0 * v.cpu / cpu,
                   static_cast<long long>(v.calls));
  }
};

class OpTimer {
 public:
  OpTimer(OpTimes& t, const char* name) : t_(profiling() ? &t : nullptr), name_(name) {
    if (t_) t0_ = std::chrono::steady_clock::now(), c0_ = cpu_seconds();
  }
  ~OpTimer() {
    if (!t_) return;
    auto& e = t_->t[name_];
    e.wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    e.cpu += cpu_seconds() - c0_;
    ++e.calls;
  }
  /// Records nothing (the op handed its work to others, which time themselves).
  void discard() { t_ = nullptr; }
  static double cpu_seconds() {  // all threads of the process (OpenMP workers included)
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }

 private:
  OpTimes* t_;
  const char* name_;
  std::chrono::steady_clock::time_point t0_;
  double c0_ = 0.0;
};
}  // namespace

#define MPX_OP_TIMER(name) OpTimer op_timer_(times_, name)

class CpuBackend final : public Backend {
 public:
  CpuBackend()
      : ctx_([this](size_t b) { note_alloc(b); }, [this](size_t b) { note_free(b); }) {}
  void set_winograd(WinogradMode m) { ctx_.winograd = m; }

  DeviceInfo info() const override {
    DeviceInfo d;
    d.name = "cpu";
    std::string isa;
    if (__builtin_cpu_supports("avx512f")) isa += " avx512f";
    if (__builtin_cpu_supports("avx2")) isa += " avx2";
    if (__builtin_cpu_supports("fma")) isa += " fma";
    if (have_f16c()) isa += " f16c";
    d.description = fmt::format("{} ({} threads,{})", cpu_model_name(), omp_get_max_threads(), isa);
    // bf16 beats f32 only on oneDNN's AMX kernels; f16 (AVX512-FP16, no AMX-FP16 in oneDNN
    // 3.2's training kernels) does not (docs/precision.md).
    d.native_bf16 = path16(DType::BF16).native && dnnl_has_amx_bf16();
    d.native_f16 = false;
    d.math_bf16 = path16(DType::BF16).text;
    d.math_f16 = path16(DType::F16).text;
    return d;
  }

  bool supports(Op op, DType t) const override {
    switch (op) {
      case Op::SoftmaxCrossEntropy:
      case Op::UnscaleAndCheck:
      case Op::OptimizerStep:
        return t == DType::F32;
      default:
        return is_float(t);
    }
  }

  void synchronize() override {}

  std::string library() const override { return dnnl_description(); }
  std::vector<KernelChoice> kernels() const override {
    std::vector<KernelChoice> v;
    for (const auto& [what, impl] : ctx_.kernels()) v.push_back({what, impl});
    return v;
  }
  std::vector<Math16Report> math16() const override {
    std::vector<Math16Report> v;
    for (DType t : {DType::BF16, DType::F16}) {
      const auto [native, widened] = ctx_.math16_count(t);
      if (native + widened == 0) continue;
      Math16Report r;
      r.dtype = dtype_name(t);
      r.native_ops = native, r.widened_ops = widened;
      r.path = widened == 0 ? "native" : native == 0 ? "widened" : "mixed";
      r.detail = path16(t).text;
      if (path16(t).per_shape || path16(t).amx_own) {  // the choosers took them for some shapes only
        if (native == 0) r.detail = fmt::format("widened to float32 (for these shapes; {})", path16(t).text);
        if (native > 0 && widened > 0)
          r.detail += fmt::format("; {} of {} ops widened to float32 (see the kernels)", widened, native + widened);
      } else if (native == 0 && path16(t).native)
        r.detail = fmt::format("widened to float32 (oneDNN has no native {} kernel for these ops: see the kernels)",
                               r.dtype);
      else if (native > 0 && widened > 0)
        r.detail += fmt::format("; {} of {} ops widened to float32 (oneDNN has no native kernel for them: see the "
                                "kernels)",
                                widened, native + widened);
      v.push_back(std::move(r));
    }
    return v;
  }

 private:
  void* alloc_impl(size_t bytes) override {
    // 256 bytes, as cudaMalloc: the model's parameter arenas rely on it (docs/design.md).
    const size_t n = (bytes + 255) / 256 * 256;
    return std::aligned_alloc(256, n == 0 ? 256 : n);
  }
  void free_impl(void* p) override { std::free(p); }
  void upload_impl(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download_impl(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  // The op table's ops (backend/op_table.inc): each forwards to cpu::NAME in its family's file.
#define MPX_OP(NAME, GROUP, PARAMS, ARGS, ...)  \
  void NAME##_impl PARAMS override {             \
    MPX_OP_TIMER(#NAME);                         \
    cpu::NAME(ctx_, MPX_OP_ARGS ARGS);           \
  }
#include "backend/op_table.inc"

  void pool_forward_impl(const PoolParams& p, const Tensor& x, const Tensor& y) override {
    MPX_OP_TIMER("pool_forward");
    cpu::pool_forward(ctx_, p, x, y);
  }
  void pool_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                          const Tensor& dx) override {
    MPX_OP_TIMER("pool_backward");
    cpu::pool_backward(ctx_, p, x, y, dy, dx);
  }
  void max_pool_relu_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                   const Tensor& dx) override {
    MPX_OP_TIMER("max_pool_relu_backward");
    cpu::pool_backward(ctx_, p, x, y, dy, dx, true);
  }
  void dense_relu_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                     const Tensor& dx) override {
    MPX_OP_TIMER("dense_relu_backward_data");
    cpu::dense_relu_backward_data(ctx_, dy, w, x, dx);
  }
  void dense_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw, const Tensor& db,
                           const Tensor& dx, bool relu_input) override {
    {
      OpTimer t(times_, "dense_backward");
      if (cpu::dense_backward(ctx_, x, dy, w, dw, db, dx, relu_input)) return;
      t.discard();
    }
    Backend::dense_backward_impl(x, dy, w, dw, db, dx, relu_input);
  }
  void dense_conv_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& dw, const Tensor& db,
                                const Tensor& dx, const Conv2dParams& p, const Tensor& conv_x, const Tensor& conv_dw,
                                const Tensor& conv_db) override {
    {
      OpTimer t(times_, "dense_conv_backward");
      if (cpu::dense_conv_backward(ctx_, x, dy, w, dw, db, p, conv_x, conv_dw, conv_db)) return;
      t.discard();
    }
    Backend::dense_conv_backward_impl(x, dy, w, dw, db, dx, p, conv_x, conv_dw, conv_db);
  }
  void max_pool_conv_backward_impl(const PoolParams& p, const Tensor& x, const Tensor& y, const Tensor& dy,
                                   const Tensor& dx, const Tensor& argmax, const Conv2dParams& cp,
                                   const Tensor& conv_x, const Tensor& conv_dw, const Tensor& conv_db) override {
    {
      OpTimer t(times_, "max_pool_conv_backward");
      if (cpu::max_pool_conv_backward(ctx_, p, x, y, dy, argmax, cp, conv_x, conv_dw, conv_db)) return;
      t.discard();
    }
    Backend::max_pool_conv_backward_impl(p, x, y, dy, dx, argmax, cp, conv_x, conv_dw, conv_db);
  }
  void conv_max_pool_forward_impl(const Conv2dParams& cp, const Tensor& x, const Tensor& w, const Tensor& bias,
                                  const Tensor& conv_y, const PoolParams& p, const Tensor& y,
                                  const Tensor& argmax) override {
    {
      OpTimer t(times_, "conv_max_pool_forward");
      if (cpu::conv_max_pool_forward(ctx_, cp, x, w, bias, conv_y, p, y, argmax)) return;
      t.discard();
    }
    Backend::conv_max_pool_forward_impl(cp, x, w, bias, conv_y, p, y, argmax);
  }
  bool conv_max_pool_forward_fuses_impl(const Conv2dParams& cp, const Shape& x, const Shape& w, DType t,
                                        const PoolParams& p, const Shape& conv_y) const override {
    return cpu::conv_max_pool_forward_fuses(ctx_.winograd, cp, x, w, t, p, conv_y);
  }
  void global_avg_pool_relu_backward_impl(const Tensor& x, const Tensor& dy, const Tensor& dx) override {
    MPX_OP_TIMER("global_avg_pool_relu_backward");
    cpu::global_avg_pool_relu_backward(ctx_, x, dy, dx);
  }
  bool max_pool_keeps_argmax_impl(const PoolParams& p, const Shape& x) const override {
    return cpu::max_pool_keeps_argmax(p, x);
  }
  int64_t dense_input_piece_rows_impl(int64_t features, int64_t units, DType t, DType x) const override {
    return cpu::dense_input_piece_rows(features, units, t, x);
  }
  int64_t max_pool_input_piece_rows_impl(const PoolParams& p, const Shape& x, DType t) const override {
    return cpu::max_pool_input_piece_rows(p, x, t);
  }
  bool conv2d_forward_in_pieces_impl(const Conv2dParams& p, const Shape& x, const Shape& w, DType t) const override {
    return cpu::conv2d_forward_in_pieces(p, x, w, t);
  }
  void max_pool_forward_argmax_impl(const PoolParams& p, const Tensor& x, const Tensor& y,
                                    const Tensor& argmax) override {
    MPX_OP_TIMER("pool_forward");
    cpu::max_pool_forward_argmax(p, x, y, argmax);
  }
  void max_pool_backward_argmax_impl(const PoolParams& p, const Tensor& y, const Tensor& argmax, const Tensor& dy,
                                     const Tensor& dx, bool relu) override {
    MPX_OP_TIMER(relu ? "max_pool_relu_backward" : "pool_backward");
    cpu::max_pool_backward_argmax(p, y, argmax, dy, dx, relu);
  }
  bool unscale_and_check_impl(const Tensor& grads, float inv_scale) override {
    MPX_OP_TIMER("unscale_and_check");
    return cpu::unscale_and_check(grads, inv_scale);
  }
  TensorStats stats_impl(const Tensor& x) override {
    MPX_OP_TIMER("stats");
    return cpu::stats(x);
  }

  // The step without host synchronisation: on the CPU the StepState is host memory, and each
  // op is its host-driven twin with the scale, verdict, lr and t read from there.
  void softmax_cross_entropy_scaled_impl(const Tensor& logits, const Tensor& labels, const Tensor& state,
                                         double weight, const Tensor& loss_sum_out, const Tensor& correct_out,
                                         const Tensor& dlogits, float label_smoothing) override {
    MPX_OP_TIMER("softmax_cross_entropy");
    cpu::softmax_cross_entropy(ctx_, logits, labels, step_grad_scale(*state.as<const StepState>(), weight),
                               loss_sum_out, correct_out, dlogits, label_smoothing);
  }
  void unscale_and_check_state_impl(const Tensor& grads, const Tensor& loss_sum, const Tensor& state,
                                    int world) override {
    MPX_OP_TIMER("unscale_and_check");
    StepState& st = *state.as<StepState>();
    bool ok = step_isfinite(*loss_sum.as<const float>());
    if (!grads.empty() && grads.numel() > 0) ok = cpu::unscale_and_check(grads, step_inv_scale(st, world)) && ok;
    st.finite = ok ? 1 : 0;
  }
  void optimizer_step_state_impl(const OptimizerStep& s, const Tensor& master, const Tensor& grads,
                                 const std::vector<Tensor>& states, const Tensor& compute_copy, const Tensor& state,
                                 const Tensor& lr_dev) override {
    MPX_OP_TIMER("optimizer_step");
    const StepState& st = *state.as<const StepState>();
    if (!st.finite) return;
    OptimizerStep u = s;
    u.lr = *lr_dev.as<const float>() * s.lr_scale;
    u.t = st.applied_total + 1;
    cpu::optimizer_step(ctx_, u, master, grads, states, compute_copy);
  }
  void loss_scale_update_state_impl(const Tensor& state, const LossScaleRule& rule, const Tensor& loss_sum,
                                    const Tensor& correct, int64_t n) override {
    step_state_update(*state.as<StepState>(), rule, *loss_sum.as<const float>(), *correct.as<const float>(), n);
  }
  void* staging_impl(int slot, size_t bytes) override {
    auto& b = staging_[static_cast<size_t>(slot)];
    if (b.size() < bytes) b.resize(bytes);
    return b.data();
  }
  void upload_staged_impl(int slot, void* dst, size_t offset, size_t bytes) override {
    const auto& b = staging_[static_cast<size_t>(slot)];
    MPX_CHECK_MSG(offset + bytes <= b.size(), fmt::format("upload_staged: {} bytes at offset {} exceed staging slot {} ({} bytes)",
                                                          bytes, offset, slot, b.size()));
    std::memcpy(dst, b.data() + offset, bytes);
  }
  void release_staged_impl(int /*slot*/) override {}

  std::array<std::vector<unsigned char>, 2> staging_;
  OpTimes times_;  // before ctx_: printed after the Context is gone
  Context ctx_;
};

}  // namespace cpu

std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& options) {
  auto b = std::make_unique<cpu::CpuBackend>();
  b->set_winograd(options.cpu_winograd);
  return b;
}

}  // namespace mpx
