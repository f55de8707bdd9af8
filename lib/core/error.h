// SPDX-License-Identifier: MIT
// The error types of mpx. Each carries the process exit code of docs/design.md so
// that app/main.cpp reports every failure in one place with the right code.
#pragma once

#include <stdexcept>
#include <string>

namespace mpx {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,
  kExitUsage = 2,        // bad command line or configuration
  kExitData = 3,         // data missing or corrupt
  kExitDiverged = 4,     // training diverged
  kExitOutOfMemory = 5,  // out of device memory
  kExitIo = 6,           // an output file could not be written (disk full, read-only, not a folder)
  kExitInterrupted = 130,
};

/// @brief Base of all mpx errors; what() is the full user-facing message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, int exit_code = kExitInternal)
      : std::runtime_error(msg), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

/// @brief Bad configuration or command line (exit 2).
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& msg) : Error(msg, kExitUsage) {}
};

/// @brief Data set files missing or corrupt (exit 3).
class DataError : public Error {
 public:
  explicit DataError(const std::string& msg) : Error(msg, kExitData) {}
};

/// @brief Training diverged: non-finite float32 loss, too many skipped steps (exit 4).
class DivergedError : public Error {
 public:
  explicit DivergedError(const std::string& msg) : Error(msg, kExitDiverged) {}
};

/// @brief A device allocation failed (exit 5).
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& msg) : Error(msg, kExitOutOfMemory) {}
};

/// @brief A run file, checkpoint or export could not be written (exit 6); the message
/// names the file and the system's reason.
class IoError : public Error {
 public:
  explicit IoError(const std::string& msg) : Error(msg, kExitIo) {}
};

/// @brief SIGINT/SIGTERM arrived; thrown after the state was saved (exit 130).
class InterruptedError : public Error {
 public:
  explicit InterruptedError(const std::string& msg) : Error(msg, kExitInterrupted) {}
};

/// @brief A CUDA, cuDNN, cuBLAS or NCCL call failed (exit 1).
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& msg) : Error(msg, kExitInternal) {}
};

[[noreturn]] void throw_check_failed(const char* cond, const char* file, int line,
                                     const std::string& msg);

}  // namespace mpx

/// Always-on invariant check (not compiled out in Release): throws mpx::Error
/// with the condition text, file and line.
#define MPX_CHECK(cond)                                                  \
  do {                                                                   \
    if (!(cond)) ::mpx::throw_check_failed(#cond, __FILE__, __LINE__, ""); \
  } while (0)

#define MPX_CHECK_MSG(cond, msg)                                            \
  do {                                                                      \
    if (!(cond)) ::mpx::throw_check_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
