// SPDX-License-Identifier: MIT
// The NCCL communicator: the gradient all-reduce on device buffers (one rank per
// GPU), bootstrapped over MPI (rank 0's ncclUniqueId is broadcast). Host
// collectives go to the MPI communicator. Compiled only with MPX_WITH_NCCL.
#include <mpx/config.hpp>

#include "core/error.h"
#include "dist/communicator.h"

#if MPX_WITH_NCCL
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <vector>

#include "backend/cuda/check.h"

#define MPX_NCCL_CHECK(stmt) MPX_CHECK_GEN("NCCL", stmt, ncclSuccess, ncclGetErrorString)

namespace mpx {

namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device) : boot_(bootstrap), device_(device) {
    MPX_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    if (boot_.rank() == 0) MPX_NCCL_CHECK(ncclGetUniqueId(&id));
    boot_.broadcast(&id, sizeof(id), 0);
    MPX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MPX_NCCL_CHECK(ncclCommInitRank(&comm_, boot_.world_size(), id, boot_.rank()));
  }
  ~NcclCommunicator() override {
    for (Slot& s : slots_) {
      if (s.ready) cudaEventDestroy(s.ready);
      if (s.done) cudaEventDestroy(s.done);
    }
    if (comm_) {
      const ncclResult_t r = ncclCommDestroy(comm_);
      if (r != ncclSuccess) spdlog::warn("ncclCommDestroy: {}", ncclGetErrorString(r));
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string kind() const override { return "nccl"; }
  int rank() const override { return boot_.rank(); }
  int world_size() const override { return boot_.world_size(); }
  int local_rank() const override { return boot_.local_rank(); }

  /// `data` is device memory on `device`; the caller has finished writing it (the backend synchronized).
  void all_reduce_sum(float* data, size_t count) override {
    if (count == 0) return;
    MPX_CUDA_CHECK(cudaSetDevice(device_));
    MPX_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_));
    MPX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  /// Queues the all-reduce of `data` (device memory) on stream_ behind the work queued so far on
  /// the compute stream; the host does not wait.
  Handle start_all_reduce_sum(float* data, size_t count) override {
    MPX_CUDA_CHECK(cudaSetDevice(device_));
    size_t h = 0;
    while (h < slots_.size() && slots_[h].busy) ++h;
    if (h == slots_.size()) {
      Slot s;
      MPX_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
      MPX_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      slots_.push_back(s);
    }
    Slot& s = slots_[h];
    MPX_CUDA_CHECK(cudaEventRecord(s.ready, compute_));
    MPX_CUDA_CHECK(cudaStreamWaitEvent(stream_, s.ready, 0));
    if (count > 0) MPX_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_));
    MPX_CUDA_CHECK(cudaEventRecord(s.done, stream_));
    s.busy = true;
    return static_cast<Handle>(h);
  }
  /// The compute stream waits (on the device) for the all-reduce `h`.
  void wait(Handle h) override {
    MPX_CHECK_MSG(h >= 0 && static_cast<size_t>(h) < slots_.size() && slots_[static_cast<size_t>(h)].busy,
                  fmt::format("NCCL wait: handle {} was not started or was already waited for", h));
    Slot& s = slots_[static_cast<size_t>(h)];
    MPX_CUDA_CHECK(cudaSetDevice(device_));
    MPX_CUDA_CHECK(cudaStreamWaitEvent(compute_, s.done, 0));
    s.busy = false;  // reusable: a later record of s.done is ordered after this wait on the device
  }
  void set_compute_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }

  void all_reduce_sum(double* data, size_t count) override { boot_.all_reduce_sum(data, count); }
  void broadcast(void* data, size_t bytes, int root) override { boot_.broadcast(data, bytes, root); }
  void barrier() override { boot_.barrier(); }
  [[noreturn]] void abort(int exit_code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    boot_.abort(exit_code);
    std::_Exit(exit_code);  // not reached (MPI_Abort)
  }

 private:
  Communicator& boot_;
  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  /// The stream the backend computes on (set_compute_stream; nullptr = legacy default stream).
  cudaStream_t compute_ = nullptr;
  /// Events of the asynchronous all-reduces, reused once waited for.
  struct Slot {
    cudaEvent_t ready = nullptr;  // recorded on compute_: the gradients are written
    cudaEvent_t done = nullptr;   // recorded on stream_: the sum is in place
    bool busy = false;
  };
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return std::make_unique<NcclCommunicator>(bootstrap, device);
}

}  // namespace mpx

#else

namespace mpx {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) {
  throw Error("mpx was built without NCCL (it needs both -DMPX_CUDA=ON and -DMPX_MPI=ON and nccl.h/libnccl)");
}

}  // namespace mpx

#endif  // MPX_WITH_NCCL
