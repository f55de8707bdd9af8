// SPDX-License-Identifier: MIT
#include "fuzz_support.h"

#include <sanitizer/allocator_interface.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace mpx::fuzz {
namespace {

std::atomic<bool> g_metering{false};
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void on_malloc(const volatile void*, size_t size) {
  if (!g_metering.load(std::memory_order_relaxed)) return;
  const int64_t now = g_live.fetch_add(static_cast<int64_t>(size)) + static_cast<int64_t>(size);
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

void on_free(const volatile void* p) {
  if (!g_metering.load(std::memory_order_relaxed) || p == nullptr) return;
  // Blocks allocated before start() count as freed too: the peak is measured
  // from start()'s level, so freeing old memory can only lower it.
  g_live.fetch_sub(static_cast<int64_t>(__sanitizer_get_allocated_size(const_cast<const void*>(p))));
}

// The readers' info lines ("cifar10: 10000 records ...") would cost more than the parsing.
[[maybe_unused]] const bool g_quiet = (spdlog::set_level(spdlog::level::off), true);

const bool g_hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0;

}  // namespace

void broken(const std::string& what) {
  std::fprintf(stderr, "contract broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void require_names(const std::string& message, const std::string& place) {
  if (message.find(place) == std::string::npos)
    broken("the message does not name " + place + ": " + message.substr(0, 400));
}

const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/mpx-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) broken("cannot make a scratch folder under " + tmpl);
    return tmpl;
  }();
  return dir;
}

std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) broken("cannot write " + path);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) broken("cannot write " + path);
  std::fclose(f);
  return path;
}

void MemoryMeter::start() {
  if (!g_hooks_installed) broken("the sanitizer allocator hooks could not be installed");
  g_live = 0;
  g_peak = 0;
  g_metering = true;
}

void MemoryMeter::stop_and_check(uint64_t budget, const char* what) {
  g_metering = false;
  if (static_cast<uint64_t>(g_peak.load()) > budget)
    broken(std::string(what) + " allocated " + std::to_string(g_peak.load()) + " bytes at its peak; the input justifies " +
           std::to_string(budget));
}

}  // namespace mpx::fuzz
