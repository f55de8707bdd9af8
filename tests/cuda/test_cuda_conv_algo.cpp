// SPDX-License-Identifier: MIT
// How the CUDA backend chooses and reports its library plans (docs/gpu.md): the
// probe behind supports_conv2d (16-bit convolutions with 1 or 3 channels run, padded;
// a first layer needs no backward-data algorithm), the same algorithm in every backend
// of a process (process-wide cache), bit-identical results from two backends where the
// algorithm is deterministic, deterministic algorithms under cuda.deterministic, the
// plans in Backend::plans(), and the library versions read at run time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/versions.h"
#include "config/config.h"
#include "core/error.h"
#include "cuda/cuda_compare.h"
#include "nn/model.h"

using namespace cudatest;

namespace {

Conv2dParams same3x3() {
  Conv2dParams p;
  p.R = p.S = 3;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  return p;
}

/// Forward, backward data and backward filter of one convolution on `b`; the three outputs' bytes.
std::vector<std::vector<uint8_t>> run_conv(Backend& b, DType t, const std::vector<float>& xv,
                                           const std::vector<float>& wv, const std::vector<float>& dyv) {
  const Conv2dParams p = same3x3();
  const Shape xs{8, 16, 16, 3}, ws{16, 3, 3, 3}, ys{8, 16, 16, 16};
  auto up = [&](const Shape& s, const std::vector<float>& v, Buffer& buf) {
    std::vector<uint8_t> bytes(static_cast<size_t>(s.numel()) * dtype_size(t));
    convert(v.data(), DType::F32, bytes.data(), t, v.size());
    buf = b.alloc(bytes.size(), "test");
    Tensor tt = buf.view(t, s);
    b.upload(tt, bytes.data());
    return tt;
  };
  Buffer bx, bw, bdy, by, bdx, bdw;
  const Tensor x = up(xs, xv, bx), w = up(ws, wv, bw), dy = up(ys, dyv, bdy);
  by = b.alloc(static_cast<size_t>(ys.numel()) * dtype_size(t), "y");
  bdx = b.alloc(static_cast<size_t>(xs.numel()) * dtype_size(t), "dx");
  bdw = b.alloc(static_cast<size_t>(ws.numel()) * 4, "dw");
  const Tensor y = by.view(t, ys), dx = bdx.view(t, xs), dw = bdw.view(DType::F32, ws);
  b.conv2d_forward(p, x, w, Tensor(), y, Activation::None);
  b.conv2d_backward_data(p, dy, w, dx);
  b.conv2d_backward_filter(p, x, dy, dw, Tensor());
  auto bytes = [&](const Tensor& tt) {
    std::vector<uint8_t> out(tt.bytes());
    b.download(out.data(), tt);
    return out;
  };
  return {bytes(y), bytes(dx), bytes(dw)};
}

/// ||a - b|| / ||a|| of two downloads of a tensor of dtype t.
double relative_error(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType t) {
  const size_t n = a.size() / dtype_size(t);
  std::vector<float> fa(n), fb(n);
  convert(a.data(), t, fa.data(), DType::F32, n);
  convert(b.data(), t, fb.data(), DType::F32, n);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(fa[i]) - fb[i];
    num += e * e;
    den += static_cast<double>(fa[i]) * fa[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

}  // namespace

TEST_CASE("cuda: supports_conv2d probes cuDNN once per shape; 16-bit C=1 and C=3 run (padded to 8)",
          "[cuda][conv][probe]") {
  Backend& g = *be().gpu;
  for (DType t : float_dtypes()) {
    for (int64_t C : {1, 3, 8}) {
      const Support s = g.supports_conv2d(same3x3(), Shape{32, 28, 28, C}, Shape{32, 3, 3, C}, t);
      INFO(dtype_name(t) << " C=" << C << ": " << s.reason << s.input_grad_reason);
      CHECK(s.ok == g.supports(Op::Conv2d, t));
      if (!s.ok) CHECK(s.reason.find("compute capability") != std::string::npos);
      // Backward data is reported on its own (a first layer never runs it), with its reason.
      CHECK(s.input_grad == s.input_grad_reason.empty());
      if (!s.input_grad) CHECK(s.input_grad_reason.find("backward data") != std::string::npos);
    }
  }
}

TEST_CASE("cuda: two backends of one process choose the same algorithms and agree bit for bit",
          "[cuda][conv][algo]") {
  Rng rng(71);
  const std::vector<float> xv = random_floats(rng, 8 * 16 * 16 * 3), wv = random_floats(rng, 16 * 3 * 3 * 3),
                           dyv = random_floats(rng, 8 * 16 * 16 * 16);
  for (bool search : {false, true})
    for (DType t : float_dtypes()) {
      BackendOptions o;
      o.cuda_conv_search = search;
      auto a = create_backend("cuda", o);
      if (!a->supports(Op::Conv2d, t)) continue;
      const auto ra = run_conv(*a, t, xv, wv, dyv);
      auto b = create_backend("cuda", o);
      const auto rb = run_conv(*b, t, xv, wv, dyv);
      INFO((search ? "search " : "heuristic ") << dtype_name(t));
      const std::vector<PlanReport> pa = a->plans(), pb = b->plans();
      // Same algorithm, same bits, where cuDNN marks it deterministic; a non-deterministic one
      // (e.g. backward data algorithm 0, backward filter 0 and 3, which add partial sums with
      // atomics) may order its sums differently in every call, so those outputs are compared
      // within the convolution tolerance instead (docs/gpu.md, "What the CUDA tests compare").
      const char* ops[3] = {"convolution forward", "convolution backward data", "convolution backward filter"};
      for (int k = 0; k < 3; ++k) {
        bool deterministic = false, found = false;
        for (const PlanReport& r : pa)
          if (r.op.rfind(ops[k], 0) == 0) {
            found = true;
            deterministic = r.algo.find("(deterministic)") != std::string::npos;
          }
        INFO(ops[k] << (deterministic ? " (deterministic)" : " (non-deterministic)"));
        CHECK(found);
        if (deterministic) {
          CHECK(ra[k] == rb[k]);
        } else {
          const DType ot = k == 2 ? DType::F32 : t;
          CHECK(relative_error(ra[k], rb[k], ot) <= tolerance(t, true));
        }
      }
      REQUIRE(pa.size() == pb.size());
      REQUIRE(pa.size() >= 3);
      for (size_t i = 0; i < pa.size(); ++i) {
        CHECK(pa[i].op == pb[i].op);
        CHECK(pa[i].algo == pb[i].algo);
        CHECK(pa[i].math == pb[i].math);
        CHECK(pa[i].workspace_bytes == pb[i].workspace_bytes);
        CHECK(pa[i].algo.find(search ? "measured" : "heuristic") != std::string::npos);
        if (t == DType::F32) CHECK(pa[i].math == "CUDNN_FMA_MATH");  // never TF32
      }
    }
}

TEST_CASE("cuda: cuda.deterministic keeps deterministic algorithms only; reruns are bit-identical",
          "[cuda][conv][algo]") {
  Rng rng(72);
  const std::vector<float> xv = random_floats(rng, 8 * 16 * 16 * 3), wv = random_floats(rng, 16 * 3 * 3 * 3),
                           dyv = random_floats(rng, 8 * 16 * 16 * 16);
  BackendOptions o;
  o.cuda_deterministic = true;
  auto a = create_backend("cuda", o);
  const auto r1 = run_conv(*a, DType::F16, xv, wv, dyv);
  const auto r2 = run_conv(*a, DType::F16, xv, wv, dyv);
  CHECK(r1 == r2);
  int cudnn_plans = 0;
  for (const PlanReport& p : a->plans()) {
    if (p.library != "cudnn") continue;
    ++cudnn_plans;
    INFO(p.op << ": " << p.algo);
    CHECK(p.algo.find("(deterministic)") != std::string::npos);
  }
  CHECK(cudnn_plans >= 3);
}

TEST_CASE("cuda: dense plans are reported with their cuBLASLt algorithm", "[cuda][dense][algo]") {
  Rng rng(73);
  auto b = create_backend("cuda");
  Buffer bx = b->alloc(64 * 32 * 4, "x"), bw = b->alloc(16 * 32 * 4, "w"), by = b->alloc(64 * 16 * 4, "y");
  const std::vector<float> xv = random_floats(rng, 64 * 32), wv = random_floats(rng, 16 * 32);
  const Tensor x = bx.view(DType::F32, Shape{64, 32}), w = bw.view(DType::F32, Shape{16, 32}),
               y = by.view(DType::F32, Shape{64, 16});
  b->upload(x, xv.data());
  b->upload(w, wv.data());
  b->dense_forward(x, w, Tensor(), y, Activation::None);
  const std::vector<PlanReport> plans = b->plans();
  REQUIRE(plans.size() == 1);
  CHECK(plans[0].library == "cublaslt");
  CHECK(plans[0].op.find("m=16, n=64, k=32") != std::string::npos);
  CHECK(plans[0].algo.rfind("id ", 0) == 0);
}

TEST_CASE("cuda: library versions are read from the loaded libraries", "[cuda][versions]") {
  const CudaLibraryVersions v = cuda_library_versions();
  INFO(describe_versions(v));
  CHECK(v.driver > 0);
  CHECK(v.runtime > 0);
  CHECK(v.cudnn >= 90000);
  CHECK(v.cublaslt > 0);
  CHECK(v.cudnn_built >= 90000);
}

TEST_CASE("cuda: a 16-bit model on 3-channel images is built after the probe, or refused at start with the reason",
          "[cuda][conv][probe][nn]") {
  Config cfg;
  LayerConfig conv;
  conv.type = LayerType::Conv2d;
  conv.filters = 16;
  conv.padding = Padding::Same;
  LayerConfig flat;
  flat.type = LayerType::Flatten;
  LayerConfig out;
  out.type = LayerType::Dense;
  out.units = 10;
  cfg.model.layers = {conv, flat, out};
  for (Policy policy : {Policy::MixedFloat16, Policy::MixedBFloat16}) {
    const DType t = policy == Policy::MixedFloat16 ? DType::F16 : DType::BF16;
    INFO(policy_name(policy));
    const int n = 8;
    if (!be().gpu->supports(Op::Conv2d, t)) {
      try {
        Model m(cfg, policy, *be().gpu, 8, 8, 3, 10, n);
        FAIL("the model was built on a GPU without " << dtype_name(t) << " convolutions");
      } catch (const ConfigError& e) {
        CHECK(std::string(e.what()).find("cannot run this convolution") != std::string::npos);
      }
      continue;
    }
    Model mc(cfg, policy, *be().cpu, 8, 8, 3, 10, n), mg(cfg, policy, *be().gpu, 8, 8, 3, 10, n);
    mc.init_params(5);
    mg.init_params(5);
    Rng rng(74);
    Dual x = random_dual(rng, DType::F32, Shape{n, 8, 8, 3}, -2.0f, 2.0f);
    Dual logits = alloc_dual(DType::F32, Shape{n, 10});
    be().cpu->copy(logits.c, mc.forward_float(x.c, true, 1, 1));
    be().gpu->copy(logits.g, mg.forward_float(x.g, true, 1, 1));
    expect_close(logits, 2e-2, "logits through a channel-padded first layer");
    // The kernel's gradient has the layer's own [16, 3, 3, 3] shape: the padding is cropped away.
    Dual proj = random_dual(rng, DType::F32, Shape{n, 10});
    mc.backward(proj.c);
    mg.backward(proj.g);
    Dual grads = alloc_dual(DType::F32, Shape{mc.num_params()});
    be().cpu->copy(grads.c, mc.grads());
    be().gpu->copy(grads.g, mg.grads());
    expect_close(grads, 3e-2, "gradients through a channel-padded first layer");
  }
}
