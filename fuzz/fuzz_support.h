// SPDX-License-Identifier: MIT
// Shared by the libFuzzer targets (docs/testing.md, "Fuzzing"): the contract
// check, a scratch folder for the readers that take a path, and the memory
// meter that holds every reader to what its input justifies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mpx::fuzz {

/// Prints "contract broken: <what>" and aborts (libFuzzer records the input).
[[noreturn]] void broken(const std::string& what);

/// Aborts unless `message` names `place` (the file or "--set"): every
/// rejection must say where the bad byte is.
void require_names(const std::string& message, const std::string& place);

/// A folder of its own under $TMPDIR (made once per process).
const std::string& scratch_dir();
/// Writes `size` bytes to scratch_dir()/name and returns the path.
std::string write_scratch(const std::string& name, const uint8_t* data, size_t size);

/// The peak of the heap bytes allocated between start() and stop() on top of
/// what was live at start(), measured by the sanitizer allocator's hooks. The
/// targets allow a fixed 4 MiB for I/O buffers (the data readers read in 1 MiB
/// chunks) plus a multiple of the input's size.
class MemoryMeter {
 public:
  void start();
  /// Stops and aborts when the peak exceeded `budget` bytes (`what` names the reader).
  void stop_and_check(uint64_t budget, const char* what);
};

}  // namespace mpx::fuzz
