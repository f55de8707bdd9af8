// SPDX-License-Identifier: MIT
// Run directory helpers: naming, creation, atomic writes, the train.log sink.
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
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

#include "core/error.h"

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
void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems refuse to open folders
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

namespace {
/// ".<name>.tmp.<digits>": write_file_atomic's temporary name.
bool is_temp_name(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (name.size() < 2 || name[0] != '.' || at == std::string::npos || at == 0 || at + 5 >= name.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(),
                     [](char ch) { return ch >= '0' && ch <= '9'; });
}
}  // namespace

std::vector<std::string> remove_orphan_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  for (const fs::path& folder : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_ec;
      if (!is_temp_name(name) || !it->is_regular_file(type_ec)) continue;
      if (fs::remove(it->path(), type_ec)) removed.push_back(it->path().string());
    }
  }
  return removed;
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const fs::path target(path);
  const fs::path folder = target.parent_path();
  const fs::path tmp = folder / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  // Every failure names the file the user asked for first, then the temporary one.
  auto fail = [&](const char* what, int err) {
    return IoError(fmt::format("cannot {} '{}' (through its temporary file '{}'): {}", what, path, tmp.string(),
                               std::strerror(err)));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw fail("write", errno);
  try {
    write(f);
    if (std::fflush(f) != 0 || std::ferror(f)) throw fail("write", errno);
    if (::fsync(::fileno(f)) != 0) throw fail("fsync", errno);
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw fail("close", err);
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw fail("rename into place", err);
  }
  fsync_dir(folder);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_file_atomic(path, [&](std::FILE* f) {
    if (!contents.empty() && std::fwrite(contents.data(), 1, contents.size(), f) != contents.size())
      throw IoError("cannot write '" + path + "': " + std::strerror(errno));
  });
}

namespace {
/// train.log: appends each formatted line and flushes it, so the file is current
/// while the run goes on (and complete after a crash).
class FlushingFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit FlushingFileSink(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "ab");
    if (!f_) throw IoError("cannot open the log file '" + path + "': " + std::strerror(errno));
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
