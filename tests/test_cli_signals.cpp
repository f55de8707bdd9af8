// SPDX-License-Identifier: MIT
// Stop requests through the mpx binary (docs/design.md, "Signals"): SIGHUP stops
// a training like SIGTERM (checkpoint, summary.json, exit 130) unless it was
// ignored at the start (nohup); a step that outlasts MPX_STOP_TIMEOUT_S ends the
// process with exit 130 and says that no checkpoint was written; a command that
// is not training stops at once, even while it waits on a pipe.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support/cli.h"
#include "support/run_files.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using support::read_file;
using support::TempDir;
using support::write_file;

namespace {

// Many short epochs: a stop request always finds a step boundary soon.
const char* kShort =
    "name: sig\n"
    "seed: 5\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 64, synthetic_test: 16}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 100000, log_every: 1, checkpoint_every: 1}\n";

// One step of about a teraflop (a 1024-filter 7x7 convolution over 14x14x256, batch 64):
// seconds on any CPU, far longer than the 1 s stop timeout the test sets.
const char* kLongStep =
    "name: long\n"
    "seed: 5\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 64, synthetic_train: 128, synthetic_test: 64}\n"
    "optimizer: {name: sgd, learning_rate: 0.01}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 256, kernel: 3, padding: same, activation: relu}\n"
    "    - {type: max_pool, pool_size: 2}\n"
    "    - {type: conv2d, filters: 1024, kernel: 7, padding: same, activation: relu}\n"
    "    - {type: global_avg_pool}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 1, log_every: 1}\n";

struct Child {
  pid_t pid = -1;
  fs::path log;
};

/// Starts `mpx <args>` in `cwd`, stdout and stderr to `log`, with `env` added; SIGHUP
/// ignored from the start when `ignore_hup` (as nohup does).
Child spawn(const fs::path& cwd, const std::vector<std::string>& args, const std::string& log,
            const std::vector<std::string>& env = {}, bool ignore_hup = false) {
  Child c{-1, cwd / log};
  c.pid = ::fork();
  REQUIRE(c.pid >= 0);
  if (c.pid == 0) {
    if (::chdir(cwd.c_str()) != 0) _exit(127);
    const int fd = ::open(c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(127);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    if (ignore_hup) ::signal(SIGHUP, SIG_IGN);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(MPX_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(MPX_BINARY, argv.data());
    _exit(127);
  }
  return c;
}

/// Waits up to `limit` for the child; returns its wait status, or kills it (SIGKILL) and
/// fails when it outlives the limit.
int wait_for(const Child& c, std::chrono::seconds limit) {
  const auto end = Clock::now() + limit;
  int status = 0;
  while (Clock::now() < end) {
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, &status, 0);
  FAIL("mpx did not end within " << limit.count() << " s\n" << read_file(c.log));
  return status;
}

/// Waits until `pred` holds (checked every 20 ms) or `limit` passes.
template <class Pred>
bool wait_until(Pred pred, std::chrono::seconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

size_t lines_of(const fs::path& p) {
  const std::string s = read_file(p);
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cli signals: SIGHUP stops a training at a step boundary with a checkpoint", "[cli][signals]") {
  TempDir t("mpx_sig_hup");
  write_file(t.path / "c.yaml", kShort);
  const Child c = spawn(t.path, {"train", "--no-progress", "--config", "c.yaml", "--run-dir", "run"}, "hup.log");
  REQUIRE(wait_until([&] { return lines_of(t.path / "run" / "metrics.jsonl") >= 10; }, std::chrono::seconds(60)));
  ::kill(c.pid, SIGHUP);
  const int status = wait_for(c, std::chrono::seconds(30));
  INFO(read_file(c.log));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  const auto summary = support::read_json(t.path / "run" / "summary.json");
  CHECK(summary["status"] == "interrupted");
  CHECK(summary["exit_code"] == 130);
  CHECK(fs::is_regular_file(t.path / "run" / "checkpoints" / "last.ckpt"));
}

TEST_CASE("cli signals: SIGHUP ignored at the start (nohup) stays ignored", "[cli][signals]") {
  TempDir t("mpx_sig_nohup");
  write_file(t.path / "c.yaml", kShort);
  const Child c =
      spawn(t.path, {"train", "--no-progress", "--config", "c.yaml", "--run-dir", "run"}, "nohup.log", {}, true);
  REQUIRE(wait_until([&] { return lines_of(t.path / "run" / "metrics.jsonl") >= 5; }, std::chrono::seconds(60)));
  ::kill(c.pid, SIGHUP);
  const size_t before = lines_of(t.path / "run" / "metrics.jsonl");
  // Still training: more records arrive after the SIGHUP.
  CHECK(wait_until([&] { return lines_of(t.path / "run" / "metrics.jsonl") >= before + 5; }, std::chrono::seconds(30)));
  int status = 0;
  CHECK(::waitpid(c.pid, &status, WNOHANG) == 0);
  ::kill(c.pid, SIGTERM);
  status = wait_for(c, std::chrono::seconds(30));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
}

TEST_CASE("cli signals: a step longer than the stop timeout ends with exit 130 and no checkpoint",
          "[cli][signals]") {
  TempDir t("mpx_sig_long");
  write_file(t.path / "c.yaml", kLongStep);
  const Child c = spawn(t.path, {"train", "--no-progress", "--config", "c.yaml", "--run-dir", "run"}, "long.log",
                        {"MPX_STOP_TIMEOUT_S=1"});
  // The "optimizer:" line is the last one before the first step.
  REQUIRE(wait_until([&] { return contains(read_file(c.log), "optimizer:"); }, std::chrono::seconds(120)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  ::kill(c.pid, SIGTERM);
  const int status = wait_for(c, std::chrono::seconds(30));
  const auto took = Clock::now() - t0;
  const std::string log = read_file(c.log);
  INFO(log);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(took < std::chrono::seconds(6));  // 1 s of timeout, then at once
  CHECK(contains(log, "interrupted by SIGTERM, and the command did not reach the end of a step within 1 s"));
  CHECK(contains(log, "without writing a checkpoint"));
  CHECK_FALSE(fs::exists(t.path / "run" / "checkpoints" / "last.ckpt"));
  // What the killed write left: no temporary file.
  for (const auto& e : fs::recursive_directory_iterator(t.path / "run"))
    CHECK_FALSE(contains(e.path().filename().string(), ".tmp."));
}

TEST_CASE("cli signals: a command that is not training stops at once, even in a read of a pipe",
          "[cli][signals]") {
  TempDir t("mpx_sig_validate");
  REQUIRE(::mkfifo((t.path / "f.yaml").c_str(), 0644) == 0);
  // This process holds the FIFO open for writing and never writes: mpx's read waits.
  const int writer = ::open((t.path / "f.yaml").c_str(), O_RDWR);
  REQUIRE(writer >= 0);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const Child c = spawn(t.path, {"validate", "--config", "f.yaml"}, "validate.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    int status = 0;
    REQUIRE(::waitpid(c.pid, &status, WNOHANG) == 0);  // still waiting for the config
    const auto t0 = Clock::now();
    ::kill(c.pid, sig);
    status = wait_for(c, std::chrono::seconds(10));
    INFO("signal " << sig << "\n" << read_file(c.log));
    CHECK(Clock::now() - t0 < std::chrono::seconds(3));
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 130);
    CHECK(contains(read_file(c.log), "error: interrupted by SIG"));
  }
  ::close(writer);
}
