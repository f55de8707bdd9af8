// SPDX-License-Identifier: MIT
// Reading run directories for `mpx report` (run_data.h).
#include "report/run_data.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "config/yaml_tree.h"
#include "core/error.h"
#include "core/input_file.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mpx::report {

namespace {

bool has_run_files(const fs::path& d) {
  std::error_code ec;
  return fs::is_regular_file(d / "summary.json", ec) || fs::is_regular_file(d / "metrics.jsonl", ec) ||
         fs::is_regular_file(d / "config.yaml", ec);
}

/// A run file as text, at most `limit` bytes: a regular file only, opened without blocking
/// (a FIFO planted in a run directory must not hang the report). Returns false when the file
/// does not exist; a file that is not regular or is too large is a DataError naming it.
bool read_run_file(const fs::path& p, size_t limit, std::string& text) {
  InputFile in(p.string());
  if (!in.ok()) {
    if (in.errno_value() == ENOENT) return false;
    throw DataError(fmt::format("{}: cannot open: {}", p.string(), in.error()));
  }
  if (!in.regular())
    throw DataError(fmt::format("{}: it is {}, not a regular file: mpx report reads only the files mpx train "
                                "writes (remove it, or leave this folder out)",
                                p.string(), in.kind()));
  if (in.size() > limit)
    throw DataError(fmt::format("{}: {} bytes, more than the {} bytes mpx report reads of this file "
                                "(docs/inputs.md, \"Run directories\")",
                                p.string(), in.size(), limit));
  text.assign(static_cast<size_t>(in.size()), '\0');
  const int64_t got = in.read(text.data(), text.size());
  if (got < 0) throw DataError(fmt::format("{}: cannot read: {}", p.string(), std::strerror(errno)));
  text.resize(static_cast<size_t>(got));
  return true;
}

/// Whether JSON text nests deeper than `max` arrays and objects (strings skipped):
/// such text is refused before nlohmann::json parses it.
bool nests_deeper_than(const std::string& s, int max) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

/// "a.b" / "a[2].b" paths to the scalar text; a list of scalars stays one value ("[1, 2]").
void flatten(const config_detail::YNode& n, const std::string& key,
             std::vector<std::pair<std::string, std::string>>& out) {
  if (n.is_map()) {
    for (size_t i = 0; i < n.keys.size(); ++i)
      flatten(n.children[i], key.empty() ? n.keys[i] : key + "." + n.keys[i], out);
  } else if (n.is_seq()) {
    const bool scalars = std::all_of(n.children.begin(), n.children.end(),
                                     [](const config_detail::YNode& e) { return e.is_scalar(); });
    if (scalars) {
      std::string s = "[";
      for (size_t i = 0; i < n.children.size(); ++i) s += (i ? ", " : "") + n.children[i].scalar;
      out.emplace_back(key, s + "]");
    } else {
      for (size_t i = 0; i < n.children.size(); ++i) flatten(n.children[i], key + "[" + std::to_string(i) + "]", out);
    }
  } else if (n.is_scalar()) {
    out.emplace_back(key, n.scalar);
  } else {
    out.emplace_back(key, "");
  }
}

/// The pid in .lock while another process holds it, else 0.
long lock_holder(const fs::path& d) {
  const fs::path p = d / ".lock";
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  long pid = 0;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    char buf[32] = {};
    if (::pread(fd, buf, sizeof buf - 1, 0) > 0) pid = std::atol(buf);
    if (pid == 0) pid = -1;
  }
  ::close(fd);
  return pid;
}

void read_summary(const fs::path& d, RunData& r) {
  const fs::path p = d / "summary.json";
  std::string text;
  if (read_run_file(p, kMaxSummaryBytes, text)) {
    try {
      if (nests_deeper_than(text, kMaxJsonDepth)) throw std::runtime_error("nested too deeply");
      r.summary = json::parse(text);
      if (!r.summary.is_object()) throw std::runtime_error("not a JSON object");
      r.status = r.summary.value("status", "unknown");
      r.message = r.summary.value("message", "");
      return;
    } catch (const std::exception& e) {
      r.summary = json::object();
      r.status = "unreadable";
      r.message = p.string() + ": " + e.what();
      return;
    }
  }
  if (const long pid = lock_holder(d)) {
    r.status = "running";
    r.message = pid > 0 ? "mpx train (pid " + std::to_string(pid) + ") is writing this run" : "a process holds .lock";
  } else {
    r.status = "incomplete";
    r.message = "no summary.json: the run was killed before it could write one";
  }
}

/// Keeps at most kMaxCurvePoints records of one kind, evenly spaced, and the last one:
/// every `stride`-th record is kept; when the kept ones pass the limit, every other one
/// is dropped and the stride doubles. Memory stays bounded whatever the count.
class Decimator {
 public:
  explicit Decimator(std::vector<json>& out) : out_(out) {}
  void add(json&& rec) {
    if (seen_++ % stride_ == 0) {
      out_.push_back(rec);
      if (out_.size() > kMaxCurvePoints) {
        size_t w = 0;
        for (size_t i = 0; i < out_.size(); i += 2) out_[w++] = std::move(out_[i]);
        out_.resize(w);
        stride_ *= 2;
      }
    }
    last_ = std::move(rec);
  }
  /// Appends the last record when the stride skipped it; returns how many were seen.
  size_t finish() {
    if (seen_ > 0 && (seen_ - 1) % stride_ != 0) out_.push_back(std::move(last_));
    return seen_;
  }

 private:
  std::vector<json>& out_;
  json last_;
  size_t seen_ = 0, stride_ = 1;
};

/// The fields a record keeps: numbers, booleans and nulls (what the curves and the table
/// read), at most kMaxRecordFields of them with short names.
json slim(const json& j) {
  json out = json::object();
  for (auto it = j.begin(); it != j.end() && out.size() < kMaxRecordFields; ++it)
    if (it.key().size() <= 64 && (it->is_number() || it->is_boolean() || it->is_null())) out[it.key()] = *it;
  return out;
}

/// metrics.jsonl in one pass, in blocks: a line longer than kMaxMetricsLine bytes is skipped
/// (counted as unreadable) without being held, and the records are decimated (Decimator).
void read_metrics(const fs::path& d, RunData& r) {
  const fs::path p = d / "metrics.jsonl";
  InputFile in(p.string());
  if (!in.ok()) {
    if (in.errno_value() == ENOENT) return;
    throw DataError(fmt::format("{}: cannot open: {}", p.string(), in.error()));
  }
  if (!in.regular())
    throw DataError(fmt::format("{}: it is {}, not a regular file: mpx report reads only the files mpx train "
                                "writes (remove it, or leave this folder out)",
                                p.string(), in.kind()));
  Decimator steps(r.steps), epochs(r.epochs);
  const auto take = [&](const std::string& line) {
    if (line.empty()) return;
    json j = nests_deeper_than(line, kMaxJsonDepth) ? json(json::value_t::discarded)
                                                     : json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++r.bad_metrics_lines;
      return;
    }
    const auto kind = j.find("kind");
    if (kind == j.end() || !kind->is_string()) return;
    if (*kind == "step") steps.add(slim(j));
    else if (*kind == "epoch") epochs.add(slim(j));
  };
  std::vector<char> block(size_t{1} << 16);
  std::string line;
  bool too_long = false;
  while (true) {
    const int64_t got = in.read(block.data(), block.size());
    if (got < 0) throw DataError(fmt::format("{}: cannot read: {}", p.string(), std::strerror(errno)));
    if (got == 0) break;
    const char* b = block.data();
    const char* e = b + got;
    while (b < e) {
      const char* nl = static_cast<const char*>(std::memchr(b, '\n', static_cast<size_t>(e - b)));
      const char* end = nl ? nl : e;
      if (!too_long) {
        if (line.size() + static_cast<size_t>(end - b) > kMaxMetricsLine) {
          too_long = true;
          line.clear();
          line.shrink_to_fit();
        } else {
          line.append(b, end);
        }
      }
      if (!nl) break;
      if (too_long) ++r.bad_metrics_lines;
      else take(line);
      line.clear();
      too_long = false;
      b = nl + 1;
    }
  }
  if (too_long) ++r.bad_metrics_lines;
  else take(line);
  r.step_records = steps.finish();
  r.epoch_records = epochs.finish();
}

}  // namespace

RunData load_run(const std::string& dir) {
  const fs::path d(dir);
  RunData r;
  r.dir = dir;
  r.name = d.filename().empty() ? d.parent_path().filename().string() : d.filename().string();
  read_summary(d, r);
  if (read_run_file(d / "config.yaml", config_detail::kMaxConfigBytes, r.config_text)) {
    try {
      // The config reader's YAML parser: its node, depth and text limits (docs/inputs.md).
      flatten(config_detail::parse_yaml_tree(r.config_text, (d / "config.yaml").string(), "", nullptr), "", r.config);
    } catch (const std::exception& e) {
      r.config.clear();
      r.config_text += "\n# (mpx report: this file does not parse: " + std::string(e.what()) + ")\n";
    }
  }
  read_metrics(d, r);
  return r;
}

Loaded load_runs(const std::vector<std::string>& dirs) {
  Loaded out;
  for (const auto& dir : dirs) {
    const fs::path d(dir);
    std::error_code ec;
    if (!fs::exists(d, ec)) {
      out.not_runs.push_back({dir, "does not exist"});
    } else if (!fs::is_directory(d, ec)) {
      out.not_runs.push_back({dir, "is not a folder"});
    } else if (has_run_files(d)) {
      out.runs.push_back(load_run(dir));
    } else {
      std::vector<std::string> subs;
      for (const auto& e : fs::directory_iterator(d, ec))
        if (e.is_directory() && has_run_files(e.path())) subs.push_back(e.path().string());
      std::sort(subs.begin(), subs.end());
      if (subs.empty())
        out.not_runs.push_back({dir, "not a run directory: no summary.json, metrics.jsonl or config.yaml, and no "
                                     "sub-folder that has them"});
      for (const auto& s : subs) out.runs.push_back(load_run(s));
    }
  }
  // Labels: the folder name, with its parent's name when two runs share it (compare folders).
  std::map<std::string, int> count;
  for (const auto& r : out.runs) ++count[r.name];
  for (auto& r : out.runs) {
    if (count[r.name] < 2) continue;
    const fs::path parent = fs::path(r.dir).lexically_normal().parent_path();
    if (!parent.filename().empty()) r.name = parent.filename().string() + "/" + r.name;
  }
  std::map<std::string, int> seen;
  for (auto& r : out.runs)
    if (seen[r.name]++ > 0) r.name += " (" + std::to_string(seen[r.name]) + ")";
  return out;
}

std::string config_value(const RunData& run, const std::string& key) {
  for (const auto& [k, v] : run.config)
    if (k == key) return v;
  return "";
}

std::vector<std::string> differing_keys(const std::vector<RunData>& runs) {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (const auto& r : runs)
    for (const auto& kv : r.config)
      if (seen.insert(kv.first).second) keys.push_back(kv.first);
  std::vector<std::string> out;
  for (const auto& k : keys) {
    std::set<std::string> values;
    bool missing = false;
    for (const auto& r : runs) {
      if (r.config.empty()) continue;  // no config.yaml: nothing to compare
      const auto it = std::find_if(r.config.begin(), r.config.end(), [&](const auto& kv) { return kv.first == k; });
      if (it == r.config.end()) missing = true;
      else values.insert(it->second);
    }
    if (values.size() > 1 || (missing && !values.empty())) out.push_back(k);
  }
  return out;
}

}  // namespace mpx::report
