// SPDX-License-Identifier: MIT
// amx_wgrad_bench: mpx's bfloat16 weight gradient on AMX tiles (conv_wgrad_amx.h;
// docs/cpu-performance.md, "The AMX weight gradient") against oneDNN's (brgconv_bwd_w on AMX
// CPUs), on the same bfloat16 inputs, for the 3x3 layers of the fast CIFAR recipe at batch 1024
// and the CIFAR seed net's second layer at batch 256: ms per call (best of N, float32 dw, no
// bias gradient) with mpx's threads sharing every pass and sharing slabs of passes, the ratio
// of oneDNN's time to that of the split mpx's rule takes, and the largest differences of the
// two mpx dw from oneDNN's. Prints one line
// where mpx's AMX kernel cannot run (CPU, build, ONEDNN_MAX_CPU_ISA or MPX_CPU_16BIT=widen).
//   build/bench/amx_wgrad_bench [--reps N] [--only TEXT]   (TEXT: the layers whose name has it)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "backend/backend.h"
#include "backend/cpu/conv/conv_wgrad_amx.h"
#include "backend/cpu/native16.h"
#include "core/half.h"

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Layer {
  const char* name;
  int64_t N, H, C, K;
};

void compare(const Layer& l, int reps) {
  using namespace dnnl;
  using tag = memory::format_tag;
  using dt = memory::data_type;
  const int64_t H = l.H, W = l.H, C = l.C, K = l.K;
  std::vector<uint16_t> x(static_cast<size_t>(l.N * H * W * C)), dy(static_cast<size_t>(l.N * H * W * K));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = mpx::f32_to_bf16(static_cast<float>(i * 2654435761u % 1000) / 1000.f - 0.5f);
  for (size_t i = 0; i < dy.size(); ++i)
    dy[i] = mpx::f32_to_bf16(static_cast<float>(i * 40503u % 1000) / 1000.f - 0.5f);

  // oneDNN: NHWC bfloat16 in, float32 dw in its chosen layout, reordered to KRSC (ohwi) after.
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::dims src_d{l.N, C, H, W}, dst_d{l.N, K, H, W}, w_d{K, C, 3, 3};
  const auto sd = memory::desc(src_d, dt::bf16, tag::nhwc), dd = memory::desc(dst_d, dt::bf16, tag::nhwc);
  const auto hint = convolution_forward::primitive_desc(eng, prop_kind::forward_training, algorithm::convolution_direct,
                                                        sd, memory::desc(w_d, dt::bf16, tag::any), dd, {1, 1}, {1, 1},
                                                        {1, 1});
  const auto pd = convolution_backward_weights::primitive_desc(
      eng, algorithm::convolution_direct, sd, memory::desc(w_d, dt::f32, tag::any), dd, {1, 1}, {1, 1}, {1, 1}, hint);
  memory msrc(sd, eng, x.data()), mdy(dd, eng, dy.data()), mdw(pd.diff_weights_desc(), eng);
  memory mref(memory::desc(w_d, dt::f32, tag::ohwi), eng);
  const auto bwd = convolution_backward_weights(pd);
  double t_dnnl = 1e30;
  for (int r = 0; r <= reps; ++r) {  // the first call is warm-up
    const double t0 = now_ms();
    bwd.execute(s, {{DNNL_ARG_SRC, msrc}, {DNNL_ARG_DIFF_DST, mdy}, {DNNL_ARG_DIFF_WEIGHTS, mdw}});
    s.wait();
    if (r > 0) t_dnnl = std::min(t_dnnl, now_ms() - t0);
  }
  reorder(mdw, mref).execute(s, mdw, mref);
  s.wait();

  // mpx: the kernel with the geometry and scratch the convolution op gives it, with the
  // threads sharing every pass and sharing slabs of passes (the op takes the rule's).
  mpx::cpu::conv_detail::Geo g{};
  g.N = l.N, g.H = H, g.W = W, g.C = C, g.K = K, g.R = g.S = 3, g.P = H, g.Q = W, g.sh = g.sw = 1, g.pt = g.pl = 1;
  const int threads = omp_get_max_threads();
  const float* ref = static_cast<const float*>(mref.get_data_handle());
  double t_split[2] = {1e30, 1e30}, max_diff[2] = {0, 0}, max_ref = 0;
  for (int k = 0; k < 2; ++k) {
    const auto split = k == 0 ? mpx::cpu::AmxSplit::Passes : mpx::cpu::AmxSplit::Slabs;
    const size_t bytes = (mpx::cpu::conv_wgrad_amx_scratch_bytes(g, threads, split) + 63) / 64 * 64;
    std::unique_ptr<void, decltype(&std::free)> scratch(std::aligned_alloc(64, bytes), &std::free);
    std::memset(scratch.get(), 0, bytes);
    std::vector<float> dw(static_cast<size_t>(K * 9 * C));
    for (int r = 0; r <= reps; ++r) {
      const double t0 = now_ms();
      mpx::cpu::conv_wgrad_amx(g, x.data(), dy.data(), dw.data(), nullptr, scratch.get(), threads, split);
      if (r > 0) t_split[k] = std::min(t_split[k], now_ms() - t0);
    }
    for (size_t i = 0; i < dw.size(); ++i)
      max_diff[k] = std::max(max_diff[k], std::fabs(static_cast<double>(ref[i]) - dw[i])),
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  const int chosen = mpx::cpu::conv_wgrad_amx_split(g) == mpx::cpu::AmxSplit::Slabs ? 1 : 0;
  std::printf("%-26s batch %5lld | oneDNN %-26s %6.2f ms | mpx passes %6.2f, slabs %6.2f ms (rule: %s) | %.2fx | "
              "max |diff| %.2g, %.2g of %.3g\n",
              l.name, static_cast<long long>(l.N), pd.impl_info_str(), t_dnnl, t_split[0], t_split[1],
              chosen ? "slabs" : "passes", t_dnnl / t_split[chosen], max_diff[0], max_diff[1], max_ref);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--reps N] [--only TEXT]\n", argv[0]);
      return 2;
    }
  }
  const std::string cpu = mpx::create_backend("cpu")->info().description;  // model, threads, ISA
  if (!mpx::cpu::own_amx_bf16()) {
    std::printf("amx_wgrad_bench: mpx's AMX kernel does not run on %s (no AMX-BF16, a build without AMX, "
                "ONEDNN_MAX_CPU_ISA or MPX_CPU_16BIT=widen): nothing to compare\n",
                cpu.c_str());
    return 0;
  }
  std::printf("amx_wgrad_bench on %s, best of %d: 3x3 same weight gradients, bfloat16 x and dy, float32 dw "
              "(oneDNN / mpx's rule = the ratio)\n",
              cpu.c_str(), reps);
  const Layer layers[] = {{"fast CIFAR 15x15x64->64", 1024, 15, 64, 64},
                          {"fast CIFAR 15x15x64->256", 1024, 15, 64, 256},
                          {"fast CIFAR 7x7x256->256", 1024, 7, 256, 256},
                          {"fast CIFAR 3x3x256->256", 1024, 3, 256, 256},
                          {"CIFAR seed 32x32x64->128", 256, 32, 64, 128}};
  for (const Layer& l : layers)
    if (only.empty() || std::strstr(l.name, only.c_str())) compare(l, reps);
  return 0;
}
