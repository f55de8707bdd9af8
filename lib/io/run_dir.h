// SPDX-License-Identifier: MIT
// The run directory: creating runs/<name>-<timestamp>, the rule for an existing
// folder, its lock, and the train.log sink. Its files are written through
// output_file.h (atomic replacement, special files).
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/output_file.h"

namespace spdlog { namespace sinks { class sink; } }

namespace mpx {

/// "runs/<name>-<YYYYmmdd-HHMMSS>" (local time), with "-2", "-3"... when it exists.
std::string default_run_dir(const std::string& name);

/// Creates `dir` and its parents (and dir/checkpoints). Throws Error naming the path.
void create_run_dir(const std::string& dir);

/// The file every run directory gets at creation: it marks the folder as mpx's.
inline constexpr const char* kRunDirMarker = ".mpx-run";

/// What a folder given as a run directory holds (README, "The run directory").
enum class RunDirKind {
  Absent,   // does not exist
  Empty,    // exists and holds nothing (or only an empty checkpoints/ and .lock)
  MpxRun,   // the marker, or config.yaml with summary.json, metrics.jsonl or checkpoints/
  Foreign,  // anything else: never written to, never cleared
  NotAFolder,
};

struct RunDirInfo {
  RunDirKind kind = RunDirKind::Absent;
  std::string foreign_entry;  // Foreign: the first entry (by name) that mpx does not write
  std::string status;         // MpxRun: summary.json's "status" ("" when there is none)
};

/// Looks at `dir` without writing anything.
RunDirInfo inspect_run_dir(const std::string& dir);

/// What the command line says about a run directory that already holds a run.
enum class RunDirUse { New, Resume, Overwrite };


/// @brief Holds `<dir>/.lock` (flock, exclusive) while alive: a second `mpx train` on the
/// same run directory is refused instead of interleaving its files. The kernel drops the
/// lock when the process ends, however it ends, so a killed run never leaves it stuck.
class RunDirLock {
 public:
  /// Throws ConfigError (exit 2) naming the directory and the holder's pid when it is taken.
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

/// @brief The run-directory rule of `mpx train` and `mpx sweep` (README, "The run
/// directory"), in one place: an absent or empty folder is created and used; a
/// foreign one is refused (ConfigError, exit 2, naming it and its first foreign
/// entry) and never cleared; an mpx run directory is refused unless `use` is Resume
/// (continue it) or Overwrite (every file mpx wrote there is removed first, the
/// TensorBoard event files included; other files stay). Takes the RunDirLock before
/// anything is removed, writes the marker and returns the lock.
std::unique_ptr<RunDirLock> open_run_dir(const std::string& dir, RunDirUse use);


/// @brief While alive, the default spdlog logger also writes to `path` (appending),
/// at info level and above; removed (and flushed) on destruction.
class LogFileSink {
 public:
  explicit LogFileSink(const std::string& path);
  ~LogFileSink();
  LogFileSink(const LogFileSink&) = delete;
  LogFileSink& operator=(const LogFileSink&) = delete;
  /// Flushes; throws IoError naming the file, once, when a write to it has failed since.
  void flush();
  /// Writes one info line to the file only (the console shows a live progress line instead).
  void write_info(const std::string& line);

 private:
  std::shared_ptr<spdlog::sinks::sink> sink_;
};

}  // namespace mpx
