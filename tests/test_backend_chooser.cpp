// SPDX-License-Identifier: MIT
// The CPU backend's kernel choosers (conv_choose.h, dense_choose.h; docs/cpu-performance.md,
// "Which kernel runs"): asked without running anything, for every pass of the seed nets'
// convolutions and dense layers in float32 and bfloat16, their answer must be what the op then
// runs, as the backend's kernels list (what `mpx bench` prints) and its 16-bit counts record
// it. CTest runs this file again with the environment switches set (tests/CMakeLists.txt);
// each run also checks that the answer follows the switches it was started with.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/conv/conv_choose.h"
#include "backend/cpu/conv/conv_fwd_small.h"
#include "backend/cpu/conv/conv_wgrad_small.h"
#include "backend/cpu/dense/dense_choose.h"
#include "backend/cpu/dense/dense_few.h"
#include "backend/cpu/native16.h"
#include "backend/cpu/switches.h"
#include "core/rng.h"
#include "support/backend_check.h"

using namespace mpx;
using cpu::ConvKernel;
using cpu::ConvPass;
using cpu::DenseKernel;
using cpu::DensePass;

namespace {

using Dev = support::CpuDev;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool mpx_kernel(const std::string& impl) {
  return impl.rfind("winograd:", 0) == 0 || impl.rfind("mpx:", 0) == 0 || impl.rfind("gemm:", 0) == 0;
}

/// The kernels-list entry of op `what` (the op and its shapes, without a dtype), and of its
/// native form (`what16`: the dtype after the op's name); nullptr when none was recorded.
const KernelChoice* find(const std::vector<KernelChoice>& ks, const std::string& what) {
  for (const KernelChoice& k : ks)
    if (k.op == what) return &k;
  return nullptr;
}

/// Checks that what the op recorded is the chooser's answer: mpx's kernels by their name,
/// oneDNN's float32 kernel by an entry without a dtype, the native one by an entry with it.
void check_recorded(Backend& be, const std::string& op, const std::string& shapes, DType t, bool native,
                    bool mpx_own, bool reference, const std::string& name) {
  const std::vector<KernelChoice> ks = be.kernels();
  const KernelChoice* plain = find(ks, op + " for " + shapes);
  const KernelChoice* n16 = is_16bit(t) ? find(ks, op + " " + dtype_name(t) + " for " + shapes) : nullptr;
  INFO(op << " for " << shapes << " in " << dtype_name(t) << ", chosen: " << name);
  if (native) {
    REQUIRE(n16 != nullptr);
    CHECK(n16->impl.rfind("widened", 0) != 0);
    CHECK(plain == nullptr);
  } else if (reference) {
    CHECK(plain == nullptr);
    CHECK(n16 == nullptr);
  } else {
    REQUIRE(plain != nullptr);
    if (mpx_own) {
      CHECK(plain->impl == name);
    } else {
      CHECK_FALSE(mpx_kernel(plain->impl));
      CHECK(plain->impl.rfind("widened", 0) != 0);
    }
    if (n16) CHECK(n16->impl.rfind("widened", 0) == 0);  // asked natively, refused by oneDNN
  }
}

/// The 16-bit counts after one op of dtype t: native or widened as chosen.
void check_math16(Backend& be, DType t, bool native) {
  if (!is_16bit(t)) {
    CHECK(be.math16().empty());
    return;
  }
  const std::vector<Math16Report> all = be.math16();  // a copy: math16() returns by value
  REQUIRE(all.size() == 1);
  const Math16Report& r = all[0];
  CHECK(r.native_ops == (native ? 1 : 0));
  CHECK(r.widened_ops == (native ? 0 : 1));
}

/// What every answer must respect, from the switches this process runs with.
void check_switches(ConvKernel k, ConvPass pass, const cpu::conv_detail::Geo& g) {
  if (env("MPX_CPU_REFERENCE") == "1") CHECK(k == ConvKernel::Reference);
  if (env("MPX_CPU_16BIT") == "widen" || env("ONEDNN_MAX_CPU_ISA") == "AVX2") CHECK(k != ConvKernel::Native16);
  if (env("MPX_CONV_WINOGRAD") == "off") CHECK(k != ConvKernel::Winograd);
  if (env("MPX_CONV_WINOGRAD") == "off") CHECK(k != ConvKernel::Winograd16);
  if (env("MPX_CONV_FORWARD") == "onednn" && pass == ConvPass::Forward) CHECK(k != ConvKernel::FewChannels);
  if (env("MPX_CONV_WGRAD") == "gemm" && pass == ConvPass::BackwardFilter && k != ConvKernel::Native16 &&
      k != ConvKernel::Reference)
    CHECK(k == ConvKernel::WgradGemm);
  if (env("MPX_CONV_WGRAD") == "onednn" && pass == ConvPass::BackwardFilter) CHECK(k != ConvKernel::FewChannels);
  if (env("MPX_CONV_WGRAD") == "onednn" || env("MPX_CONV_WGRAD") == "gemm" || env("MPX_CPU_16BIT") == "native" ||
      env("MPX_CONV_WINOGRAD") == "on" || env("MPX_CONV_WINOGRAD") == "f2")
    CHECK(k != ConvKernel::WgradAmx);
  if (env("MPX_CONV_WINOGRAD") == "on" && g.R == 3 && g.C >= 16 && k != ConvKernel::Native16 &&
      k != ConvKernel::Reference && !(pass == ConvPass::BackwardFilter && env("MPX_CONV_WGRAD") == "gemm"))
    CHECK((k == ConvKernel::Winograd || k == ConvKernel::Winograd16));
}

struct ConvLayer {
  const char* name;
  int64_t H, W, C, K;
  int pad;
  bool first;  // the net's first layer: no data gradient
};

struct DenseLayer {
  const char* name;
  int64_t Ci, Co;
};

std::string conv_shapes(int64_t N, const ConvLayer& l) {
  return "x [" + std::to_string(N) + ", " + std::to_string(l.H) + ", " + std::to_string(l.W) + ", " +
         std::to_string(l.C) + "], w [" + std::to_string(l.K) + ", 3, 3, " + std::to_string(l.C) + "]";
}

}  // namespace

TEST_CASE("the convolution chooser's answer, asked without running the op, is the kernel the op runs and records",
          "[backend][cpu][chooser]") {
  const DType t = GENERATE(DType::F32, DType::BF16);
  // The seed CIFAR net (configs/cifar10_fp32.yaml) and the seed MNIST net (Conv2D(32, 3x3) on
  // 28x28x1, no padding, configs/mnist_seed.yaml), at a batch of 16 (2 under the reference
  // loops): no rule depends on the batch.
  const int64_t N = env("MPX_CPU_REFERENCE") == "1" ? 2 : 16;
  const ConvLayer layers[] = {{"cifar conv1", 32, 32, 3, 64, 1, true},
                              {"cifar conv2", 32, 32, 64, 128, 1, false},
                              {"mnist conv", 28, 28, 1, 32, 0, true}};
  const ConvPass pass = GENERATE(ConvPass::Forward, ConvPass::BackwardData, ConvPass::BackwardFilter);
  for (const ConvLayer& l : layers) {
    if (l.first && pass == ConvPass::BackwardData) continue;
    DYNAMIC_SECTION(l.name << " " << dtype_name(t) << " pass " << static_cast<int>(pass)) {
      Conv2dParams p;
      p.R = p.S = 3;
      p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = l.pad;
      const Shape xs{N, l.H, l.W, l.C}, ws{l.K, 3, 3, l.C};
      const int64_t P = p.out_h(static_cast<int>(l.H)), Q = p.out_w(static_cast<int>(l.W));
      const Shape ys{N, P, Q, l.K};
      cpu::ConvQuery q;
      q.pass = pass, q.p = p, q.g = cpu::conv_detail::geometry(p, xs, ws), q.in = t, q.out = t;
      q.act = pass == ConvPass::Forward ? Activation::Relu : Activation::None;
      q.w_bf16 = pass == ConvPass::Forward && t == DType::BF16;  // the op's weights are of dtype t
      const cpu::ConvChoice c = cpu::choose_conv(q);
      INFO("chosen: " << c.name << " (" << c.why << ")");
      CHECK_FALSE(c.name.empty());
      CHECK_FALSE(c.why.empty());
      CHECK(cpu::choose_conv(q).name == c.name);  // a rule, the same at every call
      check_switches(c.kernel, pass, q.g);
      if (c.kernel == ConvKernel::Winograd || c.kernel == ConvKernel::Winograd16) CHECK(c.tile > 0);

      Dev d;
      Rng rng(3);
      Tensor x = d.rand(rng, t, xs, nullptr), w = d.rand(rng, t, ws, nullptr), b = d.rand(rng, t, Shape{l.K}, nullptr);
      Tensor dy = d.rand(rng, t, ys, nullptr);
      const char* op = nullptr;
      if (pass == ConvPass::Forward) {
        Tensor y = d.make(t, ys);
        d.be->conv2d_forward(p, x, w, b, y, Activation::Relu);
        op = "convolution forward";
      } else if (pass == ConvPass::BackwardData) {
        Tensor dx = d.make(t, xs);
        d.be->conv2d_backward_data(p, dy, w, dx);
        op = "convolution backward data";
      } else {
        Tensor dw = d.make(t, ws), db = d.make(t, Shape{l.K});
        d.be->conv2d_backward_filter(p, x, dy, dw, db);
        op = "convolution backward weights";
      }
      const bool own = c.kernel == ConvKernel::Winograd || c.kernel == ConvKernel::Winograd16 ||
                       c.kernel == ConvKernel::FewChannels || c.kernel == ConvKernel::WgradGemm ||
                       c.kernel == ConvKernel::WgradAmx;
      check_recorded(*d.be, op, conv_shapes(N, l), t, c.kernel == ConvKernel::Native16, own,
                     c.kernel == ConvKernel::Reference, c.name);
      // 16-bit products count as native math: oneDNN's native kernels, mpx's AMX weight gradient
      // and its few-channel kernels on bfloat16 dot products
      const bool dots = c.kernel == ConvKernel::FewChannels &&
                        (pass == ConvPass::Forward          ? cpu::fwd_small_dots(t, t == DType::BF16)
                         : pass == ConvPass::BackwardFilter ? cpu::conv_wgrad_small_dots(t)
                                                            : false);
      check_math16(*d.be, t, c.kernel == ConvKernel::Native16 || c.kernel == ConvKernel::WgradAmx || dots);
    }
  }
}

TEST_CASE("a first layer with GELU and its pre-activation kept (the fast CIFAR recipe's whitening layer) takes "
          "mpx's few-channel forward with a 16-bit output on AVX-512, oneDNN's with a float32 one",
          "[backend][cpu][chooser]") {
  const DType t = GENERATE(DType::F32, DType::BF16);
  const int64_t N = env("MPX_CPU_REFERENCE") == "1" ? 2 : 8;
  Conv2dParams p;
  p.R = p.S = 2;  // valid
  const Shape xs{N, 12, 12, 3}, ws{24, 2, 2, 3}, ys{N, 11, 11, 24};
  const Activation gelu{ActKind::Gelu, 0.0f};
  cpu::ConvQuery q;
  q.pass = ConvPass::Forward, q.p = p, q.g = cpu::conv_detail::geometry(p, xs, ws), q.in = t, q.out = t;
  q.act = gelu, q.keep_pre = true, q.w_bf16 = t == DType::BF16;
  const cpu::ConvChoice c = cpu::choose_conv(q);
  INFO("chosen: " << c.name << " (" << c.why << ")");
  check_switches(c.kernel, ConvPass::Forward, q.g);
  // Where the rule gives it to mpx: bfloat16 on the AVX-512 build, no switch against it, and a
  // bfloat16 path that is not oneDNN's everywhere (MPX_CPU_16BIT=native) or per shape.
  const bool want_few = t == DType::BF16 && env("MPX_CONV_FORWARD") != "onednn" && env("MPX_CPU_REFERENCE") != "1" &&
                        env("MPX_CPU_16BIT") != "native" && cpu::kernel_isa() == cpu::KernelIsa::Avx512 &&
                        !cpu::path16(DType::BF16).per_shape;
  CHECK((c.kernel == ConvKernel::FewChannels) == want_few);
  if (c.kernel == ConvKernel::FewChannels)
    CHECK(c.name.find("gelu and the pre-activation per output row") != std::string::npos);

  Dev d;
  Rng rng(11);
  std::vector<float> xv, wv, bv;
  Tensor x = d.rand(rng, t, xs, &xv), w = d.rand(rng, t, ws, &wv), b = d.rand(rng, t, Shape{24}, &bv);
  Tensor y = d.make(t, ys), pre = d.make(t, ys);
  d.be->conv2d_forward(p, x, w, b, y, gelu, pre);
  const std::string shapes = "x [" + std::to_string(N) + ", 12, 12, 3], w [24, 2, 2, 3]";
  check_recorded(*d.be, "convolution forward", shapes, t, c.kernel == ConvKernel::Native16,
                 c.kernel == ConvKernel::FewChannels, c.kernel == ConvKernel::Reference, c.name);
  // Either kernel: pre within the dtype's rounding of the float64 sums, y = gelu(pre) loosely;
  // the sums of the products' magnitudes scale the bound.
  const ref::ConvDims rd = ref::conv_dims(p, N, 12, 12, 3, 24);
  std::vector<float> ax(xv.size()), aw(wv.size()), ab(bv.size());
  for (size_t i = 0; i < xv.size(); ++i) ax[i] = std::fabs(xv[i]);
  for (size_t i = 0; i < wv.size(); ++i) aw[i] = std::fabs(wv[i]);
  for (size_t i = 0; i < bv.size(); ++i) ab[i] = std::fabs(bv[i]);
  const ref::Vec rb = support::widen(bv), mb = support::widen(ab);
  const ref::Vec z = ref::conv2d_forward(p, rd, support::widen(xv), support::widen(wv), &rb, Activation::None);
  const ref::Vec gz = ref::conv2d_forward(p, rd, support::widen(xv), support::widen(wv), &rb, gelu);
  const ref::Vec m = ref::conv2d_forward(p, rd, support::widen(ax), support::widen(aw), &mb, Activation::None);
  const std::vector<float> got_pre = d.get(pre), got_y = d.get(y);
  const double u = t == DType::F32 ? 1e-5 : std::ldexp(1.0, -7);
  for (size_t o = 0; o < z.size(); ++o) {
    REQUIRE(std::fabs(got_pre[o] - z[o]) <= u * m[o] + 1e-6);
    REQUIRE(std::fabs(got_y[o] - gz[o]) <= 2 * u * (m[o] + 1) + 1e-6);
  }
}

TEST_CASE("the dense chooser's answer, asked without running the op, is the kernel the op runs and records",
          "[backend][cpu][chooser]") {
  const DType t = GENERATE(DType::F32, DType::BF16);
  const DensePass pass = GENERATE(DensePass::Forward, DensePass::BackwardData, DensePass::BackwardWeights);
  const int64_t N = 256;
  // The seed CIFAR net's two dense layers and the seed MNIST net's 21632 -> 10.
  const DenseLayer layers[] = {{"cifar dense 128->256", 128, 256}, {"cifar dense 256->10", 256, 10},
                               {"mnist dense 21632->10", 21632, 10}};
  for (const DenseLayer& l : layers) {
    DYNAMIC_SECTION(l.name << " " << dtype_name(t) << " pass " << static_cast<int>(pass)) {
      cpu::DenseQuery q;
      q.pass = pass, q.N = N, q.Ci = l.Ci, q.Co = l.Co, q.in = t, q.big = t;
      const cpu::DenseChoice c = cpu::choose_dense(q);
      INFO("chosen: " << c.name << " (" << c.why << ")");
      CHECK_FALSE(c.why.empty());
      CHECK(cpu::choose_dense(q).name == c.name);
      if (env("MPX_CPU_REFERENCE") == "1") CHECK(c.kernel == DenseKernel::Reference);
      if (env("MPX_CPU_16BIT") == "widen" || env("ONEDNN_MAX_CPU_ISA") == "AVX2") CHECK(c.kernel != DenseKernel::Native16);
      if (env("MPX_DENSE_FEW") == "onednn") CHECK(c.kernel != DenseKernel::FewOutputs);
      // float32 runs mpx's loops only where the input is long and the pass is not the weight
      // gradient (the seed MNIST net's forward and backward-data).
      const bool few32 = l.Ci >= 8192 && l.Co <= cpu::kDenseFewMaxOut && pass != DensePass::BackwardWeights &&
                         env("MPX_DENSE_FEW") != "onednn" && env("MPX_CPU_REFERENCE") != "1";
      if (t == DType::F32)
        CHECK(c.kernel == (few32 ? DenseKernel::FewOutputs
                                 : env("MPX_CPU_REFERENCE") == "1" ? DenseKernel::Reference : DenseKernel::OneDnn));

      Dev d;
      Rng rng(4);
      Tensor x = d.rand(rng, t, Shape{N, l.Ci}, nullptr), w = d.rand(rng, t, Shape{l.Co, l.Ci}, nullptr);
      Tensor b = d.rand(rng, t, Shape{l.Co}, nullptr), dy = d.rand(rng, t, Shape{N, l.Co}, nullptr);
      std::string op;
      if (pass == DensePass::Forward) {
        Tensor y = d.make(t, Shape{N, l.Co});
        d.be->dense_forward(x, w, b, y, Activation::None);
        op = "inner product forward";
      } else if (pass == DensePass::BackwardData) {
        Tensor dx = d.make(t, Shape{N, l.Ci});
        d.be->dense_backward_data(dy, w, dx);
        op = "inner product backward data";
      } else {
        Tensor dw = d.make(t, Shape{l.Co, l.Ci}), db = d.make(t, Shape{l.Co});
        d.be->dense_backward_weights(x, dy, dw, db);
        op = "inner product backward weights";
      }
      // oneDNN's forward and backward-data plans run on fixed chunks of rows (dense_rows.h):
      // their entries name the chunk, mpx's loops the whole batch.
      const std::vector<KernelChoice> ks = d.be->kernels();
      const std::string tail = "], w [" + std::to_string(l.Co) + ", " + std::to_string(l.Ci) + "]";
      const KernelChoice* plain = nullptr;
      const KernelChoice* n16 = nullptr;
      for (const KernelChoice& k : ks) {
        if (k.op.rfind(op + " for x [", 0) == 0 && k.op.find(tail) != std::string::npos) plain = &k;
        if (is_16bit(t) && k.op.rfind(op + " " + dtype_name(t) + " for x [", 0) == 0 &&
            k.op.find(tail) != std::string::npos)
          n16 = &k;
      }
      if (c.kernel == DenseKernel::Native16) {
        REQUIRE(n16 != nullptr);
        CHECK(n16->impl.rfind("widened", 0) != 0);
        CHECK(plain == nullptr);
      } else if (c.kernel == DenseKernel::Reference) {
        CHECK(plain == nullptr);
      } else {
        REQUIRE(plain != nullptr);
        if (c.kernel == DenseKernel::FewOutputs) {
          CHECK(plain->impl == c.name);
          CHECK(plain->op == op + " for x [" + std::to_string(N) + ", " + std::to_string(l.Ci) + tail);
        } else {
          CHECK_FALSE(mpx_kernel(plain->impl));
        }
      }
      // mpx's loops on bfloat16 dot products count as native 16-bit math
      const bool dots = c.kernel == DenseKernel::FewOutputs &&
                        (pass == DensePass::Forward        ? cpu::dense_few_dots_forward(t, t, l.Ci)
                         : pass == DensePass::BackwardData ? cpu::dense_few_dots_backward_data(t, t, t)
                                                           : cpu::dense_few_dots_backward_weights(t, t));
      check_math16(*d.be, t, c.kernel == DenseKernel::Native16 || dots);
    }
  }
}

TEST_CASE("the dense backward chooser's answer is what Backend::dense_backward runs and records",
          "[backend][cpu][chooser]") {
  // Both backward passes in one walk over x (choose_dense_backward) exactly where the rule says:
  // an x of at least 8,192 columns whose backward-data pass alone runs mpx's few-output loops, at
  // most kDenseFewFuseMaxOut outputs, float32 in the AVX-512 build or any dtype in the AVX2 build,
  // MPX_DENSE_FEW unset or auto; else each pass runs (and records) its own kernel.
  const DType t = GENERATE(DType::F32, DType::BF16);
  const int64_t N = 256;
  const DenseLayer layers[] = {{"cifar dense 128->256", 128, 256}, {"cifar dense 256->10", 256, 10},
                               {"mnist dense 21632->10", 21632, 10}, {"dense 300->12", 300, 12}};
  for (const DenseLayer& l : layers) {
    DYNAMIC_SECTION(l.name << " " << dtype_name(t)) {
      cpu::DenseQuery q;
      q.N = N, q.Ci = l.Ci, q.Co = l.Co, q.in = t, q.big = t;
      const cpu::DenseChoice c = cpu::choose_dense_backward(q);
      INFO("chosen: " << c.name << " (" << c.why << ")");
      CHECK_FALSE(c.why.empty());
      cpu::DenseQuery qd = q;
      qd.pass = DensePass::BackwardData;
      const DenseKernel kd = cpu::choose_dense(qd).kernel;
      const std::string isa = cpu::dense_few_isa();
      const bool want = l.Co <= cpu::kDenseFewFuseMaxOut && kd == DenseKernel::FewOutputs && l.Ci >= 8192 &&
                        (isa == "avx2" || (isa == "avx512" && t == DType::F32)) &&
                        (env("MPX_DENSE_FEW").empty() || env("MPX_DENSE_FEW") == "auto");

      CHECK((c.kernel == DenseKernel::FewOutputs) == want);
      if (env("MPX_DENSE_FEW") == "onednn" || env("MPX_DENSE_FEW") == "split" || env("MPX_CPU_REFERENCE") == "1")
        CHECK(c.kernel != DenseKernel::FewOutputs);

      Dev d;
      Rng rng(6);
      Tensor x = d.rand(rng, t, Shape{N, l.Ci}, nullptr), w = d.rand(rng, t, Shape{l.Co, l.Ci}, nullptr);
      Tensor dy = d.rand(rng, t, Shape{N, l.Co}, nullptr), dx = d.make(t, Shape{N, l.Ci});
      Tensor dw = d.make(t, Shape{l.Co, l.Ci}), db = d.make(t, Shape{l.Co});
      d.be->dense_backward(x, dy, w, dw, db, dx, true);
      const std::string op = "inner product backward weights and data for x [" + std::to_string(N) + ", " +
                             std::to_string(l.Ci) + "], w [" + std::to_string(l.Co) + ", " + std::to_string(l.Ci) +
                             "]";
      const KernelChoice* both = nullptr;
      bool weights_alone = false;
      const std::vector<KernelChoice> ks = d.be->kernels();
      for (const KernelChoice& k : ks) {
        if (k.op == op) both = &k;
        if (k.op.rfind("inner product backward weights for", 0) == 0 ||
            k.op.rfind("inner product backward weights " + std::string(dtype_name(t)) + " for", 0) == 0)
          weights_alone = true;
      }
      if (c.kernel == DenseKernel::FewOutputs) {
        REQUIRE(both != nullptr);
        CHECK(both->impl == c.name);
        CHECK_FALSE(weights_alone);
      } else {
        CHECK(both == nullptr);
      }
    }
  }
}
