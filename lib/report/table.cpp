// SPDX-License-Identifier: MIT
// The table of runs and its text, CSV, JSON and Markdown forms (table.h).
#include "report/table.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
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

/// The YAML text of a config value as JSON: a number or a boolean where it is one.
json config_json(const std::string& text) {
  if (text.empty()) return text;
  const bool numeric = text.find_first_not_of("0123456789+-.eE") == std::string::npos;
  if (numeric || text == "true" || text == "false") {
    const json j = json::parse(text, nullptr, false);
    if (!j.is_discarded() && (j.is_number() || j.is_boolean())) return j;
  }
  return text;
}

/// Characters on screen (UTF-8 code points), for the aligned text form.
size_t width(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char ch) { return (ch & 0xC0) != 0x80; }));
}

size_t column_index(const Table& t, const std::string& key) {
  for (size_t j = 0; j < t.columns.size(); ++j)
    if (t.columns[j].key == key) return j;
  std::string known;
  for (const auto& c : t.columns) known += (known.empty() ? "" : ", ") + c.key;
  throw ConfigError(fmt::format("no column '{}' in the table of these runs; the columns are: {}", key, known));
}

std::string hidden_note(const Table& t) {
  if (t.hidden.empty()) return "";
  return fmt::format("({} more config key{} differ{}: {}; --columns KEY,... shows them)\n", t.hidden.size(),
                     t.hidden.size() == 1 ? "" : "s", t.hidden.size() == 1 ? "s" : "", fmt::join(t.hidden, ", "));
}

}  // namespace

void cap_config_columns(Table& t, size_t max) {
  size_t kept = 0;
  for (size_t j = 0; j < t.columns.size();) {
    if (t.columns[j].config && kept++ >= max) {
      t.hidden.push_back(t.columns[j].key);
      t.columns.erase(t.columns.begin() + static_cast<std::ptrdiff_t>(j));
      for (auto& row : t.rows) row.erase(row.begin() + static_cast<std::ptrdiff_t>(j));
    } else {
      ++j;
    }
  }
}

void select_columns(Table& t, const std::vector<std::string>& keys) {
  std::vector<size_t> pick = {column_index(t, "run")};
  for (const auto& k : keys)
    if (k != "run") pick.push_back(column_index(t, k));
  Table out;
  for (size_t j : pick) out.columns.push_back(t.columns[j]);
  for (const auto& row : t.rows) {
    std::vector<json> r;
    for (size_t j : pick) r.push_back(row[j]);
    out.rows.push_back(std::move(r));
  }
  t = std::move(out);
}

void sort_rows(Table& t, const std::string& key, bool descending) {
  const size_t j = column_index(t, key);
  std::stable_sort(t.rows.begin(), t.rows.end(), [&](const std::vector<json>& a, const std::vector<json>& b) {
    const json &x = a[j], &y = b[j];
    if (x.is_null() || y.is_null()) return !x.is_null() && y.is_null();  // null last either way
    if (x.is_number() && y.is_number())
      return descending ? x.get<double>() > y.get<double>() : x.get<double>() < y.get<double>();
    const std::string sx = x.is_string() ? x.get<std::string>() : x.dump();
    const std::string sy = y.is_string() ? y.get<std::string>() : y.dump();
    return descending ? sx > sy : sx < sy;
  });
}

std::string cell_text(const Column& c, const json& v) {
  if (v.is_null()) return "–";
  if (v.is_string()) return v.get<std::string>();
  if (c.key == "peak_memory_bytes" && v.is_number_unsigned()) return format_bytes(v.get<size_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    const bool is_loss = c.key.find("loss") != std::string::npos && c.key != "final_loss_scale";
    if (c.key.find("accuracy") != std::string::npos || is_loss) return fmt::format("{:.4f}", d);
    if (c.key == "images_per_sec" || c.key == "wall_seconds" || c.key == "time_to_target_seconds") return fmt::format("{:.1f}", d);
    return fmt::format("{:g}", d);
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

Table run_table(const std::vector<RunData>& runs) {
  Table t;
  t.columns = kSummaryColumns;
  // train.target_accuracy: the time to it, after the wall time, where some run was timed to one.
  const bool timed = std::any_of(runs.begin(), runs.end(), [](const RunData& r) {
    const auto it = r.summary.find("target_accuracy");
    return it != r.summary.end() && !it->is_null();
  });
  if (timed) {
    auto at = std::find_if(t.columns.begin(), t.columns.end(), [](const Column& c) { return c.key == "wall_seconds"; });
    at = t.columns.insert(at + 1, {"time_to_target_seconds", "to target s"});
    t.columns.insert(at + 1, {"target_epoch", "target epoch"});
  }
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
        row.push_back(v.empty() && r.config.empty() ? json(nullptr) : config_json(v));
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
    for (const auto& c : t.columns) out += " " + md_field(c.title) + " |";
    out += "\n|";
    for (size_t j = 0; j < nc; ++j) out += " --- |";
    out += "\n";
    for (const auto& row : t.rows) {
      out += "|";
      for (size_t j = 0; j < nc; ++j) out += " " + md_field(cell_text(t.columns[j], row[j])) + " |";
      out += "\n";
    }
    const std::string note = hidden_note(t);
    return note.empty() ? out : out + "\n" + note;
  }
  // Text: aligned columns; the message last, unpadded.
  std::vector<size_t> w(nc);
  std::vector<std::vector<std::string>> cells;
  for (size_t j = 0; j < nc; ++j) w[j] = width(t.columns[j].title);
  for (const auto& row : t.rows) {
    std::vector<std::string> c;
    for (size_t j = 0; j < nc; ++j) {
      c.push_back(md_field(cell_text(t.columns[j], row[j])));
      w[j] = std::max(w[j], width(c.back()));
    }
    cells.push_back(std::move(c));
  }
  auto line = [&](const std::vector<std::string>& c) {
    std::string l;
    for (size_t j = 0; j < nc; ++j) {
      const bool last = j + 1 == nc;
      l += last ? c[j] : c[j] + std::string(w[j] - width(c[j]) + 2, ' ');
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  std::vector<std::string> head;
  for (const auto& c : t.columns) head.push_back(c.title);
  out += line(head);
  for (const auto& c : cells) out += line(c);
  return out + hidden_note(t);
}

}  // namespace mpx::report
