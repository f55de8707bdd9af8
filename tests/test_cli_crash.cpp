// SPDX-License-Identifier: MIT
// Crash consistency of `mpx train` (docs/testing.md, "Crash consistency and failed writes"): a real
// training is killed with SIGKILL at many random moments (steps, evaluations,
// checkpoint writes) and resumed each time. Every checkpoint on disk is whole, each
// resume starts from the newest one (or a fresh start says none exists), leftover
// temporary files are removed at the next start, metrics.jsonl lists every epoch once,
// and the end result is bit for bit that of an uninterrupted run. Also: SIGINT in the
// first 0.15 s (the OpenMP re-execution in app/) stops the run instead of killing it.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "support/cli.h"
#include "support/run_files.h"

namespace fs = std::filesystem;
using support::TempDir;
using support::write_file;

namespace {

// Six epochs of 8 steps, an evaluation and a checkpoint after each, the plateau schedule
// (a lost or repeated evaluation changes the learning rate and so the weights).
const char* kYaml =
    "name: crash\n"
    "seed: 11\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 16, synthetic_train: 128, synthetic_test: 256}\n"
    "optimizer: {name: adam, learning_rate: 0.01}\n"
    "schedule: {name: reduce_on_plateau, patience: 0, factor: 0.5, min_delta: 0.0}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 16, kernel: 3, activation: relu}\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 64, activation: relu}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 6, log_every: 1, eval_every: 1, checkpoint_every: 1}\n";

/// Starts `mpx <args>` in `cwd` (output to `log`); returns the child's pid.
pid_t spawn_mpx(const fs::path& cwd, const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::chdir(cwd.c_str()) != 0) _exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) _exit(127);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv{const_cast<char*>(MPX_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(MPX_BINARY, argv.data());
    _exit(127);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

/// The arenas and position of a checkpoint, for bit-exact comparison.
struct Snapshot {
  std::vector<float> master, state;
  std::vector<std::vector<float>> opt;
  int64_t global_step = -1;
};

Snapshot snapshot(const fs::path& ckpt) {
  const mpx::Checkpoint c = mpx::load_checkpoint(ckpt.string());
  return {c.master, c.state, c.opt, c.header.global_step};
}

/// Every checkpoint file in the folder loads (magic, sizes, CRCs): none is half written.
void check_checkpoints_whole(const fs::path& dir) {
  if (!fs::exists(dir)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 5 && name.substr(name.size() - 5) == ".ckpt") {
      INFO("checkpoint " << e.path());
      CHECK_NOTHROW(mpx::load_checkpoint(e.path().string()));
    }
  }
}

/// Whether /proc/<pid>/status lists `sig` in the mask on the line starting with `field`
/// ("SigBlk:" blocked, "SigCgt:" caught).
bool signal_mask_has(pid_t pid, const std::string& field, int sig) {
  const std::string status = support::read_file("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find(field);
  if (at == std::string::npos) return false;
  const unsigned long long mask = std::strtoull(status.c_str() + at + field.size(), nullptr, 16);
  return (mask >> (sig - 1)) & 1u;
}

std::vector<std::string> temp_files(const fs::path& run) {
  std::vector<std::string> v;
  for (const fs::path& d : {run, run / "checkpoints"}) {
    if (!fs::exists(d)) continue;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) v.push_back(e.path().string());
  }
  return v;
}

/// The end of a killed-and-resumed run against the uninterrupted one: the same arenas bit for
/// bit, the same summary numbers, each epoch once with the same numbers, each step once.
void check_same_end(const fs::path& straight, const fs::path& run) {
  const Snapshot want = snapshot(straight / "checkpoints" / "last.ckpt");
  const Snapshot got = snapshot(run / "checkpoints" / "last.ckpt");
  CHECK(got.global_step == want.global_step);
  CHECK(support::same_bits(got.master, want.master));
  CHECK(support::same_bits(got.state, want.state));
  REQUIRE(got.opt.size() == want.opt.size());
  for (size_t i = 0; i < got.opt.size(); ++i) CHECK(support::same_bits(got.opt[i], want.opt[i]));
  const auto a = support::read_json(straight / "summary.json");
  const auto b = support::read_json(run / "summary.json");
  CHECK(a["final_test_accuracy"] == b["final_test_accuracy"]);
  CHECK(a["final_train_loss"] == b["final_train_loss"]);

  std::vector<nlohmann::json> want_epochs, got_epochs;
  std::vector<int64_t> steps;
  for (const auto& r : support::read_jsonl(straight / "metrics.jsonl"))
    if (r["kind"] == "epoch") want_epochs.push_back(r);
  for (const auto& r : support::read_jsonl(run / "metrics.jsonl")) {
    if (r["kind"] == "epoch") got_epochs.push_back(r);
    if (r["kind"] == "step") steps.push_back(r["step"].get<int64_t>());
  }
  REQUIRE(got_epochs.size() == want_epochs.size());
  for (size_t i = 0; i < got_epochs.size(); ++i) {
    CHECK(got_epochs[i]["epoch"] == want_epochs[i]["epoch"]);
    CHECK(got_epochs[i]["train_loss"] == want_epochs[i]["train_loss"]);
    CHECK(got_epochs[i]["test_loss"] == want_epochs[i]["test_loss"]);
    CHECK(got_epochs[i]["learning_rate"] == want_epochs[i]["learning_rate"]);
  }
  REQUIRE(static_cast<int64_t>(steps.size()) == want.global_step);
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<int64_t>(i) + 1);
  // The last start removed what earlier kills left half written.
  CHECK(temp_files(run).empty());
}

}  // namespace

TEST_CASE("cli crash: SIGKILL at random moments, resume each time, end bit-exact", "[cli][crash]") {
  TempDir t("mpx_crash");
  write_file(t.path / "c.yaml", kYaml);
  const std::vector<std::string> base{"train", "--no-progress", "--config", "c.yaml"};

  // The uninterrupted run, timed to spread the kills over its whole length.
  auto args = base;
  args.insert(args.end(), {"--run-dir", "straight"});
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(WEXITSTATUS(wait_status(spawn_mpx(t.path, args, t.path / "straight.log"))) == 0);
  const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t total_steps = snapshot(t.path / "straight" / "checkpoints" / "last.ckpt").global_step;

  // Chains of kill-and-resume, each in a fresh folder, until enough kills landed; a chain whose
  // last start outlived its kill moment ran to the end and is compared with the straight run.
  std::mt19937 rng(20261130);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int kills = 0, fresh_starts = 0, resumes = 0, chains = 0;
  for (int attempt = 0; attempt < 80 && kills < 12; ++chains) {
    const fs::path run = t.path / ("cut" + std::to_string(chains)), ckpts = run / "checkpoints";
    const std::string name = run.filename().string();
    for (bool finished = false; !finished && attempt < 80; ++attempt) {
      const bool have = fs::exists(ckpts / "last.ckpt");
      int64_t from_step = -1;
      args = base;
      if (have) {
        from_step = snapshot(ckpts / "last.ckpt").global_step;
        args.insert(args.end(), {"--resume", name});
        ++resumes;
      } else {
        if (fs::exists(run)) {
          // Killed before its first checkpoint: --resume says so.
          const auto r = support::run_mpx("train --no-progress --config c.yaml --resume " + name, t.path);
          CHECK(r.code == 2);
          CHECK(r.err.find("no checkpoints/last.ckpt") != std::string::npos);
        }
        // A fresh start in the folder a killed run left: --overwrite (the run-directory rule).
        args.insert(args.end(), {"--run-dir", name, "--overwrite"});
        ++fresh_starts;
      }
      const fs::path log = t.path / ("attempt" + std::to_string(attempt) + ".log");
      const pid_t pid = spawn_mpx(t.path, args, log);
      // A moment within what is left of the run (start-up, then the remaining steps).
      const double left = from_step < 0 ? 1.0 : 1.0 - static_cast<double>(from_step) / total_steps;
      const auto delay = std::chrono::duration<double, std::milli>(unit(rng) * run_ms * (0.2 + 0.8 * left));
      const auto until = std::chrono::steady_clock::now() + delay;
      int status = 0;
      pid_t done = 0;  // polled, so that a run that ends early is reaped, not killed after it ended
      while (std::chrono::steady_clock::now() < until && (done = ::waitpid(pid, &status, WNOHANG)) == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (done == 0) {
        ::kill(pid, SIGKILL);
        status = wait_status(pid);
      }
      const std::string text = support::read_file(log);
      INFO("attempt " << attempt << " in " << name << ", kill after " << delay.count() << " ms\n" << text);
      // A resume starts from the checkpoint that was on disk: the newest whole one.
      if (have && text.find("resuming at epoch") != std::string::npos)
        CHECK(text.find("global step " + std::to_string(from_step) + ",") != std::string::npos);
      check_checkpoints_whole(ckpts);
      if (WIFSIGNALED(status)) {
        ++kills;
        continue;
      }
      REQUIRE(WEXITSTATUS(status) == 0);  // it finished before its kill moment
      finished = true;
      check_same_end(t.path / "straight", run);
    }
  }
  INFO(kills << " kills, " << resumes << " resumes, " << fresh_starts << " fresh starts in " << chains
             << " chains; the straight run took " << run_ms << " ms");
  CHECK(kills >= 12);
  CHECK(resumes >= 3);
  // The last chain, still cut short: resume it to the end.
  const fs::path run = t.path / ("cut" + std::to_string(chains - 1));
  if (!fs::exists(run / "summary.json") || support::read_json(run / "summary.json")["status"] != "completed") {
    args = base;
    if (fs::exists(run / "checkpoints" / "last.ckpt"))
      args.insert(args.end(), {"--resume", run.filename().string()});
    else
      args.insert(args.end(), {"--run-dir", run.filename().string(), "--overwrite"});
    REQUIRE(WEXITSTATUS(wait_status(spawn_mpx(t.path, args, t.path / "final.log"))) == 0);
    check_same_end(t.path / "straight", run);
  }
}

TEST_CASE("cli crash: a temporary file left by a kill is removed at the next start", "[cli][crash]") {
  TempDir t("mpx_crash_tmp");
  write_file(t.path / "c.yaml", kYaml);
  const auto first = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=1 --run-dir run", t.path);
  REQUIRE(first.code == 0);
  // What a kill during a checkpoint write and a summary write leaves behind.
  write_file(t.path / "run" / "checkpoints" / ".last.ckpt.tmp.4242", "half a checkpoint");
  write_file(t.path / "run" / ".summary.json.tmp.77", "{\"status\":");
  write_file(t.path / "run" / "checkpoints" / "notes.tmp.txt", "not ours: kept");
  const auto again = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=2 --allow-changes train.epochs --resume run", t.path);
  REQUIRE(again.code == 0);
  CHECK_FALSE(fs::exists(t.path / "run" / "checkpoints" / ".last.ckpt.tmp.4242"));
  CHECK_FALSE(fs::exists(t.path / "run" / ".summary.json.tmp.77"));
  CHECK(fs::exists(t.path / "run" / "checkpoints" / "notes.tmp.txt"));
  CHECK(again.err.find(".last.ckpt.tmp.4242") != std::string::npos);
}

TEST_CASE("cli crash: a kill between the epoch record and the checkpoint does not repeat the epoch",
          "[cli][crash]") {
  TempDir t("mpx_crash_metrics");
  write_file(t.path / "c.yaml", kYaml);
  const auto first = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=2 --run-dir run", t.path);
  REQUIRE(first.code == 0);
  // Simulate the kill: epoch 2's records are written, but last.ckpt is still epoch 1's.
  const auto whole = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=1 --run-dir one", t.path);
  REQUIRE(whole.code == 0);
  fs::copy_file(t.path / "one" / "checkpoints" / "last.ckpt", t.path / "run" / "checkpoints" / "last.ckpt",
                fs::copy_options::overwrite_existing);
  support::write_file(t.path / "run" / "metrics.jsonl",
                      support::read_file(t.path / "run" / "metrics.jsonl") + "{\"kind\": \"step\", \"ste");
  const auto again = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=2 --allow-changes train.epochs --resume run", t.path);
  REQUIRE(again.code == 0);
  std::vector<int64_t> epochs, steps;
  for (const auto& r : support::read_jsonl(t.path / "run" / "metrics.jsonl")) {
    if (r["kind"] == "epoch") epochs.push_back(r["epoch"].get<int64_t>());
    if (r["kind"] == "step") steps.push_back(r["step"].get<int64_t>());
  }
  CHECK(epochs == std::vector<int64_t>{1, 2});
  REQUIRE(steps.size() == 16);
  for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i] == static_cast<int64_t>(i) + 1);
  CHECK(again.err.find("dropped") != std::string::npos);
}

TEST_CASE("cli crash: SIGINT in the first 0.15 s stops the run instead of killing it", "[cli][crash]") {
  // From mpx's first instruction (its .preinit_array entry) SIGINT is blocked until main()
  // has a handler, across the OpenMP re-execution; only the dynamic loader's time before
  // that is unprotected, as for any program. So: wait until the process shows SIGINT
  // blocked, then send it at moments that cover the re-execution and the start-up.
  TempDir t("mpx_crash_int");
  write_file(t.path / "c.yaml", kYaml);
  for (int ms = 0; ms <= 150; ms += 15) {
    const std::string dir = "early" + std::to_string(ms);
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = spawn_mpx(t.path, {"train", "--no-progress", "--config", "c.yaml", "--run-dir", dir},
                                t.path / (dir + ".log"));
    bool blocked = false;
    while (!blocked && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
      blocked = signal_mask_has(pid, "SigBlk:", SIGINT);
      if (!blocked) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    INFO("SIGINT " << ms << " ms after SIGINT was first seen blocked\n" << support::read_file(t.path / (dir + ".log")));
    CHECK(blocked);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    ::kill(pid, SIGINT);
    const int status = wait_status(pid);
    REQUIRE_FALSE(WIFSIGNALED(status));
    CHECK(WEXITSTATUS(status) == 130);
  }
}
