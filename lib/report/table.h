// SPDX-License-Identifier: MIT
// The table of runs: one row per run, the summary's figures, then the config keys
// that differ between the runs (`mpx report --table`, and the HTML report's table).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/run_data.h"

namespace mpx::report {

struct Column {
  std::string key;    // the JSON key (a summary field or a config key path)
  std::string title;  // the heading for people
  bool config = false;
};

struct Table {
  std::vector<Column> columns;
  /// rows[i][j]: runs[i]'s value of columns[j]: a number, a string, or null when unknown.
  std::vector<std::vector<nlohmann::json>> rows;
};

/// The summary columns, then differing_keys(runs) (the config key's value as its YAML text).
Table run_table(const std::vector<RunData>& runs);

enum class TableFormat { Text, Csv, Json, Markdown };

/// Text: aligned columns (sizes in KiB/MiB/GiB, fractions with 4 decimals); CSV (RFC 4180)
/// and Markdown: one heading row of the keys, then the values; JSON: an array of objects.
std::string format_table(const Table& t, TableFormat f);

/// The cell's text as the text and Markdown formats show it ("-" for null).
std::string cell_text(const Column& c, const nlohmann::json& v);

}  // namespace mpx::report
