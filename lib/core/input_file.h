// SPDX-License-Identifier: MIT
// Opening the files mpx reads without ever blocking in open(): a FIFO that no
// process writes to would otherwise hang the command before any limit or
// signal could act. Each reader then decides from the file's type whether it
// takes a stream (a pipe, a character device) or only a regular file
// (docs/inputs.md, "Files that are not regular files").
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace mpx {

/// @brief An input file opened read-only with O_NONBLOCK (then switched back to
/// blocking reads) and its fstat() type. Closes the descriptor when destroyed.
class InputFile {
 public:
  /// Opens `path`; on failure fd() is -1 and error() holds strerror(errno) (and errno_value()).
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  int errno_value() const { return err_; }
  const std::string& error() const { return error_; }
  bool regular() const;
  bool fifo() const;
  bool char_device() const;
  /// The size of a regular file (0 for anything else).
  uint64_t size() const;
  /// "a FIFO", "a character device", "a directory", ... for messages ("a regular file" too).
  std::string kind() const;

  /// Up to `n` bytes into `dst`; fewer only at the end of the file. For a FIFO or pipe
  /// this waits for data (a stop signal ends the command meanwhile, docs/design.md,
  /// "Signals"). Returns -1 with errno on a read error.
  int64_t read(void* dst, uint64_t n);

  /// For a FIFO or pipe: whether no process has it open for writing and it holds no
  /// data, checked without blocking (the first read would see only its end).
  bool fifo_without_writer();

 private:
  int fd_ = -1;
  int err_ = 0;
  std::string error_;
  mode_t mode_ = 0;
  uint64_t size_ = 0;
  int pending_ = -1;  // a byte read by fifo_without_writer(), handed out by the next read()
};

/// "a FIFO", "a character device", "a block device", "a socket", "a directory", "a regular file".
std::string file_kind_name(mode_t mode);

}  // namespace mpx
