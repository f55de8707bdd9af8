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
  /// Config keys that differ but were left out (cap_config_columns); the text and Markdown
  /// forms list them below the table.
  std::vector<std::string> hidden;
};

/// The summary columns, then differing_keys(runs): a config value is a JSON number or
/// boolean where its YAML text is one, else the text; null where a run has no config.
Table run_table(const std::vector<RunData>& runs);

/// Config columns past the first `max` move to Table::hidden (runs of different models
/// differ in dozens of model.layers keys).
void cap_config_columns(Table& t, size_t max);

/// Keeps only the columns named by `keys` (summary fields or config keys), in that order,
/// with the run name first. Throws ConfigError naming an unknown key and the known ones.
void select_columns(Table& t, const std::vector<std::string>& keys);

/// Sorts the rows by column `key` (numbers by value, text by name; null last), ascending or
/// `descending`. Throws ConfigError naming an unknown key.
void sort_rows(Table& t, const std::string& key, bool descending);

enum class TableFormat { Text, Csv, Json, Markdown };

/// Text: aligned columns (sizes in KiB/MiB/GiB, fractions with 4 decimals) under their titles;
/// Markdown: the same cells under the same titles ("peak memory" over "35.4 MiB"); CSV (RFC
/// 4180): one heading row of the keys, then the raw values; JSON: an array of objects, the
/// raw values (numbers as numbers, null where unknown).
std::string format_table(const Table& t, TableFormat f);

/// The cell's text as the text and Markdown formats show it ("–" for null).
std::string cell_text(const Column& c, const nlohmann::json& v);

}  // namespace mpx::report
