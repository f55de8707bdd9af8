// SPDX-License-Identifier: MIT
// `mpx report` on run directories far larger than a run writes, through the mpx
// binary (docs/inputs.md, "Run directories"): metrics.jsonl is read in one pass
// with bounded memory (curves decimated to kMaxCurvePoints, the last record
// kept), a line longer than the limit is skipped, and nothing aborts.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>

#include "report/run_data.h"
#include "support/cli.h"
#include "support/sanitizers.h"

// The memory bounds below are checked outside AddressSanitizer builds only (support/sanitizers.h).

namespace fs = std::filesystem;
using support::read_file;
using support::shell_quote;
using support::TempDir;
using support::write_file;

namespace {

/// Runs `mpx <args>` in `cwd` in a child of its own and returns its exit code and the
/// peak resident memory (KiB) of the processes it waited for (the shell and mpx).
struct Measured {
  int code = -1;
  long max_rss_kib = 0;
};
Measured run_measured(const std::string& args, const fs::path& cwd) {
  const fs::path result = cwd / ".rss";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string cmd = "cd " + shell_quote(cwd.string()) + " && timeout -k 5 120 " + shell_quote(MPX_BINARY) +
                            " " + args + " > .mpx_stdout 2> .mpx_stderr < /dev/null";
    const int status = std::system(cmd.c_str());
    rusage ru{};
    ::getrusage(RUSAGE_CHILDREN, &ru);
    std::FILE* f = std::fopen(result.c_str(), "w");
    if (f) {
      std::fprintf(f, "%d %ld\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), ru.ru_maxrss);
      std::fclose(f);
    }
    _exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  Measured m;
  REQUIRE(std::sscanf(read_file(result).c_str(), "%d %ld", &m.code, &m.max_rss_kib) == 2);
  UNSCOPED_INFO("mpx " << args << "\nexit " << m.code << ", peak RSS " << m.max_rss_kib << " KiB\n--- stderr ---\n"
                       << read_file(cwd / ".mpx_stderr"));
  return m;
}

/// The data-points and data-last-x of the first series of a curve in the HTML page.
std::pair<long, long> curve_points(const std::string& html, const std::string& curve) {
  const size_t at = html.find("data-curve=\"" + curve + "\"");
  REQUIRE(at != std::string::npos);
  std::smatch m;
  const std::string rest = html.substr(at, 4096);
  REQUIRE(std::regex_search(rest, m, std::regex("data-points=\"([0-9]+)\" data-last-x=\"([0-9]+)\"")));
  return {std::stol(m[1]), std::stol(m[2])};
}

}  // namespace

TEST_CASE("report limits: a metrics.jsonl of hundreds of MB is read with bounded memory", "[cli][report][limits]") {
  TempDir t("mpx_report_big");
  const fs::path run = t.path / "run";
  fs::create_directories(run);
  write_file(run / "summary.json", R"({"status":"completed","exit_code":0,"steps":400000,"policy":"float32"})");
  // 400,000 step records (about 45 MB), an epoch record every 1,000 steps, then one line of
  // 8 MiB and a sparse 1 GiB tail without a line break (the probe's 2 GB sparse file).
  constexpr long kSteps = 400000;
  {
    std::FILE* f = std::fopen((run / "metrics.jsonl").c_str(), "wb");
    REQUIRE(f);
    for (long s = 1; s <= kSteps; ++s) {
      std::fprintf(f, "{\"kind\":\"step\",\"epoch\":1,\"step\":%ld,\"loss\":%.6f,\"accuracy\":0.5,\"note\":\"x\"}\n", s,
                   1.0 + 1.0 / static_cast<double>(s));
      if (s % 1000 == 0)
        std::fprintf(f, "{\"kind\":\"epoch\",\"epoch\":%ld,\"step\":%ld,\"test_loss\":0.5,\"test_accuracy\":0.9}\n",
                     s / 1000, s);
    }
    const std::string big(8u << 20, 'x');
    std::fprintf(f, "{\"kind\":\"step\",\"step\":1,\"s\":\"%s\"}\n", big.c_str());
    std::fclose(f);
  }
  std::error_code ec;
  const auto size = fs::file_size(run / "metrics.jsonl");
  fs::resize_file(run / "metrics.jsonl", size + (1ull << 30), ec);
  REQUIRE_FALSE(ec);

  // The binary's own footprint (its libraries) is the baseline: a run of a few records.
  fs::create_directories(t.path / "small");
  write_file(t.path / "small" / "summary.json", R"({"status":"completed"})");
  write_file(t.path / "small" / "metrics.jsonl", "{\"kind\":\"step\",\"step\":1,\"loss\":1.0}\n");
  const Measured base = run_measured("report small --out s.html", t.path);
  REQUIRE(base.code == 0);

  const Measured html = run_measured("report run --out r.html", t.path);
  CHECK(html.code == 0);
  // Reading it whole took about 5x the file (here over 1 GiB for the last line alone).
  if (!MPX_TEST_ASAN) CHECK(html.max_rss_kib < base.max_rss_kib + 64 * 1024);
  const std::string page = read_file(t.path / "r.html");
  const auto [points, last] = curve_points(page, "train_loss");
  CHECK(points <= static_cast<long>(mpx::report::kMaxCurvePoints) + 1);
  CHECK(points >= static_cast<long>(mpx::report::kMaxCurvePoints) / 2);
  CHECK(last == kSteps);  // the last record is always kept
  const auto [epochs, last_epoch] = curve_points(page, "test_accuracy");
  CHECK(epochs == kSteps / 1000);  // under the limit: every one
  CHECK(last_epoch == kSteps);
  // The run's summary says how many records there are and how many the curves show.
  CHECK(page.find("400000 step and 400 epoch records; the curves show ") != std::string::npos);
  CHECK(page.find("2 unreadable lines skipped") != std::string::npos);  // the 8 MiB line and the NUL tail

  const Measured table = run_measured("report --table run --format json", t.path);
  CHECK(table.code == 0);
  if (!MPX_TEST_ASAN) CHECK(table.max_rss_kib < base.max_rss_kib + 64 * 1024);
}

TEST_CASE("report limits: a summary.json over its limit is exit 3 naming it", "[cli][report][limits]") {
  TempDir t("mpx_report_summary");
  fs::create_directories(t.path / "run");
  write_file(t.path / "run" / "summary.json", "{\"status\":\"completed\",\"pad\":\"" + std::string(2u << 20, 'p') + "\"}");
  const support::Run r = support::run_mpx("report --table run", t.path);
  CHECK(r.code == 3);
  CHECK(r.err.find("run/summary.json: 2097183 bytes, more than the 1048576 bytes mpx report reads") !=
        std::string::npos);
}

TEST_CASE("report limits: a summary.json with bytes that are not UTF-8 is unreadable, not an internal error",
          "[cli][report][limits]") {
  // The file does not parse; the parse error quotes the bad bytes in the run's message, and
  // dumping that message as JSON threw: exit 1 "internal error".
  TempDir t("mpx_report_utf8");
  fs::create_directories(t.path / "run");
  write_file(t.path / "run" / "summary.json",
             "{\"status\":\"completed\",\"steps\":8,\"policy\xff\xff\":\"float32\",\"message\":\"ok\"}");
  for (const char* f : {"json", "csv", "text", "markdown"}) {
    const support::Run r = support::run_mpx(std::string("report --table run --format ") + f, t.path);
    CHECK(r.code == 0);
    CHECK(r.out.find("unreadable") != std::string::npos);
    CHECK(r.out.find("summary.json") != std::string::npos);
  }
  CHECK(support::run_mpx("report run --out r.html", t.path).code == 0);
}
