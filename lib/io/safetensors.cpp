// SPDX-License-Identifier: MIT
// safetensors reader (validating every header field against the file before a
// byte of data is touched) and writer (format in safetensors.h). Tensor data is
// copied as raw bytes: mpx runs on little-endian hosts only (x86-64, aarch64).
#include "io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "io/run_dir.h"

namespace mpx {

namespace {

/// Headers above this are refused (the reference implementation's limit).
constexpr uint64_t kMaxHeader = 100ull << 20;
/// No tensor of a real file has more elements; keeps the size arithmetic far from overflow.
constexpr int64_t kMaxNumel = int64_t{1} << 48;

[[noreturn]] void bad(const std::string& source, const std::string& msg) {
  throw ConfigError(fmt::format("{}: not a valid safetensors file: {}", source, msg));
}

[[noreturn]] void bad_tensor(const std::string& source, const std::string& name, const std::string& msg) {
  throw ConfigError(fmt::format("{}: not a valid safetensors file: tensor '{}': {}", source, name, msg));
}

/// A JSON number that is a non-negative integer (not 3.0, not -1, not "3").
bool as_u64(const nlohmann::json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Entry read_entry(const std::string& source, const std::string& name, const nlohmann::json& v, uint64_t data_size) {
  Entry e;
  e.name = name;
  if (!v.is_object()) bad_tensor(source, name, fmt::format("expected an object, got {}", v.dump()));
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      bad_tensor(source, name, fmt::format("unknown key '{}' (expected dtype, shape, data_offsets)", it.key()));
  const auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) bad_tensor(source, name, "missing or non-string 'dtype'");
  e.dtype = dt->get<std::string>();
  const size_t es = st_dtype_size(e.dtype);
  if (es == 0) bad_tensor(source, name, fmt::format("unknown dtype '{}'", e.dtype));

  const auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) bad_tensor(source, name, "missing 'shape' (a list of integers)");
  int64_t numel = 1;
  for (const auto& d : *sh) {
    uint64_t n = 0;
    if (!as_u64(d, n)) bad_tensor(source, name, fmt::format("shape {} holds {}, not a non-negative integer", sh->dump(), d.dump()));
    if (n > static_cast<uint64_t>(kMaxNumel) || (n > 0 && numel > kMaxNumel / static_cast<int64_t>(n)))
      bad_tensor(source, name, fmt::format("shape {} is too large", sh->dump()));
    numel *= static_cast<int64_t>(n);
    e.shape.push_back(static_cast<int64_t>(n));
  }

  const auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], e.begin) ||
      !as_u64((*off)[1], e.end))
    bad_tensor(source, name, "missing or malformed 'data_offsets' (expected [begin, end], two non-negative integers)");
  if (e.end < e.begin)
    bad_tensor(source, name, fmt::format("data_offsets [{}, {}] end before they begin", e.begin, e.end));
  if (e.end > data_size)
    bad_tensor(source, name,
               fmt::format("data_offsets [{}, {}] reach beyond the data section ({} bytes): the file is truncated "
                           "or the header is wrong",
                           e.begin, e.end, data_size));
  const uint64_t need = static_cast<uint64_t>(numel) * es;
  if (e.end - e.begin != need)
    bad_tensor(source, name,
               fmt::format("data_offsets [{}, {}] cover {} bytes, but {} {} needs {}", e.begin, e.end,
                           e.end - e.begin, e.dtype, shape_str(e.shape), need));
  return e;
}

}  // namespace

// ---- small helpers ------------------------------------------------------------

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const StTensor* StFile::find(const std::string& name) const {
  for (const StTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

size_t st_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
  }
  return "?";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- reader ---------------------------------------------------------------------

namespace {

/// A validated header: the metadata and the tensors in data order, tiling the
/// `data_size` bytes of the data section exactly.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;  // sorted by offset
};

/// The 8-byte length prefix, checked against the file size before anything is allocated.
uint64_t header_length(const unsigned char* p8, uint64_t file_size, const std::string& source) {
  if (file_size < 8)
    bad(source, fmt::format("the file has {} bytes, fewer than the 8-byte header length", file_size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p8[i];
  const uint64_t rest = file_size - 8;
  if (n > rest)
    bad(source, fmt::format("the header length {} is larger than the rest of the file ({} bytes): truncated or not "
                            "a safetensors file",
                            n, rest));
  if (n > kMaxHeader) bad(source, fmt::format("the header length {} exceeds the limit of {} bytes", n, kMaxHeader));
  if (n < 2) bad(source, fmt::format("the header length {} is too small for a JSON object", n));
  return n;
}

Header parse_header(const char* text, uint64_t n, uint64_t data_size, const std::string& source) {
  nlohmann::ordered_json h;
  try {
    h = nlohmann::ordered_json::parse(text, text + n);
  } catch (const nlohmann::json::exception& e) {
    bad(source, fmt::format("the header is not valid JSON ({})", e.what()));
  }
  if (!h.is_object()) bad(source, "the header is not a JSON object");

  Header out;
  std::vector<Entry>& entries = out.entries;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad(source, "__metadata__ is not an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          bad(source, fmt::format("__metadata__ value of '{}' is not a string: {}", m.key(), m.value().dump()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(read_entry(source, it.key(), it.value(), data_size));
  }

  // The tensors must tile the data section: sorted by begin, each starts where the last ended.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < pos)
      bad_tensor(source, e.name,
                 fmt::format("data_offsets [{}, {}] overlap those of tensor '{}' [{}, {}]", e.begin, e.end,
                             prev->name, prev->begin, prev->end));
    if (e.begin > pos)
      bad_tensor(source, e.name,
                 fmt::format("data_offsets [{}, {}] leave bytes [{}, {}) of the data section unused{}", e.begin,
                             e.end, pos, e.begin, prev ? " after tensor '" + prev->name + "'" : std::string()));
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size) {
    if (prev == nullptr)
      bad(source, fmt::format("the header lists no tensors but the data section has {} bytes", data_size));
    bad_tensor(source, prev->name,
               fmt::format("the data section has {} bytes but the tensors end at byte {} (this, the last tensor, "
                           "ends there): the header does not cover the data",
                           data_size, pos));
  }
  return out;
}

StTensor tensor_of(const Entry& e) {
  StTensor t;
  t.name = e.name;
  t.dtype = e.dtype;
  t.shape = e.shape;
  return t;
}

}  // namespace

StFile parse_safetensors(const std::string& bytes, const std::string& source) {
  const uint64_t n = header_length(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), source);
  Header h = parse_header(bytes.data() + 8, n, bytes.size() - 8 - n, source);
  StFile f;
  f.metadata = std::move(h.metadata);
  const size_t base = 8 + static_cast<size_t>(n);
  for (const Entry& e : h.entries) {
    StTensor t = tensor_of(e);
    t.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(base + e.begin),
                   bytes.begin() + static_cast<std::ptrdiff_t>(base + e.end));
    f.tensors.push_back(std::move(t));
  }
  return f;
}

StFile read_safetensors(const std::string& path) {
  // The header is read and validated against the file size first; the tensor
  // data (which the validated offsets tile exactly) only then, tensor by tensor.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format("{}: cannot read weights file: not a regular file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot open weights file: {}", path, std::strerror(errno)));
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw ConfigError(fmt::format("{}: cannot read weights file: {}", path, ec.message()));
  const auto read_at = [&](uint64_t offset, void* dst, uint64_t count) {
    in.seekg(static_cast<std::streamoff>(offset));
    if (count > 0 && !in.read(static_cast<char*>(dst), static_cast<std::streamsize>(count)))
      throw ConfigError(fmt::format("{}: cannot read weights file at byte offset {}: {}", path, offset,
                                    errno ? std::strerror(errno) : "the file changed while it was read"));
  };
  unsigned char prefix[8] = {};
  read_at(0, prefix, std::min<uint64_t>(size, 8));
  const uint64_t n = header_length(prefix, size, path);
  std::string text(static_cast<size_t>(n), '\0');
  read_at(8, text.data(), n);
  Header h = parse_header(text.data(), n, size - 8 - n, path);
  StFile f;
  f.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {
    StTensor t = tensor_of(e);
    t.bytes.resize(static_cast<size_t>(e.end - e.begin));
    read_at(8 + n + e.begin, t.bytes.data(), t.bytes.size());
    f.tensors.push_back(std::move(t));
  }
  return f;
}

// ---- writer ---------------------------------------------------------------------

std::string serialize_safetensors(const StFile& f) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!f.metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : f.metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t pos = 0;
  for (const StTensor& t : f.tensors) {
    const size_t es = st_dtype_size(t.dtype);
    MPX_CHECK_MSG(es != 0, "safetensors: unknown dtype " + t.dtype);
    MPX_CHECK_MSG(t.name != "__metadata__" && !h.contains(t.name), "safetensors: duplicate tensor name " + t.name);
    MPX_CHECK_MSG(static_cast<uint64_t>(t.numel()) * es == t.bytes.size(),
                  fmt::format("safetensors: tensor {} has {} bytes, {} {} needs {}", t.name, t.bytes.size(), t.dtype,
                              shape_str(t.shape), static_cast<uint64_t>(t.numel()) * es));
    nlohmann::ordered_json e;
    e["dtype"] = t.dtype;
    e["shape"] = t.shape;
    e["data_offsets"] = {pos, pos + t.bytes.size()};
    h[t.name] = e;
    pos += t.bytes.size();
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + header.size() + pos);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  for (const StTensor& t : f.tensors) out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  return out;
}

void write_safetensors(const std::string& path, const StFile& f) { write_file_atomic(path, serialize_safetensors(f)); }

// ---- conversions ----------------------------------------------------------------

StTensor make_st_tensor(const std::string& name, DType t, const std::vector<int64_t>& shape, const void* data) {
  StTensor s;
  s.name = name;
  s.dtype = st_dtype_name(t);
  s.shape = shape;
  const size_t bytes = static_cast<size_t>(s.numel()) * dtype_size(t);
  s.bytes.resize(bytes);
  if (bytes > 0) std::memcpy(s.bytes.data(), data, bytes);
  return s;
}

std::vector<float> st_to_float32(const StTensor& t, const std::string& source) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  DType from;
  if (t.dtype == "F32") from = DType::F32;
  else if (t.dtype == "F16") from = DType::F16;
  else if (t.dtype == "BF16") from = DType::BF16;
  else
    throw ConfigError(fmt::format("{}: tensor '{}' has dtype {}; mpx reads F32, F16 and BF16 weights (convert it, "
                                  "e.g. with .astype(numpy.float32) or .float())",
                                  source, t.name, t.dtype));
  MPX_CHECK(t.bytes.size() == n * dtype_size(from));
  if (n > 0) convert(t.bytes.data(), from, out.data(), DType::F32, n);
  return out;
}

}  // namespace mpx
