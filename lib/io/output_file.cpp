// SPDX-License-Identifier: MIT
// Output files (output_file.h): atomic replacement, special files, temporary files.
#include "io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/input_file.h"

namespace fs = std::filesystem;

namespace mpx {

namespace {
void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems refuse to open folders
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

bool is_atomic_temp_name(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (name.size() < 2 || name[0] != '.' || at == std::string::npos || at == 0 || at + 5 >= name.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(at + 5), name.end(),
                     [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::vector<std::string> remove_orphan_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  for (const fs::path& folder : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_ec;
      if (!is_atomic_temp_name(name) || !it->is_regular_file(type_ec)) continue;
      if (fs::remove(it->path(), type_ec)) removed.push_back(it->path().string());
    }
  }
  return removed;
}

namespace {

/// The temporary files being written now, for remove_temp_files_in_progress().
std::mutex& temp_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& temps_in_progress() {
  static std::vector<std::string> v;
  return v;
}

struct TempRegistration {
  std::string path;
  explicit TempRegistration(std::string p) : path(std::move(p)) {
    std::lock_guard<std::mutex> lock(temp_mutex());
    temps_in_progress().push_back(path);
  }
  ~TempRegistration() {
    std::lock_guard<std::mutex> lock(temp_mutex());
    auto& v = temps_in_progress();
    v.erase(std::remove(v.begin(), v.end(), path), v.end());
  }
};

/// Temporary file in the same folder, flushed, fsync'ed and renamed over `target`.
void replace_atomically(const std::string& path, const fs::path& target,
                        const std::function<void(std::FILE*)>& write) {
  const fs::path folder = target.parent_path();
  const fs::path tmp = folder / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  // Every failure names the file the user asked for first, then the temporary one.
  auto fail = [&](const char* what, int err) {
    return IoError(fmt::format("cannot {} '{}' (through its temporary file '{}'): {}", what, path, tmp.string(),
                               std::strerror(err)));
  };
  const TempRegistration registered(tmp.string());
  std::FILE* f = std::fopen(tmp.c_str(), "wbx");  // x: never write through a file planted under that name
  if (!f && errno == EEXIST && std::remove(tmp.c_str()) == 0) f = std::fopen(tmp.c_str(), "wbx");
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

/// Writes into an open descriptor front to back (a FIFO, a character device, standard
/// output): nothing is created, truncated or renamed. Closes `fd`.
void stream_into(int fd, const std::string& shown, const std::function<void(std::FILE*)>& write) {
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    throw IoError(fmt::format("cannot write '{}': {}", shown, std::strerror(err)));
  }
  try {
    write(f);
    if (std::fflush(f) != 0 || std::ferror(f))
      throw IoError(fmt::format("cannot write '{}': {}", shown, std::strerror(errno)));
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw IoError(fmt::format("cannot write '{}': {}", shown, std::strerror(errno)));
}

bool names_stdout(const std::string& path) {
  return path == "-" || path == "/dev/stdout" || path == "/dev/fd/1" || path == "/proc/self/fd/1";
}

}  // namespace

OutputKind output_kind(const std::string& path) {
  if (names_stdout(path)) return OutputKind::Stream;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? OutputKind::Replace : OutputKind::Refused;
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return OutputKind::Stream;
  if (!S_ISREG(st.st_mode)) return OutputKind::Refused;
  // A regular file reached through /dev or /proc (/dev/fd/N, /proc/self/fd/N: the open file of
  // a descriptor, e.g. a redirect) is written in place: there is no folder to rename in.
  const auto under_fd_folders = [](const fs::path& p) {
    const std::string s = p.lexically_normal().string();
    return s.rfind("/proc/", 0) == 0 || s.rfind("/dev/", 0) == 0;
  };
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  if (!ec && under_fd_folders(abs)) return OutputKind::Stream;
  const fs::path link = fs::read_symlink(path, ec);
  if (!ec && under_fd_folders(link)) return OutputKind::Stream;
  return OutputKind::Replace;
}

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write) {
  if (names_stdout(path)) {
    std::fflush(stdout);  // what std::cout or printf buffered goes first
    const int fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) throw IoError(fmt::format("cannot write '{}' (standard output): {}", path, std::strerror(errno)));
    stream_into(fd, path == "-" ? std::string("standard output") : path, write);
    return;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) throw IoError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    replace_atomically(path, fs::path(path), write);  // a new file
    return;
  }
  if (S_ISDIR(st.st_mode))
    throw IoError(fmt::format("cannot write '{}': it is a folder; give a file name", path));
  switch (output_kind(path)) {
    case OutputKind::Replace:
      // A symbolic link to a regular file is itself replaced: what it pointed to, perhaps
      // outside the folder, is left as it was.
      replace_atomically(path, fs::path(path), write);
      return;
    case OutputKind::Stream: {
      // O_NONBLOCK: a FIFO that nobody reads fails at once (ENXIO) instead of hanging open().
      const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
      if (fd < 0) {
        if (errno == ENXIO && S_ISFIFO(st.st_mode))
          throw IoError(fmt::format("cannot write '{}': it is a FIFO (named pipe) that no process reads from; start "
                                    "its reader first, or give a file",
                                    path));
        throw IoError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
      }
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      stream_into(fd, path, write);
      return;
    }
    case OutputKind::Refused:
      break;
  }
  throw IoError(fmt::format("cannot write '{}': it is {}; mpx writes regular files, and streams into FIFOs and "
                            "character devices, but never replaces or writes over anything else",
                            path, file_kind_name(st.st_mode)));
}

std::FILE* open_for_writing(const std::string& path, bool append) {
  // O_NONBLOCK: a FIFO that nobody reads fails at once (ENXIO) instead of hanging open().
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK |
                                          (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
    ::close(fd);
    errno = EINVAL;  // a block device: never written
    return nullptr;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::FILE* f = ::fdopen(fd, append ? "ab" : "wb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    errno = err;
  }
  return f;
}

std::string open_for_writing_error(int err) {
  if (err == ENXIO) return "it is a FIFO (named pipe) that no process reads from";
  if (err == EINVAL) return "it is a block device; mpx never writes one";
  return std::strerror(err);
}

void remove_temp_files_in_progress() {
  std::unique_lock<std::mutex> lock(temp_mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (const auto& p : temps_in_progress()) ::unlink(p.c_str());
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_file_atomic(path, [&](std::FILE* f) {
    if (!contents.empty() && std::fwrite(contents.data(), 1, contents.size(), f) != contents.size())
      throw IoError("cannot write '" + path + "': " + std::strerror(errno));
  });
}

}  // namespace mpx
