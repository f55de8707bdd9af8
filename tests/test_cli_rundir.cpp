// SPDX-License-Identifier: MIT
// One run directory, one `mpx train`: a second run on it is refused (exit 2,
// the holder's pid named) while the first runs, and a run killed with SIGKILL
// leaves no stuck lock: --resume takes the directory over.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "support/cli.h"

using support::run_mpx;
using support::shell_quote;
using support::TempDir;
using support::write_file;

namespace {

const char* kYaml =
    "name: lock\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 64, synthetic_test: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 8, kernel: 3, activation: relu}\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 100000, checkpoint_every: 1}\n";

/// Starts `mpx train` in the background; returns its pid.
long start_train(const TempDir& t) {
  const std::string cmd = "cd " + shell_quote(t.path.string()) + " && (" + shell_quote(MPX_BINARY) +
                          " train --no-progress --config c.yaml --run-dir run > first.log 2>&1 & echo $! > pid)";
  REQUIRE(std::system(cmd.c_str()) == 0);
  for (int i = 0; i < 200 && !std::filesystem::exists(t.path / "run" / "checkpoints" / "last.ckpt"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(std::filesystem::exists(t.path / "run" / "checkpoints" / "last.ckpt"));
  return std::stol(support::read_file(t.path / "pid"));
}

void kill_and_wait(long pid, const char* sig) {
  const std::string cmd = std::string("kill -") + sig + " " + std::to_string(pid) +
                          "; while kill -0 " + std::to_string(pid) + " 2>/dev/null; do sleep 0.1; done";
  (void)std::system(cmd.c_str());
}

}  // namespace

TEST_CASE("cli run dir: a second train on a busy run directory is refused; SIGKILL leaves no stuck lock",
          "[cli][rundir]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  const long pid = start_train(t);
  const auto second = run_mpx("train --no-progress --config c.yaml --run-dir run", t.path);
  CHECK(second.code == 2);
  CHECK(second.err.find("is in use by another mpx train (pid " + std::to_string(pid) + ")") != std::string::npos);
  const auto resume = run_mpx("train --no-progress --config c.yaml --resume run", t.path);
  CHECK(resume.code == 2);
  kill_and_wait(pid, "KILL");

  // The killed run's lock is gone with it: resuming takes the directory (and is stopped in turn).
  const std::string cmd = "cd " + shell_quote(t.path.string()) + " && (" + shell_quote(MPX_BINARY) +
                          " train --no-progress --config c.yaml --resume run > second.log 2>&1 & p=$!; sleep 3; "
                          "kill -INT $p; wait $p)";
  const int status = std::system(cmd.c_str());
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(support::read_file(t.path / "second.log").find("resumed from") != std::string::npos);
}

TEST_CASE("cli run dir: outputs that cannot be written are exit 6 naming the file", "[cli][rundir]") {
  TempDir t;
  write_file(t.path / "c.yaml", std::string(kYaml) + "");
  write_file(t.path / "taken", "a file, not a folder\n");
  const auto r = run_mpx("train --no-progress --config c.yaml --set train.epochs=1 --run-dir taken", t.path);
  CHECK(r.code == 6);
  CHECK(r.err.find("taken") != std::string::npos);
  const auto e = run_mpx("export --config c.yaml --out missing/folder/w.safetensors", t.path);
  CHECK(e.code == 6);
  CHECK(e.err.find("missing/folder") != std::string::npos);
}
