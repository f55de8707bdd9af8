// SPDX-License-Identifier: MIT
// The table of runs and its text, CSV, JSON and Markdown forms (table.h).
#include "report/table.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/format.h"

using nlohmann::json;

namespace mpx::report {

namespace {

// The summary.json fields of the table, in order (docs/report.md).
const std::vector<Column> kSummaryColumns = {
    {"run", "run"},
    {"status", "status"},
    {"policy", "policy"},
    {"device", "device"},
    {"epochs", "epochs"},
    {"steps", "steps"},
    {"final_test_accuracy", "test acc"},
    {"best_test_accuracy", "best acc"},
    {"final_test_loss", "test loss"},
    {"final_train_loss", "train loss"},
    {"images_per_sec", "images/s"},
    {"wall_seconds", "wall s"},
    {"skipped_steps", "skipped"},
    {"final_loss_scale", "loss scale"},
    {"peak_memory_bytes", "peak memory"},
};

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string md_field(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n' || c == '\r') o += ' ';
    else o += c;
  }
  return o;
}

/// The raw value for CSV: numbers as JSON writes them (round-trip), strings as they are.
std::string raw_text(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string cell_text(const Column& c, const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (c.key == "peak_memory_bytes" && v.is_number_unsigned()) return format_bytes(v.get<size_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    const bool is_loss = c.key.find("loss") != std::string::npos && c.key != "final_loss_scale";
    if (c.key.find("accuracy") != std::string::npos || is_loss) return fmt::format("{:.4f}", d);
    if (c.key == "images_per_sec" || c.key == "wall_seconds") return fmt::format("{:.1f}", d);
    return fmt::format("{:g}", d);
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

Table run_table(const std::vector<RunData>& runs) {
  Table t;
  t.columns = kSummaryColumns;
  for (const auto& k : differing_keys(runs)) {
    // `policy` is a summary column already (the resolved one; config.yaml has it resolved too).
    const bool taken = std::any_of(t.columns.begin(), t.columns.end(), [&](const Column& c) { return c.key == k; });
    if (!taken) t.columns.push_back({k, k, true});
  }
  t.columns.push_back({"message", "message"});
  for (const auto& r : runs) {
    std::vector<json> row;
    for (const auto& c : t.columns) {
      if (c.key == "run") row.emplace_back(r.name);
      else if (c.key == "status") row.emplace_back(r.status);
      else if (c.key == "message") row.emplace_back(r.message);
      else if (c.config) {
        const std::string v = config_value(r, c.key);
        row.emplace_back(v.empty() && r.config.empty() ? json(nullptr) : json(v));
      } else {
        const auto it = r.summary.find(c.key);
        row.push_back(it == r.summary.end() ? json(nullptr) : *it);
      }
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::string format_table(const Table& t, TableFormat f) {
  std::string out;
  const size_t nc = t.columns.size();
  if (f == TableFormat::Json) {
    json arr = json::array();
    for (const auto& row : t.rows) {
      json o = json::object();
      for (size_t j = 0; j < nc; ++j) o[t.columns[j].key] = row[j];
      arr.push_back(o);
    }
    // Text from run files is not always valid UTF-8 (nlohmann::json accepts it in keys and
    // values): such bytes are written as U+FFFD rather than failing the whole table.
    return arr.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  }
  if (f == TableFormat::Csv) {
    for (size_t j = 0; j < nc; ++j) out += (j ? "," : "") + csv_field(t.columns[j].key);
    out += "\r\n";
    for (const auto& row : t.rows) {
      for (size_t j = 0; j < nc; ++j) out += (j ? "," : "") + csv_field(raw_text(row[j]));
      out += "\r\n";
    }
    return out;
  }
  if (f == TableFormat::Markdown) {
    out += "|";
    for (const auto& c : t.columns) out += " " + md_field(c.key) + " |";
    out += "\n|";
    for (size_t j = 0; j < nc; ++j) out += " --- |";
    out += "\n";
    for (const auto& row : t.rows) {
      out += "|";
      for (size_t j = 0; j < nc; ++j) out += " " + md_field(cell_text(t.columns[j], row[j])) + " |";
      out += "\n";
    }
    return out;
  }
  // Text: aligned columns; the message last, unpadded.
  std::vector<size_t> w(nc);
  std::vector<std::vector<std::string>> cells;
  for (size_t j = 0; j < nc; ++j) w[j] = t.columns[j].title.size();
  for (const auto& row : t.rows) {
    std::vector<std::string> c;
    for (size_t j = 0; j < nc; ++j) {
      c.push_back(md_field(cell_text(t.columns[j], row[j])));
      w[j] = std::max(w[j], c.back().size());
    }
    cells.push_back(std::move(c));
  }
  auto line = [&](const std::vector<std::string>& c) {
    std::string l;
    for (size_t j = 0; j < nc; ++j) {
      const bool last = j + 1 == nc;
      l += last ? c[j] : fmt::format("{:<{}}  ", c[j], w[j]);
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  std::vector<std::string> head;
  for (const auto& c : t.columns) head.push_back(c.title);
  out += line(head);
  for (const auto& c : cells) out += line(c);
  return out;
}

}  // namespace mpx::report
