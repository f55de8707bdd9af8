// SPDX-License-Identifier: MIT
// Non-blocking opening of input files (input_file.h).
#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mpx {

std::string file_kind_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

InputFile::InputFile(const std::string& path) {
  // O_NONBLOCK: open() of a FIFO returns at once even when no process writes to it.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) {
    err_ = errno;
    error_ = std::strerror(err_);
    return;
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    err_ = errno;
    error_ = std::strerror(err_);
    ::close(fd_);
    fd_ = -1;
    return;
  }
  mode_ = st.st_mode;
  if (S_ISREG(mode_)) size_ = static_cast<uint64_t>(st.st_size);
  // Reads block again (a pipe's writer may be slower than mpx); fifo_without_writer() and
  // read() poll where it matters.
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputFile::regular() const { return fd_ >= 0 && S_ISREG(mode_); }
bool InputFile::fifo() const { return fd_ >= 0 && S_ISFIFO(mode_); }
bool InputFile::char_device() const { return fd_ >= 0 && S_ISCHR(mode_); }
uint64_t InputFile::size() const { return size_; }
std::string InputFile::kind() const { return file_kind_name(mode_); }

bool InputFile::fifo_without_writer() {
  if (!fifo() || pending_ >= 0) return false;
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) != 0) return false;
  unsigned char c = 0;
  ssize_t r;
  do r = ::read(fd_, &c, 1);
  while (r < 0 && errno == EINTR);
  const int err = errno;
  (void)::fcntl(fd_, F_SETFL, flags);
  if (r == 1) pending_ = c;
  // 0: the end of the file at once, so no writer and no data; EAGAIN: a writer, no data yet.
  return r == 0 || (r < 0 && err != EAGAIN && err != EWOULDBLOCK);
}

int64_t InputFile::read(void* dst, uint64_t n) {
  auto* p = static_cast<unsigned char*>(dst);
  uint64_t got = 0;
  if (n > 0 && pending_ >= 0) {
    p[got++] = static_cast<unsigned char>(pending_);
    pending_ = -1;
  }
  while (got < n) {
    const ssize_t r = ::read(fd_, p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return static_cast<int64_t>(got);
}

}  // namespace mpx
