// SPDX-License-Identifier: MIT
// Outputs and inputs that are not regular files, through the mpx binary
// (docs/inputs.md, "Output files" and "Files that are not regular files"): a
// device node or FIFO given as --out is written in place or refused, never
// replaced; a FIFO given as an input never hangs the command; a failed write to
// stdout is exit 6. Every node is a private one made in the test's own folder
// (mknod needs root, as CI runs; the tests skip without it), never the system's.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/cli.h"
#include "support/skip.h"

namespace fs = std::filesystem;
using support::read_file;
using support::shell_quote;
using support::TempDir;
using support::write_file;

namespace {

const char* kConfig =
    "name: special\n"
    "seed: 3\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 4, synthetic_train: 8, synthetic_test: 8}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 1, log_every: 1}\n";

/// `mpx <args>` under `timeout` (a hang fails the test instead of stopping it), stdout to
/// `out` (relative to cwd), stderr captured.
support::Run run_timed(const std::string& args, const fs::path& cwd, int seconds = 30,
                       const std::string& out = ".mpx_stdout") {
  const fs::path err = cwd / ".mpx_stderr";
  const std::string cmd = "cd " + shell_quote(cwd.string()) + " && timeout -k 5 " + std::to_string(seconds) + " " +
                          shell_quote(MPX_BINARY) + " " + args + " > " + shell_quote(out) + " 2> " +
                          shell_quote(err.string()) + " < /dev/null";
  const int status = std::system(cmd.c_str());
  support::Run r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = out == ".mpx_stdout" ? read_file(cwd / out) : "";
  r.err = read_file(err);
  UNSCOPED_INFO("mpx " << args << "\nexit " << r.code << "\n--- stdout ---\n" << r.out << "--- stderr ---\n" << r.err);
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// A private character device node (`major`, `minor`); false without the right to make one.
bool make_char_node(const fs::path& p, unsigned major, unsigned minor) {
  return ::mknod(p.c_str(), S_IFCHR | 0666, makedev(major, minor)) == 0;
}

bool is_char_node(const fs::path& p, unsigned major, unsigned minor) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(major, minor);
}

bool is_fifo_node(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

/// A run directory that `mpx report` reads: summary.json and two step records.
void make_run(const fs::path& d) {
  fs::create_directories(d);
  write_file(d / "summary.json", R"({"status":"completed","exit_code":0,"epochs":1,"steps":2,"policy":"float32"})");
  write_file(d / "metrics.jsonl", "{\"kind\":\"step\",\"step\":1,\"loss\":2.0}\n{\"kind\":\"step\",\"step\":2,\"loss\":1.0}\n");
}

}  // namespace

TEST_CASE("special files: --out on a device node writes into it and leaves the node", "[cli][special]") {
  TempDir t("mpx_special_dev");
  write_file(t.path / "c.yaml", kConfig);
  if (!make_char_node(t.path / "full", 1, 7) || !make_char_node(t.path / "null", 1, 3))
    MPX_SKIP("mknod needs root (CI runs as root)");
  make_run(t.path / "run");

  // A /dev/full-like node: the write fails (exit 6, naming it) and the node stays a node.
  support::Run r = run_timed("export --config c.yaml --out full", t.path);
  CHECK(r.code == 6);
  CHECK(contains(r.err, "cannot write 'full'"));
  CHECK(contains(r.err, "No space left on device"));
  CHECK(is_char_node(t.path / "full", 1, 7));

  r = run_timed("inspect --config c.yaml --batch 2 --out full", t.path);
  CHECK(r.code == 6);
  CHECK(contains(r.err, "cannot write 'full'"));
  CHECK(is_char_node(t.path / "full", 1, 7));

  r = run_timed("report run --out full", t.path);
  CHECK(r.code == 6);
  CHECK(is_char_node(t.path / "full", 1, 7));

  // A /dev/null-like node takes the bytes: exit 0, still the node, no temporary file beside it.
  for (const char* args : {"export --config c.yaml --out null", "inspect --config c.yaml --batch 2 --out null",
                           "report run --out null"}) {
    r = run_timed(args, t.path);
    CHECK(r.code == 0);
    CHECK(is_char_node(t.path / "null", 1, 3));
  }
  for (const auto& e : fs::directory_iterator(t.path)) CHECK_FALSE(contains(e.path().filename().string(), ".tmp."));

  // A block device is refused, never opened: a private node of a loop device.
  if (::mknod((t.path / "blk").c_str(), S_IFBLK | 0600, makedev(7, 0)) == 0) {
    r = run_timed("export --config c.yaml --out blk", t.path);
    CHECK(r.code == 6);
    CHECK(contains(r.err, "it is a block device"));
    struct stat st {};
    REQUIRE(::lstat((t.path / "blk").c_str(), &st) == 0);
    CHECK(S_ISBLK(st.st_mode));
  }
}

TEST_CASE("special files: --out on a FIFO streams to its reader, or is refused without one", "[cli][special]") {
  TempDir t("mpx_special_fifo");
  write_file(t.path / "c.yaml", kConfig);
  REQUIRE(::mkfifo((t.path / "pipe").c_str(), 0644) == 0);

  // No reader: refused at once (not a hang in open()), the FIFO stays.
  const auto t0 = std::chrono::steady_clock::now();
  support::Run r = run_timed("export --config c.yaml --out pipe", t.path, 20);
  CHECK(r.code == 6);
  CHECK(contains(r.err, "no process reads from"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15));
  CHECK(is_fifo_node(t.path / "pipe"));

  // With a reader: the reader gets exactly the bytes of a regular export.
  REQUIRE(run_timed("export --config c.yaml --out plain.safetensors", t.path).code == 0);
  const std::string reader = "cd " + shell_quote(t.path.string()) + " && (timeout 30 cat pipe > got.bin &) && sleep 0.5";
  REQUIRE(std::system(reader.c_str()) == 0);
  r = run_timed("export --config c.yaml --out pipe", t.path);
  CHECK(r.code == 0);
  for (int i = 0; i < 100 && read_file(t.path / "got.bin").size() < read_file(t.path / "plain.safetensors").size(); ++i)
    ::usleep(50000);
  CHECK(read_file(t.path / "got.bin") == read_file(t.path / "plain.safetensors"));
  CHECK(is_fifo_node(t.path / "pipe"));
}

TEST_CASE("special files: a FIFO in the run directory as metrics.jsonl is exit 6 at once, not a hang",
          "[cli][special]") {
  TempDir t("mpx_special_fifo_metrics");
  write_file(t.path / "c.yaml", kConfig);
  fs::create_directories(t.path / "run");
  REQUIRE(::mkfifo((t.path / "run" / "metrics.jsonl").c_str(), 0644) == 0);
  const support::Run r = run_timed("train --no-progress --config c.yaml --run-dir run", t.path, 30);
  // Refused as a run directory (it is not one) or, where it is used, at the FIFO: never a hang.
  CHECK((r.code == 2 || r.code == 6));
  if (r.code == 6) CHECK(contains(r.err, "run/metrics.jsonl' for writing: it is a FIFO (named pipe) that no process"));
  CHECK(is_fifo_node(t.path / "run" / "metrics.jsonl"));
}

TEST_CASE("special files: '-' and /dev/stdout write to stdout; a symlink is replaced, not its target",
          "[cli][special]") {
  TempDir t("mpx_special_stdout");
  write_file(t.path / "c.yaml", kConfig);
  make_run(t.path / "run");
  support::Run r = run_timed("report run --out -", t.path);
  CHECK(r.code == 0);
  CHECK(r.out.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK_FALSE(fs::exists(t.path / "-"));

  r = run_timed("export --config c.yaml --out /dev/stdout", t.path);
  CHECK(r.code == 0);
  REQUIRE(run_timed("export --config c.yaml --out plain.safetensors", t.path).code == 0);
  CHECK(r.out == read_file(t.path / "plain.safetensors"));

  // A symbolic link to a regular file is replaced itself: the file it points to (here in
  // another folder) keeps its bytes.
  fs::create_directories(t.path / "elsewhere");
  write_file(t.path / "elsewhere" / "target.html", "old");
  fs::create_symlink("elsewhere/target.html", t.path / "link.html");
  r = run_timed("report run --out link.html", t.path);
  CHECK(r.code == 0);
  CHECK_FALSE(fs::is_symlink(t.path / "link.html"));
  CHECK(read_file(t.path / "link.html").rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(read_file(t.path / "elsewhere" / "target.html") == "old");

  // A regular file reached through /dev/fd (here stdout redirected to a file) is written
  // in place, never renamed over.
  r = run_timed("report run --out /dev/fd/1", t.path);
  CHECK(r.code == 0);
  CHECK(r.out.rfind("<!DOCTYPE html>", 0) == 0);
}

TEST_CASE("special files: a write error on stdout is exit 6", "[cli][special]") {
  TempDir t("mpx_special_stdout_full");
  write_file(t.path / "c.yaml", kConfig);
  make_run(t.path / "run");
  if (!make_char_node(t.path / "full", 1, 7)) MPX_SKIP("mknod needs root (CI runs as root)");
  for (const char* args : {"report --table run", "report --table run --format json", "validate --config c.yaml",
                           "devices --json", "export --config c.yaml --out -"}) {
    const support::Run r = run_timed(args, t.path, 60, "full");
    CHECK(r.code == 6);
    CHECK(contains(r.err, "No space left on device"));
  }
  // The same commands to a node that takes the bytes: exit 0.
  REQUIRE(make_char_node(t.path / "null", 1, 3));
  CHECK(run_timed("report --table run", t.path, 60, "null").code == 0);

  // stderr: a successful command whose log lines were lost is exit 6 too; a failed one
  // keeps its own code.
  const auto with_stderr_full = [&](const std::string& args) {
    const std::string cmd = "cd " + shell_quote(t.path.string()) + " && timeout -k 5 60 " + shell_quote(MPX_BINARY) +
                            " " + args + " > /dev/null 2> full < /dev/null";
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  };
  CHECK(with_stderr_full("export --config c.yaml --out w.safetensors") == 6);
  CHECK(with_stderr_full("validate --config missing.yaml") == 2);
}

TEST_CASE("special files: a FIFO as an input is refused or read, never waited on forever", "[cli][special]") {
  TempDir t("mpx_special_fifo_in");
  write_file(t.path / "c.yaml", kConfig);
  REQUIRE(::mkfifo((t.path / "f.yaml").c_str(), 0644) == 0);

  // No writer: exit 2 at once, naming the file.
  support::Run r = run_timed("validate --config f.yaml", t.path, 20);
  CHECK(r.code == 2);
  CHECK(contains(r.err, "f.yaml: the config is a FIFO (named pipe) that no process is writing to"));

  // A writer: the config is read from the pipe (a stream read on purpose).
  const std::string writer = "cd " + shell_quote(t.path.string()) + " && (timeout 30 cat c.yaml > f.yaml &)";
  REQUIRE(std::system(writer.c_str()) == 0);
  ::usleep(300000);
  r = run_timed("validate --config f.yaml", t.path, 60);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "config OK"));

  // A FIFO as a checkpoint: exit 3 naming it, never opened.
  REQUIRE(::mkfifo((t.path / "ck.fifo").c_str(), 0644) == 0);
  r = run_timed("export --config c.yaml --checkpoint ck.fifo --out w.safetensors", t.path, 20);
  CHECK(r.code == 3);
  CHECK(contains(r.err, "'ck.fifo': it is a FIFO (named pipe), not a checkpoint file"));

  // A FIFO as a run's metrics.jsonl: `mpx report` refuses it (exit 3) instead of hanging.
  fs::create_directories(t.path / "run");
  write_file(t.path / "run" / "summary.json", R"({"status":"completed"})");
  REQUIRE(::mkfifo((t.path / "run" / "metrics.jsonl").c_str(), 0644) == 0);
  r = run_timed("report --table run", t.path, 20);
  CHECK(r.code == 3);
  CHECK(contains(r.err, "run/metrics.jsonl: it is a FIFO (named pipe), not a regular file"));
}
