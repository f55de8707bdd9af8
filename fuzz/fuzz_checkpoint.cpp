// SPDX-License-Identifier: MIT
// libFuzzer target: the checkpoint reader. Input: the bytes of a .ckpt file.
// Contract: a checkpoint whose arenas have the sizes its header states, or a
// DataError naming the file; memory bounded by the file's size.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_support.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mpx::fuzz::write_scratch("last.ckpt", data, size);
  mpx::fuzz::MemoryMeter meter;
  meter.start();
  try {
    const mpx::Checkpoint c = mpx::load_checkpoint(path);
    const auto& h = c.header;
    if (h.num_params < 0 || h.num_state < 0 || static_cast<int64_t>(c.master.size()) != h.num_params ||
        static_cast<int64_t>(c.state.size()) != h.num_state)
      mpx::fuzz::broken("accepted a checkpoint whose arenas differ from its header");
    if (h.epoch < 0 || h.step_in_epoch < 0 || h.global_step < 0 || h.batch_size <= 0 || h.world_size <= 0)
      mpx::fuzz::broken("accepted a checkpoint with a negative position or an empty batch");
    for (const auto& o : c.opt)
      if (o.size() != c.master.size() && !o.empty()) mpx::fuzz::broken("accepted an optimizer arena of another size");
  } catch (const mpx::DataError& e) {
    mpx::fuzz::require_names(e.what(), path);
  } catch (const std::exception& e) {
    mpx::fuzz::broken(std::string("not a DataError: ") + e.what());
  }
  // The header's JSON tree is a few times its text; the arenas are the file's bytes.
  meter.stop_and_check((4u << 20) + 32 * uint64_t{size}, "the checkpoint reader");
  return 0;
}
