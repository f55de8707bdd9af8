// SPDX-License-Identifier: MIT
// `mpx sweep` through the binary: one run directory per point named by its
// values, the table at the end, completed points skipped on a rerun, a sweep
// killed mid-way continued to the same table as an uninterrupted one, the
// worst exit code of the points, -j with the threads split, a sweep file with
// seeded random samples, and points that would share a folder refused.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "support/cli.h"

namespace fs = std::filesystem;
using nlohmann::json;
using support::read_file;
using support::run_mpx;
using support::shell_quote;
using support::TempDir;
using support::write_file;

namespace {

const char* kYaml =
    "name: sw\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 96, synthetic_test: 16}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 16, activation: relu}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 2, log_every: 4}\n";

const char* kGrid = "--grid optimizer.learning_rate=0.001,0.01 --grid data.batch_size=8,16";

/// run name -> (status, final test accuracy, final train loss) from a --format json table
/// (null where a run has no value).
std::map<std::string, std::tuple<std::string, json, json>> table_of(const std::string& out) {
  std::map<std::string, std::tuple<std::string, json, json>> t;
  for (const json& row : json::parse(out))
    t[row["run"].get<std::string>()] = {row["status"].get<std::string>(), row["final_test_accuracy"],
                                        row["final_train_loss"]};
  return t;
}

const std::vector<std::string> kNames = {"learning_rate=0.001,batch_size=8", "learning_rate=0.001,batch_size=16",
                                         "learning_rate=0.01,batch_size=8", "learning_rate=0.01,batch_size=16"};

}  // namespace

TEST_CASE("cli sweep: a grid trains every point in its own folder; a rerun skips them; a killed sweep "
          "continues to the same table",
          "[cli][sweep]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  const auto first = run_mpx(std::string("sweep --config c.yaml ") + kGrid + " --dir sw --format json", t.path);
  REQUIRE(first.code == 0);
  const auto table = table_of(first.out);
  REQUIRE(table.size() == 4);
  for (const auto& name : kNames) {
    INFO(name);
    REQUIRE(table.count(name) == 1);
    CHECK(std::get<0>(table.at(name)) == "completed");
    CHECK(fs::exists(t.path / "sw" / name / "summary.json"));
    // Each point trained its own values.
    const std::string cfg = read_file(t.path / "sw" / name / "config.yaml");
    CHECK(cfg.find(name.find("0.001") != std::string::npos ? "learning_rate: 0.001" : "learning_rate: 0.01") !=
          std::string::npos);
  }
  CHECK(first.err.find("sweep: 4 points in sw, 4 to train, 1 at a time") != std::string::npos);
  CHECK(first.err.find("sweep: 4 of 4 points completed") != std::string::npos);

  // Again: nothing to train, the same table.
  const auto again = run_mpx(std::string("sweep --config c.yaml ") + kGrid + " --dir sw --format json", t.path);
  CHECK(again.code == 0);
  CHECK(again.err.find("4 points in sw, 0 to train") != std::string::npos);
  CHECK(again.err.find("[1/4] learning_rate=0.001,batch_size=8: already completed, skipped") != std::string::npos);
  CHECK(table_of(again.out) == table);

  // Killed after its first point (the sweep and its training): the rerun skips the first point,
  // finishes the rest (resumed or started over) and ends with the uninterrupted table.
  const std::string cmd = "cd " + shell_quote(t.path.string()) + " && (" + shell_quote(MPX_BINARY) +
                          " sweep --config c.yaml " + kGrid + " --dir cut > cut.out 2> cut.err & echo $! > pid)";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long pid = std::stol(read_file(t.path / "pid"));
  for (int i = 0; i < 600 && !fs::exists(t.path / "cut" / kNames[0] / "summary.json"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(fs::exists(t.path / "cut" / kNames[0] / "summary.json"));
  const std::string kill = "kill -KILL " + std::to_string(pid) + "; pkill -KILL -P " + std::to_string(pid) +
                           "; sleep 0.5";
  (void)std::system(kill.c_str());  // the sweep, then its trainings (each in its own process group)
  ::waitpid(static_cast<pid_t>(pid), nullptr, WNOHANG);
  const auto rest = run_mpx(std::string("sweep --config c.yaml ") + kGrid + " --dir cut --format json", t.path);
  CHECK(rest.code == 0);
  CHECK(rest.err.find("[1/4] learning_rate=0.001,batch_size=8: already completed, skipped") != std::string::npos);
  CHECK(rest.err.find(", 0 to train") == std::string::npos);  // the kill came before the last point ended
  CHECK(table_of(rest.out) == table);
}

TEST_CASE("cli sweep: the exit code is the worst point's; -j splits the threads; points never share a folder",
          "[cli][sweep]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  // lr 1e4 diverges (exit 4): the sweep finishes the other point and exits 4.
  const auto r = run_mpx("sweep --config c.yaml --grid optimizer.learning_rate=0.001,1e4 --dir d -j 2 --format json",
                         t.path);
  CHECK(r.code == 4);
  const unsigned each = std::max(1u, std::thread::hardware_concurrency() / 2);
  CHECK(r.err.find(fmt::format("2 to train, 2 at a time with {} thread{} each", each, each == 1 ? "" : "s")) !=
        std::string::npos);
  const auto tab = table_of(r.out);
  REQUIRE(tab.size() == 2);
  CHECK(std::get<0>(tab.at("learning_rate=0.001")) == "completed");
  CHECK(std::get<0>(tab.at("learning_rate=1e4")) == "diverged");
  CHECK(r.err.find("1 of 2 points completed; exit code 4") != std::string::npos);
  // A diverged point is done too: a rerun keeps it (and its exit code).
  const auto again = run_mpx("sweep --config c.yaml --grid optimizer.learning_rate=0.001,1e4 --dir d", t.path);
  CHECK(again.code == 4);
  CHECK(again.err.find("learning_rate=1e4: already diverged, skipped") != std::string::npos);
  CHECK(again.out.find("learning_rate=1e4") != std::string::npos);  // the text table
  // The table's options are mpx report's.
  const auto sorted = run_mpx("sweep --config c.yaml --grid optimizer.learning_rate=0.001,1e4 --dir d --format json "
                              "--sort optimizer.learning_rate --descending --columns status",
                              t.path);
  CHECK(sorted.code == 4);
  const json rows = json::parse(sorted.out);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["run"] == "learning_rate=1e4");
  CHECK(rows[0].size() == 2);  // run, status

  // Values that name the same folder are refused before anything runs.
  const auto same = run_mpx("sweep --config c.yaml --grid name=a/b,a_b --dir s", t.path);
  CHECK(same.code == 2);
  CHECK(same.err.find("would share the run directory 's/name=a_b'") != std::string::npos);
  CHECK(!fs::exists(t.path / "s"));
  // A bad value is a config error of its point, before anything runs.
  const auto bad = run_mpx("sweep --config c.yaml --grid data.batch_size=8,-1 --dir b", t.path);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("data.batch_size") != std::string::npos);
  CHECK(!fs::exists(t.path / "b"));
  // A run of another config in a point's folder is not skipped: refused, naming the key.
  const auto other = run_mpx("sweep --config c.yaml --set train.epochs=1 --grid optimizer.learning_rate=0.001 "
                             "--dir d",
                             t.path);
  CHECK(other.code == 2);
  CHECK(other.err.find("holds a run of another config: train.epochs (2 in the run, 1 in the sweep)") !=
        std::string::npos);
}

TEST_CASE("cli sweep: a sweep file with seeded random samples", "[cli][sweep]") {
  TempDir t;
  write_file(t.path / "c.yaml", kYaml);
  write_file(t.path / "s.yaml",
             "grid:\n"
             "  optimizer.learning_rate: [0.001, 0.003, 0.01]\n"
             "  train.epochs: [1, 2]\n"
             "random: 2\n"
             "seed: 5\n");
  const auto r = run_mpx("sweep --config c.yaml --file s.yaml --dir f --format json", t.path);
  REQUIRE(r.code == 0);
  const auto tab = table_of(r.out);
  CHECK(tab.size() == 2);
  size_t dirs = 0;
  for (const auto& e : fs::directory_iterator(t.path / "f")) {
    CHECK(tab.count(e.path().filename().string()) == 1);
    ++dirs;
  }
  CHECK(dirs == 2);
  // The same seed draws the same points: all skipped.
  const auto again = run_mpx("sweep --config c.yaml --file s.yaml --dir f --format json", t.path);
  CHECK(again.code == 0);
  CHECK(again.err.find("2 points in f, 0 to train") != std::string::npos);
  write_file(t.path / "bad.yaml", "grid: {train.epochs: [1]}\nrandon: 2\n");
  const auto bad = run_mpx("sweep --config c.yaml --file bad.yaml --dir g", t.path);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("bad.yaml: unknown key 'randon'") != std::string::npos);
}

TEST_CASE("cli sweep: SIGINT stops the running training with a checkpoint, exit 130; the rerun resumes it",
          "[cli][sweep]") {
  TempDir t;
  write_file(t.path / "c.yaml", std::string(kYaml) + "");
  const std::string long_run = " --set train.epochs=200 --set train.checkpoint_every=1";
  const std::string cmd = "cd " + shell_quote(t.path.string()) + " && (" + shell_quote(MPX_BINARY) +
                          " sweep --config c.yaml" + long_run +
                          " --grid optimizer.learning_rate=0.001,0.002 --dir s > s.out 2> s.err & echo $! > pid)";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const long pid = std::stol(read_file(t.path / "pid"));
  const fs::path ckpt = t.path / "s" / "learning_rate=0.001" / "checkpoints" / "last.ckpt";
  for (int i = 0; i < 600 && !fs::exists(ckpt); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(fs::exists(ckpt));
  const std::string stop = "kill -INT " + std::to_string(pid) + "; while kill -0 " + std::to_string(pid) +
                           " 2>/dev/null; do sleep 0.1; done";
  (void)std::system(stop.c_str());
  const std::string err = read_file(t.path / "s.err");
  INFO(err);
  CHECK(err.find("sweep: stopping: the running trainings save a checkpoint") != std::string::npos);
  CHECK(err.find("exit code 130 (the highest of the points)") != std::string::npos);
  const json first = json::parse(read_file(t.path / "s" / "learning_rate=0.001" / "summary.json"));
  CHECK(first["status"] == "interrupted");
  CHECK(!fs::exists(t.path / "s" / "learning_rate=0.002"));  // never started
  // The rerun (shorter, so that it ends) resumes the interrupted point from its checkpoint.
  const auto rest = run_mpx("sweep --config c.yaml --set train.epochs=200 --set train.max_steps=" +
                                std::to_string(first["steps"].get<int64_t>() + 4) +
                                " --grid optimizer.learning_rate=0.001,0.002 --dir s --format json",
                            t.path);
  CHECK(rest.code == 0);
  CHECK(rest.err.find("[1/2] learning_rate=0.001: resuming from its checkpoint") != std::string::npos);
  CHECK(table_of(rest.out).size() == 2);
}
