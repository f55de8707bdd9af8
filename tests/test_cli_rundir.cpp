// SPDX-License-Identifier: MIT
// One run directory, one `mpx train`: a second run on it is refused (exit 2,
// the holder's pid named) while the first runs, and a run killed with SIGKILL
// leaves no stuck lock: --resume takes the directory over. The run-directory
// rule (README, "The run directory"): a foreign folder is refused and never
// cleared, a previous run only with --resume or --overwrite.
#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

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

namespace {

/// A two-step training that ends at once (synthetic data).
const char* kQuick =
    "name: quick\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 16, synthetic_test: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 1}\n";

std::vector<std::string> event_files(const std::filesystem::path& run) {
  std::vector<std::string> files;
  for (const char* sub : {"train", "validation"}) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(run / "tensorboard" / sub, ec), end; !ec && it != end;
         it.increment(ec))
      files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("cli run dir: a folder that is not an mpx run directory is refused and left untouched",
          "[cli][rundir]") {
  TempDir t;
  write_file(t.path / "c.yaml", kQuick);
  std::filesystem::create_directories(t.path / "mine");
  write_file(t.path / "mine" / "notes.txt", "someone's notes\n");
  for (const char* extra : {"", " --overwrite"}) {
    const auto r = run_mpx(std::string("train --no-progress --config c.yaml --run-dir mine") + extra, t.path);
    CHECK(r.code == 2);
    CHECK(r.err.find("the run directory 'mine' is not empty and is not an mpx run directory (it holds "
                     "'notes.txt')") != std::string::npos);
    CHECK(r.err.find("give a new or empty --run-dir") != std::string::npos);
  }
  // Nothing was written there, nothing removed.
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(t.path / "mine")) left.push_back(e.path().filename());
  CHECK(left == std::vector<std::string>{"notes.txt"});
  CHECK(support::read_file(t.path / "mine" / "notes.txt") == "someone's notes\n");

  // A lone config.yaml (a user's folder with a config in it) is not a run either.
  std::filesystem::create_directories(t.path / "cfgdir");
  write_file(t.path / "cfgdir" / "config.yaml", kQuick);
  const auto c = run_mpx("train --no-progress --config c.yaml --run-dir cfgdir", t.path);
  CHECK(c.code == 2);
  CHECK(c.err.find("(it holds 'config.yaml')") != std::string::npos);

  // What a run killed while it made the folder leaves (its lock, an empty checkpoints folder, the
  // marker's temporary file) counts as empty: used, with --overwrite too, the temporary file
  // removed. Another name of that shape is someone else's.
  for (const char* extra : {"", " --overwrite"}) {
    const std::string name = std::string("killed") + (*extra ? "2" : "1");
    std::filesystem::create_directories(t.path / name / "checkpoints");
    write_file(t.path / name / ".lock", "");
    write_file(t.path / name / "..mpx-run.tmp.4242", "an mpx run dir");
    const auto k = run_mpx("train --no-progress --config c.yaml --run-dir " + name + extra, t.path);
    INFO(k.err);
    CHECK(k.code == 0);
    CHECK(std::filesystem::exists(t.path / name / ".mpx-run"));
    CHECK_FALSE(std::filesystem::exists(t.path / name / "..mpx-run.tmp.4242"));
    CHECK(std::filesystem::exists(t.path / name / "summary.json"));
  }
  std::filesystem::create_directories(t.path / "othertmp");
  write_file(t.path / "othertmp" / "..mpx-run.tmp.x1", "not ours");
  const auto o = run_mpx("train --no-progress --config c.yaml --run-dir othertmp", t.path);
  CHECK(o.code == 2);
  CHECK(o.err.find("(it holds '..mpx-run.tmp.x1')") != std::string::npos);
  CHECK(std::filesystem::exists(t.path / "othertmp" / "..mpx-run.tmp.x1"));

  // An empty folder is used.
  std::filesystem::create_directories(t.path / "empty");
  const auto e = run_mpx("train --no-progress --config c.yaml --run-dir empty", t.path);
  CHECK(e.code == 0);
  CHECK(std::filesystem::exists(t.path / "empty" / ".mpx-run"));
  CHECK(std::filesystem::exists(t.path / "empty" / "summary.json"));
}

TEST_CASE("cli run dir: a finished run is refused without --resume or --overwrite; --overwrite clears it",
          "[cli][rundir]") {
  TempDir t;
  write_file(t.path / "c.yaml", kQuick);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir run", t.path).code == 0);
  const auto old_events = event_files(t.path / "run");
  REQUIRE(old_events.size() == 2);
  const std::string old_summary = support::read_file(t.path / "run" / "summary.json");
  write_file(t.path / "run" / "notes.txt", "kept\n");

  const auto again = run_mpx("train --no-progress --config c.yaml --run-dir run", t.path);
  CHECK(again.code == 2);
  CHECK(again.err.find("the run directory 'run' already holds a completed run: continue it with "
                       "--resume run, replace it with --overwrite") != std::string::npos);
  CHECK(support::read_file(t.path / "run" / "summary.json") == old_summary);
  CHECK(event_files(t.path / "run") == old_events);

  // An older run directory (before the marker existed) is recognised by its files.
  std::filesystem::remove(t.path / "run" / ".mpx-run");
  CHECK(run_mpx("train --no-progress --config c.yaml --run-dir run", t.path).code == 2);

  const auto both = run_mpx("train --no-progress --config c.yaml --run-dir run --overwrite --resume run", t.path);
  CHECK(both.code == 2);

  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // event file names carry the second
  const auto over = run_mpx("train --no-progress --config c.yaml --run-dir run --overwrite", t.path);
  REQUIRE(over.code == 0);
  const auto new_events = event_files(t.path / "run");
  CHECK(new_events.size() == 2);  // one per folder: the old ones are gone
  for (const auto& f : old_events) CHECK(!std::filesystem::exists(f));
  CHECK(support::read_file(t.path / "run" / "notes.txt") == "kept\n");  // not mpx's: kept
  // metrics.jsonl holds this run only: one epoch record.
  const std::string metrics = support::read_file(t.path / "run" / "metrics.jsonl");
  size_t epochs = 0;
  for (size_t at = metrics.find("\"kind\":\"epoch\""); at != std::string::npos;
       at = metrics.find("\"kind\":\"epoch\"", at + 1))
    ++epochs;
  CHECK(epochs == 1);
}

TEST_CASE("cli run dir: an unfinished run is refused too; --run-dir / is refused", "[cli][rundir]") {
  TempDir t;
  write_file(t.path / "c.yaml", kQuick);
  REQUIRE(run_mpx("train --no-progress --config c.yaml --run-dir run", t.path).code == 0);
  std::filesystem::remove(t.path / "run" / "summary.json");
  const auto r = run_mpx("train --no-progress --config c.yaml --run-dir run", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("already holds an unfinished run (no summary.json)") != std::string::npos);
  const auto root = run_mpx("train --no-progress --config c.yaml --run-dir / --overwrite", t.path);
  CHECK(root.code == 2);
  CHECK(root.err.find("the run directory '/' is not empty and is not an mpx run directory") != std::string::npos);
  CHECK(!std::filesystem::exists("/.mpx-run"));
  CHECK(!std::filesystem::exists("/summary.json"));
}
