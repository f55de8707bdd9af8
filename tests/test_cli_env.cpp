// SPDX-License-Identifier: MIT
// Environment switches through the binary: a bad value is exit 2 naming the
// variable (docs/environment.md), for a switch read at start and one read deep
// inside the CPU backend.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "support/cli.h"

using support::run_mpx;
using support::TempDir;
using support::write_file;

namespace {

const char* kYaml =
    "name: env\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, train_limit: 16, test_limit: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 1}\n";

}  // namespace

TEST_CASE("cli env: a bad switch value is exit 2 naming the variable", "[cli][env]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  for (const std::string var : {"MPX_CPU_PROFILE", "MPX_CPU_REFERENCE", "MPX_DEBUG_INJECT_INF"}) {
    ::setenv(var.c_str(), "maybe", 1);
    const auto r = run_mpx("train --no-progress --config c.yaml --run-dir run_" + var, t.path);
    ::unsetenv(var.c_str());
    CHECK(r.code == 2);
    CHECK(r.err.find(var + "='maybe'") != std::string::npos);
  }
  // A good value trains.
  ::setenv("MPX_CPU_PROFILE", "off", 1);
  const auto ok = run_mpx("train --no-progress --config c.yaml --run-dir ok", t.path);
  ::unsetenv("MPX_CPU_PROFILE");
  CHECK(ok.code == 0);
}

TEST_CASE("cli bench: huge --steps is exit 2, SIGTERM stops it with 130", "[cli][bench]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  const auto big = run_mpx("bench --config c.yaml --steps 9223372036854775807", t.path);
  CHECK(big.code == 2);
  CHECK(big.err.find("--steps must be in [1, 1000000000]") != std::string::npos);
  const auto warm = run_mpx("bench --config c.yaml --steps 1 --warmup 9223372036854775807", t.path);
  CHECK(warm.code == 2);
  // A long benchmark, stopped by SIGTERM after a moment.
  const std::string cmd = "cd " + support::shell_quote(t.path.string()) + " && (" +
                          support::shell_quote(MPX_BINARY) +
                          " bench --config c.yaml --steps 100000000 2> bench.err & pid=$!; sleep 2; kill -TERM $pid; "
                          "wait $pid)";
  const int status = std::system(cmd.c_str());
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(support::read_file(t.path / "bench.err").find("bench: interrupted after") != std::string::npos);
}
