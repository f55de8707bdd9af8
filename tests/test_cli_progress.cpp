// SPDX-License-Identifier: MIT
// The live progress line on a terminal (a pseudo-terminal from script(1)):
// train, compare and eval show it; a log line printed while it shows (a skipped
// step) starts on a cleared line, never in the middle of it; the line is gone
// before the result is printed. Start-up sizes are in KiB/MiB, not bytes.
#include <catch2/catch.hpp>

#include <regex>
#include <string>

#include "support/cli.h"

using support::run_mpx;
using support::shell_quote;
using support::TempDir;
using support::write_file;

namespace {

// mixed_float16 with a loss scale far too large: the first steps overflow and are skipped,
// and each skip is an info line printed while the progress line shows.
const char* kYaml =
    "name: prog\n"
    "device: cpu\n"
    "policy: mixed_float16\n"
    "loss_scale: {mode: dynamic, initial: 2.68435456e+8}\n"
    "data: {dataset: synthetic, batch_size: 8, synthetic_train: 64, synthetic_test: 16}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n"
    "train: {epochs: 2, log_every: 4}\n";

/// What a terminal receives from `mpx <args>` (stdout and stderr together); the exit code in `code`.
std::string on_a_terminal(const TempDir& t, const std::string& args, int& code) {
  const std::string cmd = "cd " + shell_quote(t.str()) + " && script -qec " +
                          shell_quote(shell_quote(MPX_BINARY) + " " + args) + " /dev/null > tty.out 2>&1 < /dev/null";
  const int status = std::system(cmd.c_str());
  code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const std::string out = support::read_file(t.path / "tty.out");
  UNSCOPED_INFO("mpx " << args << " on a terminal, exit " << code << ":\n" << out);
  return out;
}

/// Every progress line ("... ETA 3s") is followed by '\r' (redrawn or cleared), never by other text.
void check_nothing_mid_line(const std::string& out) {
  const std::regex eta("ETA [0-9hms?]+");
  int n = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), eta); it != std::sregex_iterator(); ++it, ++n) {
    const size_t end = static_cast<size_t>(it->position() + it->length());
    INFO("after '" << it->str() << "' at byte " << it->position());
    REQUIRE(end < out.size());
    CHECK(out[end] == '\r');
  }
  CHECK(n > 0);  // the progress line was shown
}

/// Every match of `re` (groups: bar, done, whole; or done, whole, bar with `steps_first`)
/// has a bar filled in proportion: done * 20 / whole '#', the rest '.'. Returns the matches.
int check_bars(const std::string& out, const std::regex& re, bool steps_first = false) {
  int n = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it, ++n) {
    const std::string bar = (*it)[steps_first ? 3 : 1];
    const int done = std::stoi((*it)[steps_first ? 1 : 2]), whole = std::stoi((*it)[steps_first ? 2 : 3]);
    INFO(it->str());
    CHECK(bar == std::string(static_cast<size_t>(done * 20 / whole), '#') +
                     std::string(static_cast<size_t>(20 - done * 20 / whole), '.'));
  }
  return n;
}

}  // namespace

TEST_CASE("cli progress: train, eval and compare on a terminal; log lines never start mid-line", "[cli][progress]") {
  TempDir t{"mpx_test_cli_progress"};
  write_file(t.path / "c.yaml", kYaml);
  int code = -1;
  const std::string train = on_a_terminal(t, "train --config c.yaml --run-dir run", code);
  REQUIRE(code == 0);
  CHECK(train.find("skipped (") != std::string::npos);  // log lines came while the line showed
  check_nothing_mid_line(train);
  // The line has a bar over the epoch's steps and the time per step.
  CHECK(check_bars(train, std::regex(R"(epoch [12]/2 \[([#.]{20})\] ([0-9]+)/(8) loss )")) > 0);
  CHECK(std::regex_search(train, std::regex(R"( [0-9]+\.[0-9] ms/step ETA )")));
  // With train.max_steps ending the run first, the bar is over the run's steps.
  const std::string capped = on_a_terminal(t, "train --config c.yaml --run-dir capped --set train.max_steps=10", code);
  REQUIRE(code == 0);
  CHECK(check_bars(capped, std::regex(R"(step ([0-9]+)/(10) \[([#.]{20})\] epoch [12]/2 loss )"), true) > 0);
  check_nothing_mid_line(capped);
  CHECK(std::regex_search(train, std::regex(R"(memory: master [0-9.]+ KiB, grads [0-9.]+ KiB)")));
  CHECK(std::regex_search(train, std::regex(R"(activations [0-9.]+ (KiB|MiB))")));

  const std::string eval = on_a_terminal(t, "eval --checkpoint run", code);
  REQUIRE(code == 0);
  CHECK(std::regex_search(eval, std::regex(R"(eval [0-9]+/16 records)")));
  // The result starts on a cleared line.
  const size_t res = eval.find("test loss");
  REQUIRE(res != std::string::npos);
  CHECK(eval.substr(0, res).rfind("\r\033[K") == res - 4);

  // --no-progress: no live line at all.
  const std::string quiet = on_a_terminal(t, "eval --checkpoint run --no-progress", code);
  CHECK(quiet.find("eval 16/") == std::string::npos);

  const std::string cmp =
      on_a_terminal(t, "compare --config c.yaml --policies float32,mixed_float16 --steps 8 --run-dir cmp", code);
  REQUIRE(code == 0);
  check_nothing_mid_line(cmp);
}

TEST_CASE("cli progress: without a terminal there is no progress line", "[cli][progress]") {
  TempDir t{"mpx_test_cli_progress"};
  write_file(t.path / "c.yaml", kYaml);
  const auto r = run_mpx("train --config c.yaml --run-dir run --set train.epochs=1", t.path);
  REQUIRE(r.code == 0);
  CHECK(r.err.find('\r') == std::string::npos);
  const auto e = run_mpx("eval --checkpoint run", t.path);
  REQUIRE(e.code == 0);
  CHECK(e.err.find('\r') == std::string::npos);
}
