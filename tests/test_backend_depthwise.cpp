// SPDX-License-Identifier: MIT
// Depthwise convolution on the CPU backend (oneDNN's grouped convolution and the plain
// loops of MPX_CPU_REFERENCE=1): forward with bias and activation, backward data and
// backward filter against the float64 reference of tests/support/reference.h, in every
// compute dtype and depth multiplier; the argument checks of the op table; and the op
// table itself (every op named once, in a group both backends answer for).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "support/backend_check.h"
#include "support/reference.h"

using namespace mpx;
using ref::Vec;

namespace {

using support::check_close;
using support::widen;
using Dev = support::CpuDev;

struct DwCase {
  const char* name;
  int64_t N, H, W, C, M;
  Conv2dParams p;
  bool bias;
  Activation act;
};

std::vector<DwCase> dw_cases() {
  std::vector<DwCase> cs;
  Conv2dParams same3;
  same3.R = same3.S = 3;
  same3.pad_top = same3.pad_left = same3.pad_bottom = same3.pad_right = 1;
  cs.push_back({"3x3 same, M=1, bias, relu", 2, 6, 5, 8, 1, same3, true, Activation::Relu});
  cs.push_back({"3x3 same, M=2, no bias", 2, 5, 6, 3, 2, same3, false, Activation::None});
  Conv2dParams s2;  // Keras "same" with stride 2: more padding at the bottom/right
  s2.R = s2.S = 3;
  s2.stride_h = s2.stride_w = 2;
  s2.pad_bottom = s2.pad_right = 1;
  cs.push_back({"3x3 stride 2 asymmetric pad, M=3, bias, gelu", 2, 7, 8, 4, 3, s2, true, Activation{ActKind::Gelu}});
  Conv2dParams v5;
  v5.R = 5, v5.S = 2;
  cs.push_back({"5x2 valid, M=1, 16 channels", 1, 7, 6, 16, 1, v5, true, Activation::None});
  return cs;
}

void run_case(const DwCase& cc, DType t) {
  Dev d;
  Rng rng(23);
  const Conv2dParams& p = cc.p;
  const int64_t K = cc.C * cc.M;
  const int64_t P = p.out_h(static_cast<int>(cc.H)), Q = p.out_w(static_cast<int>(cc.W));
  std::vector<float> xv, wv, bv, dyv;
  Tensor x = d.rand(rng, t, Shape{cc.N, cc.H, cc.W, cc.C}, &xv);
  Tensor w = d.rand(rng, t, Shape{K, p.R, p.S, 1}, &wv);
  const DType bt = t == DType::BF16 ? DType::F32 : t;  // the bias in float32 or the compute dtype
  Tensor b = cc.bias ? d.rand(rng, bt, Shape{K}, &bv) : Tensor();
  Tensor y = d.make(t, Shape{cc.N, P, Q, K});
  Tensor dy = d.rand(rng, t, Shape{cc.N, P, Q, K}, &dyv);
  const ref::ConvDims rd = ref::conv_dims(p, cc.N, cc.H, cc.W, cc.C, K);
  const Vec bw = widen(bv);

  // With an activation that reads its input, the pre-activation comes back too.
  Tensor pre = cc.act.backward_reads() == ActSaved::Input ? d.make(t, Shape{cc.N, P, Q, K}) : Tensor();
  d.be->depthwise_conv2d_forward(p, x, w, b, y, cc.act, pre);
  check_close("depthwise_conv2d_forward", d.get(y),
              ref::depthwise_conv2d_forward(p, rd, widen(xv), widen(wv), cc.bias ? &bw : nullptr, cc.act), t);
  if (!pre.empty())
    check_close("depthwise_conv2d_forward pre", d.get(pre),
                ref::depthwise_conv2d_forward(p, rd, widen(xv), widen(wv), cc.bias ? &bw : nullptr, Activation::None),
                t);

  Tensor dx = d.make(t, Shape{cc.N, cc.H, cc.W, cc.C});
  d.be->depthwise_conv2d_backward_data(p, dy, w, dx);
  check_close("depthwise_conv2d_backward_data", d.get(dx),
              ref::depthwise_conv2d_backward_data(p, rd, widen(dyv), widen(wv)), t);

  for (DType gt : {DType::F32, t}) {
    Tensor dw = d.make(gt, Shape{K, p.R, p.S, 1});
    Tensor db = d.make(gt, Shape{K});
    d.be->depthwise_conv2d_backward_filter(p, x, dy, dw, cc.bias ? db : Tensor());
    Vec rdb;
    const Vec rdw = ref::depthwise_conv2d_backward_filter(p, rd, widen(xv), widen(dyv), &rdb);
    check_close("depthwise_conv2d_backward_filter dw", d.get(dw), rdw, gt);
    if (cc.bias) check_close("depthwise_conv2d_backward_filter db", d.get(db), rdb, gt);
  }
}

}  // namespace

TEST_CASE("backend depthwise conv2d forward / backward data / backward filter match the float64 reference") {
  auto t = GENERATE(DType::F32, DType::F16, DType::BF16);
  for (const DwCase& cc : dw_cases()) {
    DYNAMIC_SECTION(cc.name << " " << dtype_name(t)) { run_case(cc, t); }
  }
}

TEST_CASE("backend depthwise conv2d: the plain loops (MPX_CPU_REFERENCE=1) match the float64 reference") {
  // reference_loops() reads the switch once per process: this test runs in its own
  // process (CTest runs every test file alone) when it is the first to create a plan.
  if (const char* v = std::getenv("MPX_CPU_REFERENCE"); !v || std::string(v) != "1") {
    WARN("run with MPX_CPU_REFERENCE=1 (ctest: test_backend_depthwise_reference) to test the loops");
    return;
  }
  for (const DwCase& cc : dw_cases()) {
    DYNAMIC_SECTION(cc.name) { run_case(cc, DType::F32); }
  }
}

TEST_CASE("backend depthwise conv2d: an empty batch gives zero weight gradients") {
  Dev d;
  Conv2dParams p;
  p.R = p.S = 3;
  Tensor x = d.make(DType::F32, Shape{0, 5, 5, 2});
  Tensor dy = d.make(DType::F32, Shape{0, 3, 3, 4});
  Tensor dw = d.make(DType::F32, Shape{4, 3, 3, 1});
  Tensor db = d.make(DType::F32, Shape{4});
  d.be->depthwise_conv2d_backward_filter(p, x, dy, dw, db);
  for (float v : d.get(dw)) REQUIRE(v == 0.0f);
  for (float v : d.get(db)) REQUIRE(v == 0.0f);
}

TEST_CASE("backend depthwise conv2d: shape errors name the op, the tensor and what it expected") {
  Dev d;
  Conv2dParams p;
  p.R = p.S = 3;
  Tensor x = d.make(DType::F32, Shape{2, 5, 5, 3});
  Tensor y = d.make(DType::F32, Shape{2, 3, 3, 6});
  // A conv2d kernel [K, R, S, C] is not a depthwise one.
  Tensor w_conv = d.make(DType::F32, Shape{6, 3, 3, 3});
  REQUIRE_THROWS_WITH(d.be->depthwise_conv2d_forward(p, x, w_conv, Tensor(), y, Activation::None),
                      Catch::Contains("depthwise_conv2d_forward: w float32[6, 3, 3, 3]") &&
                          Catch::Contains("must be [C*M, R, S, 1]"));
  // 7 filters for 3 channels: not a multiple.
  Tensor w7 = d.make(DType::F32, Shape{7, 3, 3, 1});
  Tensor y7 = d.make(DType::F32, Shape{2, 3, 3, 7});
  REQUIRE_THROWS_WITH(d.be->depthwise_conv2d_forward(p, x, w7, Tensor(), y7, Activation::None),
                      Catch::Contains("multiple of the 3 channels"));
  // y of the wrong size.
  Tensor w = d.make(DType::F32, Shape{6, 3, 3, 1});
  Tensor y_bad = d.make(DType::F32, Shape{2, 5, 5, 6});
  REQUIRE_THROWS_WITH(d.be->depthwise_conv2d_forward(p, x, w, Tensor(), y_bad, Activation::None),
                      Catch::Contains("y must be [2, 3, 3, 6]"));
  // A bias of the wrong length, a dw of another dtype.
  Tensor b5 = d.make(DType::F32, Shape{5});
  REQUIRE_THROWS_WITH(d.be->depthwise_conv2d_forward(p, x, w, b5, y, Activation::None),
                      Catch::Contains("bias must have 6 elements"));
  Tensor dw16 = d.make(DType::BF16, Shape{6, 3, 3, 1});
  REQUIRE_THROWS_WITH(d.be->depthwise_conv2d_backward_filter(p, x, y, dw16, Tensor()),
                      Catch::Contains("depthwise_conv2d_backward_filter: dw must be float32"));
  Tensor dx_bad = d.make(DType::F32, Shape{2, 5, 5, 4});  // 6 filters are no multiple of 4 channels
  REQUIRE_THROWS_WITH(d.be->depthwise_conv2d_backward_data(p, y, w, dx_bad),
                      Catch::Contains("depthwise_conv2d_backward_data: w float32[6, 3, 3, 1] must have a multiple of "
                                      "the 4 channels of dx"));
}

TEST_CASE("backend op table: every op once, in a group both backends answer for") {
  const std::vector<OpInfo>& ops = backend_ops();
  REQUIRE(ops.size() >= 25);
  std::set<std::string> names;
  Dev d;
  for (const OpInfo& o : ops) {
    INFO(o.name);
    REQUIRE(names.insert(o.name).second);
    REQUIRE(d.be->supports(o.group, DType::F32));
  }
  for (const char* n : {"conv2d_forward", "depthwise_conv2d_forward", "depthwise_conv2d_backward_data",
                        "depthwise_conv2d_backward_filter", "optimizer_step", "fill"})
    REQUIRE(names.count(n) == 1);
}
