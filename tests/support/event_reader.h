// SPDX-License-Identifier: MIT
// An independent reader of TensorBoard event files for the tests: TFRecord
// framing with both masked CRC32C checks (a bitwise CRC, not the product's
// table), and a generic protobuf decoder of Event { wall_time, step,
// file_version, summary { value { tag, simple_value } } }.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace support {

inline uint32_t bitwise_crc32c(const std::string& s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline uint32_t bitwise_masked_crc32c(const std::string& s) {
  const uint32_t c = bitwise_crc32c(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct TbValue {
  std::string tag;
  float value = 0;
};

struct TbEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<TbValue> values;
  /// The value of `tag`; REQUIREs that it is there once.
  float get(const std::string& tag) const {
    const TbValue* found = nullptr;
    for (const auto& v : values)
      if (v.tag == tag) {
        REQUIRE(found == nullptr);
        found = &v;
      }
    INFO("tag " << tag << " at step " << step);
    REQUIRE(found != nullptr);
    return found->value;
  }
};

/// A protobuf message as a list of (field number, wire type, payload bytes or integer).
struct PbField {
  uint32_t field = 0, wire = 0;
  uint64_t u = 0;     // varint / fixed64 / fixed32
  std::string bytes;  // length-delimited
};

inline uint64_t pb_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    REQUIRE(i < s.size());
    const auto b = static_cast<unsigned char>(s[i++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  FAIL("varint longer than 10 bytes");
  return 0;
}

inline std::vector<PbField> pb_fields(const std::string& s) {
  std::vector<PbField> out;
  size_t i = 0;
  while (i < s.size()) {
    const uint64_t key = pb_varint(s, i);
    PbField f;
    f.field = static_cast<uint32_t>(key >> 3), f.wire = static_cast<uint32_t>(key & 7);
    if (f.wire == 0) {
      f.u = pb_varint(s, i);
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      REQUIRE(i + n <= s.size());
      for (size_t k = 0; k < n; ++k) f.u |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
      i += n;
    } else if (f.wire == 2) {
      const uint64_t n = pb_varint(s, i);
      REQUIRE(i + n <= s.size());
      f.bytes = s.substr(i, n);
      i += n;
    } else {
      FAIL("unexpected protobuf wire type " << f.wire);
    }
    out.push_back(std::move(f));
  }
  return out;
}

inline TbEvent decode_event(const std::string& data) {
  TbEvent e;
  for (const auto& f : pb_fields(data)) {
    if (f.field == 1 && f.wire == 1) std::memcpy(&e.wall_time, &f.u, 8);
    else if (f.field == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.u);
    else if (f.field == 3 && f.wire == 2) e.file_version = f.bytes;
    else if (f.field == 5 && f.wire == 2) {
      for (const auto& v : pb_fields(f.bytes)) {
        REQUIRE(v.field == 1);
        TbValue tv;
        for (const auto& g : pb_fields(v.bytes)) {
          if (g.field == 1 && g.wire == 2) tv.tag = g.bytes;
          else if (g.field == 2 && g.wire == 5) {
            const auto bits = static_cast<uint32_t>(g.u);
            std::memcpy(&tv.value, &bits, 4);
          } else FAIL("unexpected Summary.Value field " << g.field);
        }
        e.values.push_back(tv);
      }
    } else {
      FAIL("unexpected Event field " << f.field);
    }
  }
  return e;
}

/// Every event of one file; REQUIREs the framing and both CRCs of every record.
inline std::vector<TbEvent> read_event_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::vector<TbEvent> events;
  size_t i = 0;
  while (i < s.size()) {
    INFO(p.string() << " at byte " << i);
    REQUIRE(i + 12 <= s.size());
    const std::string len_bytes = s.substr(i, 8);
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, len_bytes.data(), 8);
    std::memcpy(&len_crc, s.data() + i + 8, 4);
    REQUIRE(len_crc == bitwise_masked_crc32c(len_bytes));
    REQUIRE(i + 12 + len + 4 <= s.size());
    const std::string data = s.substr(i + 12, len);
    std::memcpy(&data_crc, s.data() + i + 12 + len, 4);
    REQUIRE(data_crc == bitwise_masked_crc32c(data));
    events.push_back(decode_event(data));
    i += 12 + len + 4;
  }
  return events;
}

/// The event files of a folder, in name order (the order TensorBoard reads them).
inline std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> v;
  if (!std::filesystem::is_directory(dir)) return v;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace support
