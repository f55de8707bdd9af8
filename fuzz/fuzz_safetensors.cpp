// SPDX-License-Identifier: MIT
// libFuzzer target: the safetensors reader (header JSON and data offsets).
// Input: the bytes of a .safetensors file. Contract: tensors whose byte
// counts are dtype x shape and that convert to float32 (F32/F16/BF16), or a
// ConfigError naming the file; memory bounded by the file's size.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_support.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mpx::fuzz::write_scratch("weights.safetensors", data, size);
  mpx::fuzz::MemoryMeter meter;
  meter.start();
  try {
    const mpx::StFile f = mpx::read_safetensors(path);
    for (const mpx::StTensor& t : f.tensors) {
      const size_t bytes = mpx::st_dtype_size(t.dtype);
      if (bytes == 0 || t.numel() < 0 || static_cast<uint64_t>(t.numel()) * bytes != t.bytes.size())
        mpx::fuzz::broken("accepted tensor '" + t.name + "' whose bytes are not dtype x shape");
      if (t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16") {
        if (static_cast<int64_t>(mpx::st_to_float32(t, path).size()) != t.numel())
          mpx::fuzz::broken("tensor '" + t.name + "' converts to another element count");
      }
    }
  } catch (const mpx::ConfigError& e) {
    mpx::fuzz::require_names(e.what(), path);
  } catch (const std::exception& e) {
    mpx::fuzz::broken(std::string("not a ConfigError: ") + e.what());
  }
  // The header's JSON tree is a few times its text; the tensors are the file's bytes
  // (and their float32 copy: twice an F16 tensor's).
  meter.stop_and_check((4u << 20) + 32 * uint64_t{size}, "the safetensors reader");
  return 0;
}
