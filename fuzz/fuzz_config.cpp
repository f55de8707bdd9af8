// SPDX-License-Identifier: MIT
// libFuzzer target: the config loader (YAML text, then --set overrides).
// Input: YAML text; after the first NUL byte, NUL-separated `--set` strings.
// Contract: a Config, or a ConfigError that names the file or the --set
// string; memory bounded by the input (docs/inputs.md's alias budget).
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_support.h"

namespace {

constexpr const char* kSource = "fuzz.yaml";

void split(const uint8_t* data, size_t size, std::string& yaml, std::vector<std::string>& sets) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  yaml = all.substr(0, nul);
  if (nul == std::string::npos) return;
  size_t at = nul + 1;
  while (at <= all.size() && sets.size() < 16) {
    const size_t end = all.find('\0', at);
    sets.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string yaml;
  std::vector<std::string> sets;
  split(data, size, yaml, sets);
  mpx::fuzz::MemoryMeter meter;
  meter.start();
  try {
    const mpx::Config c = mpx::parse_config(yaml, kSource, sets);
    // The resolved config must load back (docs/config.md's promise for config.yaml).
    (void)mpx::parse_config(mpx::to_yaml(c), "resolved.yaml");
  } catch (const mpx::ConfigError& e) {
    const std::string msg = e.what();
    if (msg.find(kSource) == std::string::npos && msg.find("--set") == std::string::npos)
      mpx::fuzz::broken("the message names neither " + std::string(kSource) + " nor --set: " + msg.substr(0, 400));
  } catch (const std::exception& e) {
    mpx::fuzz::broken(std::string("not a ConfigError: ") + e.what());
  }
  // The YAML tree and the alias budget: a few hundred bytes of tree per input byte.
  meter.stop_and_check(64u * 1024 * 1024 + 1024ull * size, "the config loader");
  return 0;
}
