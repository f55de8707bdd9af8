// SPDX-License-Identifier: MIT
// TensorBoard's event-file format, written by hand (docs/report.md explains why
// not protobuf): records framed with a length and masked CRC32C checksums, each
// holding one Event message with a wall time, a step and a Summary of scalar
// values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mpx {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI and TFRecord use it.
uint32_t crc32c(const void* data, size_t n);
/// The "masked" CRC of TFRecord framing: rotate right by 15, add 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

/// One scalar of a Summary: a tag and a float32 value (TensorBoard's simple_value).
using Scalar = std::pair<std::string, float>;

/// The bytes of an Event message {wall_time, step, summary {value {tag, simple_value}}...}.
std::string encode_scalar_event(double wall_time, int64_t step, const std::vector<Scalar>& values);
/// The bytes of the Event that opens every file: {wall_time, step 0, file_version "brain.Event:2"}.
std::string encode_version_event(double wall_time);
/// One TFRecord: uint64 length, masked CRC of the length, the data, masked CRC of the data.
std::string frame_record(const std::string& data);

/// @brief Appends framed events to one new file, flushed per event. Throws IoError
/// naming the file when it cannot be created or written.
class EventFileWriter {
 public:
  /// Creates a new `events.out.tfevents.<seconds>.<host>.<pid>` file in `dir` (created
  /// when missing) and writes the version event.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  void write_scalars(int64_t step, const std::vector<Scalar>& values);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::FILE* f_ = nullptr;
  std::string path_;
};

/// Seconds since the Unix epoch, as the Event's wall_time.
double unix_seconds();

}  // namespace mpx
