// SPDX-License-Identifier: MIT
// The double-buffered input upload of the CUDA backend (Backend::staging, upload_staged,
// release_staged): two page-locked host buffers, a copy stream of its own and, per slot,
// two events:
//   released[slot]  recorded on the compute stream by release(): the compute work that
//                   last reads the slot's device buffers;
//   uploaded[slot]  recorded on the copy stream after each upload(): the copy that last
//                   reads the slot's host buffer.
// upload() makes the copy stream wait for released[slot], copies, records uploaded[slot]
// and makes the compute stream wait for it: the copy of the next batch overlaps the
// current step, and the host never waits for the GPU except in host(), which waits for
// the slot's last copy before the host may overwrite the buffer.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include "backend/cuda/handles.h"

namespace mpx::cuda {

class Staging {
 public:
  /// Creates the copy stream and the events on the current device (the Context's); all are
  /// owning wrappers (handles.h), so a failure half-way frees what was created.
  explicit Staging(int device);
  ~Staging();  // waits for the copy stream; the wrappers then free everything (only logging failures)
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  /// Host memory of `slot`, at least `bytes`, safe to write: waits for the slot's last upload.
  /// Growing reallocates (cudaHostAlloc, copy of the contents, cudaFreeHost).
  void* host(int slot, size_t bytes);
  /// Queues the copy of host(slot) + [offset, offset + bytes) to `dst` on the copy stream,
  /// after the compute work before the slot's last release(); `compute` waits for it.
  void upload(int slot, void* dst, size_t offset, size_t bytes, cudaStream_t compute);
  /// Records released[slot] on `compute`. While `compute` is being captured into a graph the
  /// record becomes an event-record node of the graph (cudaEventRecordExternal), so every
  /// launch of the graph records it.
  void release(int slot, cudaStream_t compute, bool capturing);

 private:
  struct Slot {
    UniqueHostMemory host;
    size_t bytes = 0;
    UniqueEvent released;
    UniqueEvent uploaded;
    unsigned char* data() const { return static_cast<unsigned char*>(host.get()); }
  };
  int device_ = 0;
  UniqueStream copy_;  // declared first: destroyed after the slots' events
  std::array<Slot, 2> slots_{};
};

}  // namespace mpx::cuda
