// SPDX-License-Identifier: MIT
// The double-buffered input upload of the CUDA backend (staging.h).
#include "backend/cuda/staging.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <string>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace mpx::cuda {

namespace {
void log_failure(const char* what, cudaError_t e) {
  if (e != cudaSuccess) spdlog::error("CUDA: {} failed: {}", what, cudaGetErrorString(e));
}
}  // namespace

Staging::Staging(int device) : device_(device) {
  copy_ = make_stream();
  for (Slot& s : slots_) {
    s.released = make_event();
    s.uploaded = make_event();
  }
}

Staging::~Staging() {
  // The copies may still read the host buffers, which the members' wrappers free next.
  if (copy_) log_failure("cudaStreamSynchronize (copy stream)", cudaStreamSynchronize(copy_.get()));
}

void* Staging::host(int slot, size_t bytes) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  // The slot's last copy reads this memory: wait for it (an event never recorded is complete).
  MPX_CUDA_CHECK(cudaEventSynchronize(s.uploaded.get()));
  if (s.bytes < bytes || !s.host) {
    const size_t cap = bytes == 0 ? 64 : bytes;
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, cap, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemoryError("out of page-locked host memory allocating " + std::to_string(cap) +
                             " bytes of input staging (slot " + std::to_string(slot) + ") for cuda:" +
                             std::to_string(device_) + "; try a smaller batch_size");
    }
    MPX_CUDA_CHECK(e);
    UniqueHostMemory fresh(p);
    if (s.host) std::memcpy(p, s.host.get(), s.bytes);  // keep the contents, as the CPU backend's resize does
    s.host = std::move(fresh);                          // frees the old buffer
    s.bytes = cap;
  }
  return s.data();
}

void Staging::upload(int slot, void* dst, size_t offset, size_t bytes, cudaStream_t compute) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  MPX_CHECK_MSG(s.host != nullptr && offset <= s.bytes && bytes <= s.bytes - offset,
                "upload_staged: " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                    " exceed staging slot " + std::to_string(slot) + " (" + std::to_string(s.bytes) +
                    " bytes; call staging() first)");
  MPX_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), s.released.get(), 0));
  MPX_CUDA_CHECK(cudaMemcpyAsync(dst, s.data() + offset, bytes, cudaMemcpyHostToDevice, copy_.get()));
  MPX_CUDA_CHECK(cudaEventRecord(s.uploaded.get(), copy_.get()));
  MPX_CUDA_CHECK(cudaStreamWaitEvent(compute, s.uploaded.get(), 0));
}

void Staging::release(int slot, cudaStream_t compute, bool capturing) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (capturing)
    MPX_CUDA_CHECK(cudaEventRecordWithFlags(s.released.get(), compute, cudaEventRecordExternal));
  else
    MPX_CUDA_CHECK(cudaEventRecord(s.released.get(), compute));
}

}  // namespace mpx::cuda
