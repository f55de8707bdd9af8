// SPDX-License-Identifier: MIT
// Tests of lib/core/half: float32 <-> float16 / bfloat16 conversions.
#include <catch2/catch.hpp>

#include "core/half.h"

using namespace mpx;

TEST_CASE("half known values") {
  REQUIRE(f32_to_f16(1.0f) == 0x3C00);
  REQUIRE(f32_to_f16(65504.0f) == 0x7BFF);
  REQUIRE(f32_to_f16(65520.0f) == 0x7C00);
  REQUIRE(f32_to_bf16(1.0f) == 0x3F80);
  REQUIRE(f16_to_f32(0x0001) == 5.9604645e-8f);
}

TEST_CASE("half round trips") {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (f != f) { REQUIRE((f32_to_f16(f) & 0x7FFF) > 0x7C00); continue; }
    REQUIRE(f32_to_f16(f) == h);
  }
}
