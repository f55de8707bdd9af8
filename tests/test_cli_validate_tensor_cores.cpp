// SPDX-License-Identifier: MIT
// `mpx validate` on a GPU config prints the Tensor Core warnings; device
// cpu does not. Runs without a GPU: device cuda is not opened by validate, which
// then checks the shapes only (compute capability unknown).
#include <catch2/catch.hpp>

#include <string>

#include "support/cli.h"

using support::run_mpx;
using support::TempDir;
using support::write_file;

namespace {

std::string config(const std::string& device, const std::string& policy, int batch) {
  return "name: tc\n"
         "device: " + device + "\n"
         "policy: " + policy + "\n"
         "data: {dataset: synthetic, batch_size: " + std::to_string(batch) + "}\n"
         "model:\n"
         "  input_shape: [32, 32, 3]\n"
         "  layers:\n"
         "    - {type: conv2d, filters: 64, kernel: 3, padding: same, activation: relu, name: c1}\n"
         "    - {type: conv2d, filters: 60, kernel: 3, padding: same, activation: relu, name: c2}\n"
         "    - {type: global_avg_pool}\n"
         "    - {type: dense, units: 256, activation: relu, name: fc}\n"
         "    - {type: dense, units: 10, activation: softmax, dtype: float32, name: predictions}\n"
         "optimizer: {name: adam, learning_rate: 1.0e-3}\n";
}

}  // namespace

TEST_CASE("validate warns where Tensor Cores sit idle on a GPU config", "[cli][validate][tensor_cores]") {
  TempDir t;
  SECTION("device cuda") {
    write_file(t.path / "c.yaml", config("cuda", "mixed_bfloat16", 100));
    const auto r = run_mpx("validate --config c.yaml", t.path);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("tensor core warnings (cuda:0") != std::string::npos);
    CHECK(r.out.find("conv2d 'c1': 3 input channels (not a multiple of 8)") != std::string::npos);
    CHECK(r.out.find("expected for the first layer") != std::string::npos);
    CHECK(r.out.find("conv2d 'c2': 60 filters") != std::string::npos);
    CHECK(r.out.find("dense 'fc': 60 input features") != std::string::npos);
    CHECK(r.out.find("batch size 100") != std::string::npos);
    CHECK(r.out.find("config OK") != std::string::npos);
    CHECK(r.err.find("where Tensor Cores will sit idle") != std::string::npos);  // warn level
  }
  SECTION("device cuda:0 under float32: nothing to report") {
    write_file(t.path / "c.yaml", config("cuda:0", "float32", 64));
    const auto r = run_mpx("validate --config c.yaml", t.path);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("tensor core warnings (cuda:0") != std::string::npos);
    CHECK(r.out.find("): none") != std::string::npos);
  }
  SECTION("device cpu: no Tensor Core section") {
    write_file(t.path / "c.yaml", config("cpu", "mixed_bfloat16", 100));
    const auto r = run_mpx("validate --config c.yaml", t.path);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("tensor core") == std::string::npos);
    CHECK(r.err.find("Tensor Cores") == std::string::npos);
  }
}
