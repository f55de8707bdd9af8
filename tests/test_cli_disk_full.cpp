// SPDX-License-Identifier: MIT
// Outputs that fail mid-run (docs/testing.md, "Crash consistency and failed writes"): a checkpoint write
// that hits the file-size limit (RLIMIT_FSIZE with SIGXFSZ ignored: EFBIG, as a
// full disk gives ENOSPC; the tests run as root, where permissions stop nothing)
// and metrics.jsonl or train.log on /dev/full (ENOSPC on every write). Each time
// the previous checkpoint is intact, no temporary file is left, the message names
// the file and the system's reason, and mpx exits 6 with summary.json saying so.
// Read-only folders: as root, permissions stop nothing, so those runs drop to
// the unprivileged user 65534 through setpriv(1) (util-linux).
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "io/checkpoint.h"
#include "support/cli.h"
#include "support/run_files.h"

namespace fs = std::filesystem;
using support::read_file;
using support::shell_quote;
using support::TempDir;
using support::write_file;

namespace {

// Adam state makes last.ckpt about 8 MB (692k parameters, three arenas).
const char* kYaml =
    "name: full\n"
    "seed: 5\n"
    "device: cpu\n"
    "data: {dataset: synthetic, batch_size: 16, synthetic_train: 64, synthetic_test: 64}\n"
    "optimizer: {name: adam, learning_rate: 0.01}\n"
    "model:\n"
    "  layers:\n"
    "    - {type: conv2d, filters: 16, kernel: 3, activation: relu}\n"
    "    - {type: flatten}\n"
    "    - {type: dense, units: 64, activation: relu}\n"
    "    - {type: dense, units: 10, activation: softmax}\n"
    "train: {epochs: 1, checkpoint_every: 1}\n";

/// `mpx <args>` in `cwd` under a shell `prefix` (limits, traps); `mpx` is the
/// command that starts it (the build's executable unless told); exit code and stderr.
support::Run run_limited(const std::string& prefix, const std::string& args, const fs::path& cwd,
                         const std::string& mpx = shell_quote(MPX_BINARY)) {
  const std::string cmd = "cd " + shell_quote(cwd.string()) + " && (" + prefix + " exec " + mpx + " " + args +
                          ") > out.txt 2> err.txt < /dev/null";
  const int status = std::system(cmd.c_str());
  support::Run r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = read_file(cwd / "err.txt");
  UNSCOPED_INFO("mpx " << args << "\nexit " << r.code << "\n--- stderr ---\n" << r.err);
  return r;
}

bool has_temp_files(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

/// One epoch trained normally: the checkpoint the failing run must not damage.
std::string first_epoch(const TempDir& t) {
  write_file(t.path / "c.yaml", kYaml);
  const auto r = support::run_mpx("train --no-progress --config c.yaml --run-dir run", t.path);
  REQUIRE(r.code == 0);
  const std::string ckpt = read_file(t.path / "run" / "checkpoints" / "last.ckpt");
  REQUIRE(ckpt.size() > 4u << 20);
  return ckpt;
}

/// The command that runs mpx as a user whom folder permissions bind: the build's
/// executable when the tests are not root; when they are, a copy of it in `dir`
/// (the build folder may sit where user 65534 cannot reach) started by setpriv
/// as user and group 65534. `dir` becomes readable by everyone.
std::string unprivileged(const fs::path& dir) {
  using fs::perms;
  fs::permissions(dir, perms::owner_all | perms::group_read | perms::group_exec | perms::others_read |
                           perms::others_exec);
  if (::geteuid() != 0) return shell_quote(MPX_BINARY);
  REQUIRE(std::system("command -v setpriv > /dev/null") == 0);  // util-linux, in scripts/install_deps.sh
  const fs::path copy = dir / "mpx";
  fs::copy_file(MPX_BINARY, copy);
  fs::permissions(copy, perms::owner_all | perms::group_read | perms::group_exec | perms::others_read |
                            perms::others_exec);
  return "setpriv --reuid=65534 --regid=65534 --clear-groups " + shell_quote(copy.string());
}

/// Hands `dir` and everything in it to the user unprivileged() runs as (root only).
void give_to_unprivileged(const fs::path& dir) {
  if (::geteuid() != 0) return;
  REQUIRE(std::system(("chown -R 65534:65534 " + shell_quote(dir.string())).c_str()) == 0);
}

void check_failed_summary(const fs::path& run) {
  const auto s = support::read_json(run / "summary.json");
  CHECK(s["status"] == "failed");
  CHECK(s["exit_code"] == 6);
}

}  // namespace

TEST_CASE("disk full: a checkpoint write that fails keeps the previous checkpoint, exit 6", "[cli][diskfull]") {
  TempDir t("mpx_full_ckpt");
  const std::string before = first_epoch(t);
  const std::string best = read_file(t.path / "run" / "checkpoints" / "best.ckpt");
  // At most 1 or 2 MB per file (sh counts 512- or 1024-byte blocks): the logs fit, a checkpoint does not.
  const auto r = run_limited("trap '' XFSZ; ulimit -f 2048;",
                             "train --no-progress --config c.yaml --set train.epochs=2 --allow-changes train.epochs --resume run", t.path);
  CHECK(r.code == 6);
  CHECK(r.err.find("cannot write checkpoint '") != std::string::npos);
  CHECK(r.err.find("/checkpoints/") != std::string::npos);
  CHECK(r.err.find("File too large") != std::string::npos);
  CHECK(read_file(t.path / "run" / "checkpoints" / "last.ckpt") == before);
  CHECK(read_file(t.path / "run" / "checkpoints" / "best.ckpt") == best);
  CHECK_FALSE(has_temp_files(t.path / "run"));
  check_failed_summary(t.path / "run");
}

TEST_CASE("disk full: metrics.jsonl that cannot be written is exit 6 naming it", "[cli][diskfull]") {
  TempDir t("mpx_full_metrics");
  const std::string before = first_epoch(t);
  fs::remove(t.path / "run" / "metrics.jsonl");
  fs::create_symlink("/dev/full", t.path / "run" / "metrics.jsonl");
  const auto r = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=2 --allow-changes train.epochs --resume run", t.path);
  CHECK(r.code == 6);
  CHECK(r.err.find("metrics.jsonl") != std::string::npos);
  CHECK(r.err.find("No space left on device") != std::string::npos);
  CHECK(read_file(t.path / "run" / "checkpoints" / "last.ckpt") == before);
  check_failed_summary(t.path / "run");
}

TEST_CASE("disk full: train.log that cannot be written is exit 6 naming it", "[cli][diskfull]") {
  TempDir t("mpx_full_log");
  first_epoch(t);
  fs::remove(t.path / "run" / "train.log");
  fs::create_symlink("/dev/full", t.path / "run" / "train.log");
  const auto r = support::run_mpx("train --no-progress --config c.yaml --set train.epochs=2 --allow-changes train.epochs --resume run", t.path);
  CHECK(r.code == 6);
  CHECK(r.err.find("train.log") != std::string::npos);
  CHECK(r.err.find("No space left on device") != std::string::npos);
  check_failed_summary(t.path / "run");
  // The epoch's checkpoint was written before the log was flushed; either way it is whole.
  CHECK_NOTHROW(mpx::load_checkpoint((t.path / "run" / "checkpoints" / "last.ckpt").string()));
  CHECK_FALSE(has_temp_files(t.path / "run"));
}

TEST_CASE("read-only: a checkpoints folder that cannot be written keeps the previous checkpoint, exit 6",
          "[cli][diskfull]") {
  TempDir t("mpx_ro_ckpt");
  const std::string before = first_epoch(t);
  const std::string best = read_file(t.path / "run" / "checkpoints" / "best.ckpt");
  const std::string mpx = unprivileged(t.path);
  give_to_unprivileged(t.path / "run");
  const fs::path ckpts = t.path / "run" / "checkpoints";
  const auto writable = fs::status(ckpts).permissions();
  fs::permissions(ckpts, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  const auto r = run_limited("", "train --no-progress --config c.yaml --set train.epochs=2 --allow-changes train.epochs --resume run", t.path, mpx);
  fs::permissions(ckpts, writable);
  CHECK(r.code == 6);
  CHECK(r.err.find("cannot write 'run/checkpoints/") != std::string::npos);  // best.ckpt or last.ckpt
  CHECK(r.err.find(".ckpt' (through its temporary file '") != std::string::npos);
  CHECK(r.err.find("Permission denied") != std::string::npos);
  CHECK(read_file(ckpts / "last.ckpt") == before);
  CHECK(read_file(ckpts / "best.ckpt") == best);
  CHECK_FALSE(has_temp_files(t.path / "run"));
  check_failed_summary(t.path / "run");
}

TEST_CASE("read-only: a run directory in a folder that cannot be written is exit 6 naming it", "[cli][diskfull]") {
  TempDir t("mpx_ro_parent");
  write_file(t.path / "c.yaml", kYaml);
  const std::string mpx = unprivileged(t.path);
  fs::create_directory(t.path / "ro");
  fs::permissions(t.path / "ro", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                     fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  const auto r = run_limited("", "train --no-progress --config c.yaml --run-dir ro/run", t.path, mpx);
  fs::permissions(t.path / "ro", fs::perms::owner_all);
  CHECK(r.code == 6);
  CHECK(r.err.find("cannot create the run directory 'ro/run'") != std::string::npos);
  CHECK(r.err.find("Permission denied") != std::string::npos);
  CHECK_FALSE(fs::exists(t.path / "ro" / "run"));
}
