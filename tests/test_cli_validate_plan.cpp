// SPDX-License-Identifier: MIT
// `mpx validate` plans memory without allocating it (README, "Commands": exit 0
// or 2): a plan larger than the machine is exit 2 with the figure, never an
// out-of-memory exit 5; a convolution kernel larger than its input is a warning.
#include <catch2/catch.hpp>

#include <string>

#include "support/cli.h"

using support::run_mpx;
using support::TempDir;
using support::write_file;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("validate plan: a plan larger than the machine is exit 2 with the figure", "[cli][validate]") {
  TempDir t("mpx_validate_plan");
  // 46341 x 46341 x 3 per image, batch 256: terabytes of activations, and a dense layer of
  // 64 G weights. Allocating it was exit 5; planning it is arithmetic.
  write_file(t.path / "huge.yaml",
             "name: huge\n"
             "device: cpu\n"
             "data: {dataset: synthetic, batch_size: 256}\n"
             "model:\n"
             "  input_shape: [46341, 46341, 3]\n"
             "  layers:\n"
             "    - {type: flatten}\n"
             "    - {type: dense, units: 10, activation: softmax}\n");
  const support::Run r = run_mpx("validate --config huge.yaml", t.path);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "huge.yaml: the memory plan for batch 256 needs "));
  CHECK(contains(r.err, "more than this machine's"));
  CHECK(contains(r.out, "memory for batch 256"));  // the plan itself is printed
  CHECK_FALSE(contains(r.out, "config OK"));
  CHECK_FALSE(contains(r.err, "out of"));
}

TEST_CASE("validate plan: a kernel larger than its input is a warning", "[cli][validate]") {
  TempDir t("mpx_validate_kernel");
  write_file(t.path / "k.yaml",
             "name: k\n"
             "device: cpu\n"
             "data: {dataset: synthetic, batch_size: 4}\n"
             "model:\n"
             "  input_shape: [6, 6, 1]\n"
             "  layers:\n"
             "    - {type: conv2d, filters: 4, kernel: 9, padding: same, activation: relu}\n"
             "    - {type: flatten}\n"
             "    - {type: dense, units: 10, activation: softmax}\n");
  support::Run r = run_mpx("validate --config k.yaml", t.path);
  CHECK(r.code == 0);
  CHECK(contains(r.err, "warning: "));
  CHECK(contains(r.err, "the 9x9 kernel is larger than its 6x6 input"));
  CHECK(contains(r.err, "a kernel of at most 6x6"));
  // A kernel that fits: no such warning.
  r = run_mpx("validate --config k.yaml --set model.layers[0].kernel=3", t.path);
  CHECK(r.code == 0);
  CHECK_FALSE(contains(r.err, "is larger than its"));
}
