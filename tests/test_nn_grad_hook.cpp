// SPDX-License-Identifier: MIT
// Model::set_grad_ready_hook and GradBuckets of lib/dist (overlapping the gradient
// all-reduce with backward): the hook fires once per layer with trainable parameters,
// in backward order, with a range that is already final; the ranges partition the
// arena; residual blocks (with and without projection) report their nested layers;
// the buckets are contiguous, cover the arena and complete in ready order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/grad_sync.h"
#include "nn/model.h"
#include "support/gradcheck.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::download_f32;
using support::make_layer;
using support::model_config;
using support::residual_layer;

namespace {

LayerConfig named(LayerConfig l, const std::string& name) {
  l.name = name;
  return l;
}

/// conv, bn, a residual block without projection, one with a strided projection, a dense head.
std::vector<LayerConfig> resnet_like() {
  return {named(conv_layer(8, 3, 1, Padding::Same, ActivationName::Relu), "c0"),
          named(make_layer(LayerType::BatchNorm), "bn0"),
          named(residual_layer({named(conv_layer(8, 3, 1, Padding::Same, ActivationName::Relu), "r1a"),
                                named(make_layer(LayerType::BatchNorm), "r1bn"),
                                named(conv_layer(8, 3, 1, Padding::Same), "r1b")}),
                "res1"),
          named(residual_layer({named(conv_layer(16, 3, 2, Padding::Same, ActivationName::Relu), "r2a"),
                                named(conv_layer(16, 3, 1, Padding::Same), "r2b")}),
                "res2"),
          named(make_layer(LayerType::GlobalAvgPool), "gap"),
          named(dense_layer(16, ActivationName::Relu), "fc"),
          named(dense_layer(10), "out")};
}

struct Net {
  std::unique_ptr<Backend> be = create_backend("cpu");
  std::unique_ptr<Model> m;
  Buffer xb, db;
  Tensor x, dlogits;
  static constexpr int64_t n = 4;
  explicit Net(Policy p = Policy::Float32) {
    m = std::make_unique<Model>(model_config(resnet_like()), p, *be, 8, 8, 3, 10, n);
    m->init_params(7);
    std::vector<uint8_t> xv(static_cast<size_t>(n * 8 * 8 * 3));
    Rng rng(11);
    for (auto& b : xv) b = static_cast<uint8_t>(rng.uniform_int(256));
    xb = be->alloc(xv.size(), "x");
    x = xb.view(DType::U8, Shape{n, 8, 8, 3});
    be->upload(x, xv.data());
    const std::vector<float> dv = support::random_vec(static_cast<size_t>(n * 10), 12);
    db = be->alloc(dv.size() * 4, "dlogits");
    dlogits = db.view(DType::F32, Shape{n, 10});
    be->upload(dlogits, dv.data());
  }
  std::vector<float> step() {
    m->forward(x, true, 1, 1);
    m->backward(dlogits);
    return download_f32(*be, m->grads());
  }
  std::string layer_at(int64_t offset) const {
    for (const ParamInfo& p : m->params())
      if (p.trainable && p.offset == offset) return p.layer;
    return "?";
  }
};

}  // namespace

TEST_CASE("grad-ready hook: once per parameterised layer, backward order, final ranges partitioning the arena",
          "[nn][grad_hook]") {
  for (Policy p : {Policy::Float32, Policy::MixedBFloat16}) {
    INFO(policy_name(p));
    Net net(p);
    const std::vector<float> plain = net.step();  // no hook

    std::vector<GradRange> seen;
    std::vector<std::vector<float>> at_hook;
    net.m->set_grad_ready_hook([&](int64_t off, int64_t cnt) {
      seen.push_back({off, cnt});
      at_hook.push_back(download_f32(*net.be, net.m->grads().flat_view(off, Shape{cnt})));
    });
    const std::vector<float> hooked = net.step();
    CHECK(hooked == plain);  // the hook changes nothing

    // Once per layer with trainable parameters.
    std::set<std::string> with_params;
    for (const ParamInfo& q : net.m->params())
      if (q.trainable) with_params.insert(q.layer);
    REQUIRE(seen.size() == with_params.size());

    // Backward order: the head first; inside res2 the branch (last layer first), then its projection.
    std::vector<std::string> names;
    for (const GradRange& r : seen) names.push_back(net.layer_at(r.offset));
    CHECK(names == std::vector<std::string>{"out", "fc", "r2b", "r2a", "res2_projection", "r1b", "r1bn", "r1a", "bn0",
                                            "c0"});
    CHECK(seen == net.m->grad_ready_ranges());

    // The ranges partition [0, num_params) exactly.
    std::vector<GradRange> sorted = seen;
    std::sort(sorted.begin(), sorted.end(), [](const GradRange& a, const GradRange& b) { return a.offset < b.offset; });
    int64_t end = 0;
    for (const GradRange& r : sorted) {
      CHECK(r.offset == end);
      CHECK(r.count > 0);
      end = r.offset + r.count;
    }
    CHECK(end == net.m->num_params());

    // Each range was final when reported: equal to the arena after the whole backward.
    for (size_t i = 0; i < seen.size(); ++i) {
      const std::vector<float> fin(hooked.begin() + seen[i].offset, hooked.begin() + seen[i].offset + seen[i].count);
      CHECK(at_hook[i] == fin);
    }

    // A second pass reports the same ranges again; clearing the hook stops it.
    seen.clear();
    net.step();
    CHECK(seen == net.m->grad_ready_ranges());
    net.m->set_grad_ready_hook(nullptr);
    seen.clear();
    CHECK(net.step() == plain);
    CHECK(seen.empty());
  }
}

TEST_CASE("GradBuckets: contiguous buckets covering the arena, completed in ready order", "[nn][grad_hook]") {
  Net net;
  const std::vector<GradRange> order = net.m->grad_ready_ranges();
  const int64_t total = net.m->num_params();

  for (size_t min_bytes : {size_t(1), size_t(256), size_t(4096), size_t(1) << 30}) {
    INFO("min_bytes " << min_bytes);
    GradBuckets gb(order, min_bytes);
    const std::vector<GradRange>& buckets = gb.buckets();
    REQUIRE(!buckets.empty());

    // Contiguous and covering: sorted by offset they tile [0, total).
    std::vector<GradRange> sorted = buckets;
    std::sort(sorted.begin(), sorted.end(), [](const GradRange& a, const GradRange& b) { return a.offset < b.offset; });
    int64_t end = 0;
    for (const GradRange& b : sorted) {
      CHECK(b.offset == end);
      end = b.offset + b.count;
    }
    CHECK(end == total);

    // Each bucket is a run of consecutive ready ranges; all but those closed early (the
    // next range not adjacent) and the last hold at least min_bytes.
    size_t k = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      int64_t lo = buckets[b].offset, hi = lo + buckets[b].count, covered = 0;
      while (k < order.size() && covered < buckets[b].count) {
        CHECK(order[k].offset >= lo);
        CHECK(order[k].offset + order[k].count <= hi);
        covered += order[k].count;
        ++k;
      }
      CHECK(covered == buckets[b].count);
      const bool small = static_cast<size_t>(buckets[b].count) * 4 < min_bytes;
      if (small && b + 1 < buckets.size()) {
        const GradRange& nx = order[k];  // the range that could not join
        CHECK(nx.offset + nx.count != lo);
        CHECK(nx.offset != hi);
      }
    }
    CHECK(k == order.size());
    if (min_bytes == 1) CHECK(buckets.size() == order.size());
    // The projection of res2 comes after its branch but sits above it in the arena, next to the
    // layers after the block: one unbounded bucket cannot hold everything.
    if (min_bytes == (size_t(1) << 30)) CHECK(buckets.size() == 2);

    // Through the hook over two passes: every bucket fires once per pass, in index order, after
    // all of its ranges were written.
    std::vector<int> fired;
    std::vector<float> snapshot;
    bool final_when_fired = true;
    std::vector<float> reference = net.step();
    net.m->set_grad_ready_hook(gb.hook([&](int index, const GradRange& r) {
      fired.push_back(index);
      const std::vector<float> now = download_f32(*net.be, net.m->grads().flat_view(r.offset, Shape{r.count}));
      final_when_fired = final_when_fired &&
                         std::equal(now.begin(), now.end(), reference.begin() + r.offset);
    }));
    net.step();
    net.step();
    net.m->set_grad_ready_hook(nullptr);
    std::vector<int> want;
    for (int pass = 0; pass < 2; ++pass)
      for (size_t b = 0; b < buckets.size(); ++b) want.push_back(static_cast<int>(b));
    CHECK(fired == want);
    CHECK(final_when_fired);
  }
}

TEST_CASE("GradBuckets rejects a range it did not expect", "[nn][grad_hook]") {
  GradBuckets gb({{10, 5}, {0, 10}}, 1 << 20);
  REQUIRE(gb.buckets().size() == 1);
  CHECK(gb.buckets()[0] == GradRange{0, 15});
  CHECK(gb.on_ready(10, 5) == -1);
  CHECK_THROWS_AS(gb.on_ready(3, 7), Error);
  gb.reset();
  CHECK(gb.on_ready(10, 5) == -1);
  CHECK(gb.on_ready(0, 10) == 0);
  CHECK(gb.on_ready(10, 5) == -1);  // the next pass starts over
}
