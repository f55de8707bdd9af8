// SPDX-License-Identifier: MIT
// libFuzzer target: the run-directory reader of `mpx report` and what it renders.
// Input: metrics.jsonl; after the first NUL byte summary.json, after the second
// config.yaml (a part that is not there is a file that is not there).
// Contract: the run is loaded (bad lines counted, never thrown), at most
// kMaxCurvePoints records of each kind are kept, and the HTML page and every
// table format render; or a DataError naming the file. Memory bounded by the input.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_support.h"
#include "report/html.h"
#include "report/run_data.h"
#include "report/table.h"

namespace {

/// The NUL-separated parts of the input, at most three.
std::vector<std::string> parts_of(const uint8_t* data, size_t size) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t at = 0;
  while (parts.size() < 3) {
    const size_t nul = all.find('\0', at);
    parts.push_back(all.substr(at, nul == std::string::npos ? std::string::npos : nul - at));
    if (nul == std::string::npos) break;
    at = nul + 1;
  }
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = mpx::fuzz::scratch_dir() + "/run";
  ::mkdir(dir.c_str(), 0755);
  const char* names[] = {"metrics.jsonl", "summary.json", "config.yaml"};
  const std::vector<std::string> parts = parts_of(data, size);
  for (size_t i = 0; i < 3; ++i) {
    const std::string name = std::string("run/") + names[i];
    if (i < parts.size())
      mpx::fuzz::write_scratch(name, reinterpret_cast<const uint8_t*>(parts[i].data()), parts[i].size());
    else
      ::unlink((mpx::fuzz::scratch_dir() + "/" + name).c_str());
  }
  mpx::fuzz::MemoryMeter meter;
  meter.start();
  try {
    const mpx::report::Loaded loaded = mpx::report::load_runs({dir});
    if (loaded.runs.size() != 1) mpx::fuzz::broken("the run directory was not read as one run");
    const mpx::report::RunData& r = loaded.runs[0];
    if (r.steps.size() > mpx::report::kMaxCurvePoints + 1 || r.epochs.size() > mpx::report::kMaxCurvePoints + 1)
      mpx::fuzz::broken("kept more records than the report's limit");
    if (r.steps.size() > r.step_records || r.epochs.size() > r.epoch_records)
      mpx::fuzz::broken("kept more records than metrics.jsonl holds");
    (void)mpx::report::render_html(loaded, "fuzz");
    for (auto f : {mpx::report::TableFormat::Text, mpx::report::TableFormat::Csv, mpx::report::TableFormat::Json,
                   mpx::report::TableFormat::Markdown})
      (void)mpx::report::format_table(mpx::report::run_table(loaded.runs), f);
  } catch (const mpx::DataError& e) {
    mpx::fuzz::require_names(e.what(), dir);
  } catch (const std::exception& e) {
    mpx::fuzz::broken(std::string("not a DataError: ") + e.what());
  }
  // The kept records (decimated, numeric fields only), the config tree and the page: a
  // fixed allowance for the page's curves plus a multiple of the input.
  meter.stop_and_check((16u << 20) + 512 * uint64_t{size}, "the run-directory reader");
  return 0;
}
