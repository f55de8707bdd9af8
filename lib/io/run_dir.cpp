// SPDX-License-Identifier: MIT
// Run directory helpers: naming, creation, the rule for an existing folder, the lock, the train.log sink.
#include "io/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"
#include "core/input_file.h"

namespace fs = std::filesystem;

namespace mpx {

std::string default_run_dir(const std::string& name) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const std::string base = "runs/" + (name.empty() ? std::string("run") : name) + "-" + stamp;
  std::string dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

void create_run_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "checkpoints", ec);
  if (ec) throw IoError("cannot create the run directory '" + dir + "': " + ec.message());
}

RunDirLock::RunDirLock(const std::string& dir) {
  const fs::path path = fs::path(dir) / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError("cannot open the lock file '" + path.string() + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw IoError("cannot lock '" + path.string() + "': " + std::strerror(err));
    const std::string holder = n > 0 ? " (pid " + std::string(buf, static_cast<size_t>(n)) + ")" : "";
    throw ConfigError("the run directory '" + dir + "' is in use by another mpx train" + holder +
                      ": wait for it to finish, or give another --run-dir");
  }
  // The pid is only for the message a second run prints; the lock holds without it.
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

namespace {

/// The files mpx writes at the top of a run directory (folders: checkpoints, tensorboard).
bool is_mpx_file_name(const std::string& name) {
  static const char* const kFiles[] = {"config.yaml", "train.log", "metrics.jsonl", "summary.json", ".lock",
                                       kRunDirMarker};
  for (const char* f : kFiles)
    if (name == f) return true;
  return is_atomic_temp_name(name);
}

bool is_marker_temp_name(const std::string& name) {
  return is_atomic_temp_name(name) && name.rfind("." + std::string(kRunDirMarker) + ".tmp.", 0) == 0;
}

bool is_mpx_folder_name(const std::string& name) { return name == "checkpoints" || name == "tensorboard"; }

bool is_empty_folder(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::is_empty(p, ec) && !ec;
}

/// Entries of `dir` by name (sorted, so that "the first foreign entry" is always the same).
std::vector<std::string> entry_names(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec) throw IoError("cannot list the run directory '" + dir.string() + "': " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

std::string summary_status(const fs::path& dir) {
  std::ifstream in(dir / "summary.json");
  if (!in) return "";
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.is_object() && j.contains("status") && j["status"].is_string()) return j["status"].get<std::string>();
  } catch (const std::exception&) {
  }
  return "unreadable";
}

}  // namespace

RunDirInfo inspect_run_dir(const std::string& dir) {
  RunDirInfo info;
  const fs::path p(dir);
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec || st.type() == fs::file_type::not_found) return info;  // Absent
  if (st.type() != fs::file_type::directory) {
    info.kind = RunDirKind::NotAFolder;
    return info;
  }
  const std::vector<std::string> names = entry_names(p);
  // What a run killed while it made the folder leaves: its lock, an empty checkpoints folder,
  // the marker's temporary file (the marker is the first file written, atomically).
  const bool leftover_only = std::all_of(names.begin(), names.end(), [&](const std::string& n) {
    return n == ".lock" || (n == "checkpoints" && is_empty_folder(p / n)) || is_marker_temp_name(n);
  });
  if (leftover_only) {
    info.kind = RunDirKind::Empty;
    return info;
  }
  const auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  const bool marked = has(kRunDirMarker) && fs::is_regular_file(p / kRunDirMarker, ec);
  const bool older_run = has("config.yaml") && (has("summary.json") || has("metrics.jsonl") ||
                                                (has("checkpoints") && fs::is_directory(p / "checkpoints", ec)));
  if (marked || older_run) {
    info.kind = RunDirKind::MpxRun;
    info.status = summary_status(p);
    return info;
  }
  info.kind = RunDirKind::Foreign;
  for (const std::string& n : names) {
    if (!is_mpx_file_name(n) && !is_mpx_folder_name(n)) {
      info.foreign_entry = n;
      break;
    }
  }
  if (info.foreign_entry.empty()) info.foreign_entry = names.front();
  return info;
}

namespace {

/// Removes what mpx wrote in `dir` (a run directory): its files, the checkpoints and the
/// TensorBoard event files; a folder is removed only when nothing else is left in it.
void clear_mpx_files(const fs::path& dir) {
  const auto remove_file = [](const fs::path& f) {
    std::error_code ec;
    if (!fs::remove(f, ec) && ec) throw IoError("cannot remove '" + f.string() + "' (--overwrite): " + ec.message());
  };
  const auto remove_if_empty = [](const fs::path& d) {
    std::error_code ec;
    if (is_empty_folder(d)) fs::remove(d, ec);
  };
  for (const std::string& n : entry_names(dir)) {
    if (n == ".lock") continue;  // held by this process
    std::error_code ec;
    const fs::path p = dir / n;
    if (is_mpx_file_name(n) && !fs::is_directory(fs::symlink_status(p, ec))) remove_file(p);
  }
  const fs::path ck = dir / "checkpoints";
  if (fs::is_directory(fs::symlink_status(ck))) {
    for (const std::string& n : entry_names(ck)) {
      const bool ours = (n.size() > 5 && n.compare(n.size() - 5, 5, ".ckpt") == 0) || is_atomic_temp_name(n);
      if (ours && fs::is_regular_file(fs::symlink_status(ck / n))) remove_file(ck / n);
    }
  }
  const fs::path tb = dir / "tensorboard";
  if (fs::is_directory(fs::symlink_status(tb))) {
    for (const char* sub : {"train", "validation"}) {
      const fs::path d = tb / sub;
      if (!fs::is_directory(fs::symlink_status(d))) continue;
      for (const std::string& n : entry_names(d))
        if (n.rfind("events.out.tfevents.", 0) == 0 && fs::is_regular_file(fs::symlink_status(d / n)))
          remove_file(d / n);
      remove_if_empty(d);
    }
    remove_if_empty(tb);
  }
}

}  // namespace

std::unique_ptr<RunDirLock> open_run_dir(const std::string& dir, RunDirUse use) {
  const RunDirInfo before = inspect_run_dir(dir);
  if (before.kind == RunDirKind::Foreign)
    throw ConfigError(fmt::format("the run directory '{}' is not empty and is not an mpx run directory (it holds "
                                  "'{}'); mpx writes and clears only its own run directories, so it is left "
                                  "untouched, also with --overwrite: give a new or empty --run-dir",
                                  dir, before.foreign_entry));
  create_run_dir(dir);  // exit 6 naming the path when it cannot be made (e.g. a file of that name)
  auto lock = std::make_unique<RunDirLock>(dir);
  if (before.kind == RunDirKind::Empty)  // a killed run's marker temp: its writer held this lock
    for (const std::string& n : entry_names(dir))
      if (is_marker_temp_name(n)) {
        std::error_code ec;
        fs::remove(fs::path(dir) / n, ec);
      }
  if (before.kind == RunDirKind::MpxRun) {
    if (use == RunDirUse::New) {
      const std::string& s = before.status;
      std::string what = "a run (summary.json status: " + s + ")";
      if (s.empty()) what = "an unfinished run (no summary.json)";
      else if (s == "completed" || s == "failed") what = "a " + s + " run";
      else if (s == "interrupted") what = "an interrupted run";
      else if (s == "diverged") what = "a run that diverged";
      throw ConfigError(fmt::format("the run directory '{}' already holds {}: continue it with --resume {}, "
                                    "replace it with --overwrite (removes the files mpx wrote there, "
                                    "TensorBoard event files included), or give another --run-dir",
                                    dir, what, dir));
    }
    if (use == RunDirUse::Overwrite) {
      clear_mpx_files(dir);
      create_run_dir(dir);
      spdlog::info("--overwrite: removed the previous run's files from '{}'", dir);
    }
  }
  const fs::path marker = fs::path(dir) / kRunDirMarker;
  if (!fs::exists(marker)) write_file_atomic(marker.string(), "an mpx run directory (README, \"The run directory\")\n");
  return lock;
}


namespace {
/// train.log: appends each formatted line and flushes it, so the file is current
/// while the run goes on (and complete after a crash).
class FlushingFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FlushingFileSink(const std::string& path) : path_(path) {
    f_ = open_for_writing(path, true);
    if (!f_) throw IoError("cannot open the log file '" + path + "': " + open_for_writing_error(errno));
  }
  ~FlushingFileSink() override {
    if (f_) std::fclose(f_);
  }

 public:
  /// The first write failure ("cannot write '<path>': <reason>"), once; "" when none.
  /// spdlog swallows what a sink throws, so the failure is kept for LogFileSink::flush.
  std::string take_error() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string e;
    if (!reported_) e.swap(error_);
    if (!e.empty()) reported_ = true;
    return e;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    const bool ok = std::fwrite(buf.data(), 1, buf.size(), f_) == buf.size();
    check(ok && std::fflush(f_) == 0);
  }
  void flush_() override { check(std::fflush(f_) == 0); }

 private:
  void check(bool ok) {
    if (ok || !error_.empty() || reported_) return;
    error_ = "cannot write '" + path_ + "': " + std::strerror(errno);
    std::clearerr(f_);
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  std::string error_;
  bool reported_ = false;
};
}  // namespace

LogFileSink::LogFileSink(const std::string& path) {
  sink_ = std::make_shared<FlushingFileSink>(path);
  sink_->set_level(spdlog::level::info);
  sink_->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  spdlog::default_logger()->sinks().push_back(sink_);
}

LogFileSink::~LogFileSink() {
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  try {
    sink_->flush();
  } catch (...) {
  }
}

void LogFileSink::flush() {
  sink_->flush();
  const std::string error = std::static_pointer_cast<FlushingFileSink>(sink_)->take_error();
  if (!error.empty()) throw IoError(error);
}

void LogFileSink::write_info(const std::string& line) {
  const spdlog::details::log_msg msg(spdlog::default_logger()->name(), spdlog::level::info, line);
  sink_->log(msg);
}

}  // namespace mpx
