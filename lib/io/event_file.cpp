// SPDX-License-Identifier: MIT
// TensorBoard event files (event_file.h): a protobuf encoder of the few Event
// and Summary fields mpx writes, and the TFRecord framing (docs/report.md).
#include "io/event_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mpx {

namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

// ---- protobuf wire format: just what Event and Summary need ----
// Field keys are (field number << 3) | wire type: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <class T>
void put_le(std::string& out, T v) {  // fixed32 / fixed64, little-endian
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, (field << 3) | wire); }

void put_bytes(std::string& out, uint32_t field, const std::string& s) {
  put_key(out, field, 2);
  put_varint(out, s.size());
  out += s;
}

void put_double(std::string& out, uint32_t field, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  put_key(out, field, 1);
  put_le(out, bits);
}

void put_float(std::string& out, uint32_t field, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  put_key(out, field, 5);
  put_le(out, bits);
}

// Event: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary).
// Summary: 1 value (repeated Value). Value: 1 tag (string), 2 simple_value (float).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  if (step != 0) {  // proto3: a zero scalar is not written
    put_key(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::vector<Scalar>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, 1, tag);
    put_float(value, 2, v);
    put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string encode_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string frame_record(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  std::string len_bytes;
  put_le(len_bytes, len);
  r += len_bytes;
  put_le(r, masked_crc32c(len_bytes.data(), len_bytes.size()));
  r += data;
  put_le(r, masked_crc32c(data.data(), data.size()));
  return r;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create the TensorBoard folder '{}': {}", dir, ec.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto secs = static_cast<int64_t>(unix_seconds());
  // A new file per writer: a resumed run adds one beside the first (TensorBoard reads them all).
  for (int n = 0; n < 100 && !f_; ++n) {
    path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}{}", dir, secs, host, ::getpid(),
                        n ? fmt::format(".{}", n) : std::string());
    f_ = std::fopen(path_.c_str(), "wbx");  // x: never reuse an existing file
    if (!f_ && errno != EEXIST) break;
  }
  if (!f_) throw IoError(fmt::format("cannot create '{}': {}", path_, std::strerror(errno)));
  write_event(encode_version_event(unix_seconds()));
}

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

void EventFileWriter::write_scalars(int64_t step, const std::vector<Scalar>& values) {
  write_event(encode_scalar_event(unix_seconds(), step, values));
}

void EventFileWriter::write_event(const std::string& event) {
  const std::string rec = frame_record(event);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw IoError(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
}

}  // namespace mpx
