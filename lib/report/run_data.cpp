// SPDX-License-Identifier: MIT
// Reading run directories for `mpx report` (run_data.h).
#include "report/run_data.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace mpx::report {

namespace {

bool has_run_files(const fs::path& d) {
  std::error_code ec;
  return fs::is_regular_file(d / "summary.json", ec) || fs::is_regular_file(d / "metrics.jsonl", ec) ||
         fs::is_regular_file(d / "config.yaml", ec);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// "a.b" / "a[2].b" paths to the scalar text; a list of scalars stays one value ("[1, 2]").
void flatten(const YAML::Node& n, const std::string& key, std::vector<std::pair<std::string, std::string>>& out) {
  if (n.IsMap()) {
    for (const auto& kv : n) flatten(kv.second, key.empty() ? kv.first.Scalar() : key + "." + kv.first.Scalar(), out);
  } else if (n.IsSequence()) {
    const bool scalars = std::all_of(n.begin(), n.end(), [](const YAML::Node& e) { return e.IsScalar(); });
    if (scalars) {
      std::string s = "[";
      for (size_t i = 0; i < n.size(); ++i) s += (i ? ", " : "") + n[i].Scalar();
      out.emplace_back(key, s + "]");
    } else {
      for (size_t i = 0; i < n.size(); ++i) flatten(n[i], key + "[" + std::to_string(i) + "]", out);
    }
  } else if (n.IsScalar()) {
    out.emplace_back(key, n.Scalar());
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
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) {
    try {
      r.summary = json::parse(read_text(p));
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

void read_metrics(const fs::path& d, RunData& r) {
  std::ifstream in(d / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++r.bad_metrics_lines;
      continue;
    }
    const std::string kind = j.value("kind", "");
    if (kind == "step") r.steps.push_back(std::move(j));
    else if (kind == "epoch") r.epochs.push_back(std::move(j));
  }
}

}  // namespace

RunData load_run(const std::string& dir) {
  const fs::path d(dir);
  RunData r;
  r.dir = dir;
  r.name = d.filename().empty() ? d.parent_path().filename().string() : d.filename().string();
  read_summary(d, r);
  std::error_code ec;
  if (fs::is_regular_file(d / "config.yaml", ec)) {
    r.config_text = read_text(d / "config.yaml");
    try {
      flatten(YAML::Load(r.config_text), "", r.config);
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
