// SPDX-License-Identifier: MIT
// Tests of lib/core: dtypes, shapes and tensor views, the RNG.
#include <catch2/catch.hpp>

#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"

using namespace mpx;

TEST_CASE("dtype names parse back") {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) REQUIRE(parse_dtype(dtype_name(t)) == t);
  REQUIRE_FALSE(parse_dtype("float64").has_value());
  REQUIRE(dtype_size(DType::BF16) == 2);
}

TEST_CASE("tensor views slice rows and flat ranges") {
  std::vector<float> mem(2 * 3 * 4 * 5);
  Tensor t(mem.data(), DType::F32, Shape{2, 3, 4, 5});
  REQUIRE(t.numel() == 120);
  Tensor r = t.slice_rows(1, 1);
  REQUIRE(r.as<float>() == mem.data() + 60);
  REQUIRE(r.shape == Shape({1, 3, 4, 5}));
  Tensor f = t.flat_view(10, Shape{5});
  REQUIRE(f.as<float>() == mem.data() + 10);
  REQUIRE_THROWS_AS(t.flat_view(118, Shape{5}), Error);
  REQUIRE(t.str() == "float32[2, 3, 4, 5]");
}

TEST_CASE("rng is deterministic, restorable and roughly uniform") {
  Rng a(7), b(7);
  for (int i = 0; i < 10; ++i) REQUIRE(a.next_u64() == b.next_u64());
  auto s = a.state();
  const uint64_t next = a.next_u64();
  b.set_state(s);
  REQUIRE(b.next_u64() == next);
  Rng c(1);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += c.uniform();
  REQUIRE(sum / 100000 == Approx(0.5).margin(0.01));
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) seen.insert(c.uniform_int(10));
  REQUIRE(seen.size() == 10);
  REQUIRE(*seen.rbegin() == 9);
}

TEST_CASE("hash_uniform depends on seed and index and stays in [0,1)") {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const float u = hash_uniform(3, i);
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
  }
  REQUIRE(sum / 10000 == Approx(0.5).margin(0.02));
  REQUIRE(hash_uniform(3, 5) != hash_uniform(4, 5));
}
