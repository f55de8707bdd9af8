// SPDX-License-Identifier: MIT
// The NCCL communicator: the gradient all-reduce on device buffers (one rank per
// GPU), bootstrapped over MPI (rank 0's ncclUniqueId is broadcast with its status).
// The communicator is non-blocking: its start and the blocking all-reduce are polled
// with a time limit (docs/distributed.md "Failures"). Host collectives go to the MPI
// communicator. Compiled only with MPX_WITH_NCCL.
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
#include "dist/bootstrap.h"

#define MPX_NCCL_CHECK(stmt) MPX_CHECK_GEN("NCCL", stmt, ncclSuccess, ncclGetErrorString)

namespace mpx {

namespace {

/// Waits for a non-blocking NCCL call (ncclInProgress) to finish, polling ncclCommGetAsyncError
/// with the time limit of nccl_timeout_seconds(); a NCCL error throws CudaError. On the time
/// limit the communicator is aborted and `comm` set to nullptr.
void wait_nccl(ncclComm_t& comm, ncclResult_t r, const char* what) {
  if (r != ncclSuccess && r != ncclInProgress)
    mpx::cuda::throw_cuda_error("NCCL", what, __FILE__, __LINE__, ncclGetErrorString(r));
  if (r == ncclSuccess) return;
  poll_with_timeout(
      [&] {
        ncclResult_t state = ncclSuccess;
        MPX_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
        if (state == ncclInProgress) return PollResult::Pending;
        if (state != ncclSuccess) mpx::cuda::throw_cuda_error("NCCL", what, __FILE__, __LINE__, ncclGetErrorString(state));
        return PollResult::Done;
      },
      nccl_timeout_seconds(), std::string("NCCL ") + what, "MPX_NCCL_TIMEOUT_S", [&] {
        ncclCommAbort(comm);
        comm = nullptr;
      });
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device) : boot_(bootstrap), device_(device) {
    MPX_CUDA_CHECK(cudaSetDevice(device_));
    // Rank 0's id travels with its status: a failed ncclGetUniqueId ends every rank, none waits.
    const ncclUniqueId id =
        broadcast_with_status<ncclUniqueId>(boot_, 0, "NCCL start (ncclGetUniqueId)", [] {
          ncclUniqueId u{};
          MPX_NCCL_CHECK(ncclGetUniqueId(&u));
          return u;
        });
    MPX_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Non-blocking: the start is polled with a time limit instead of blocking forever on a
    // rank that never arrives.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, boot_.world_size(), id, boot_.rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      comm_ = nullptr;
      cudaStreamDestroy(stream_);
      mpx::cuda::throw_cuda_error("NCCL", "ncclCommInitRankConfig", __FILE__, __LINE__, ncclGetErrorString(r));
    }
    try {
      wait_nccl(comm_, r, "ncclCommInitRankConfig");
    } catch (...) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      cudaStreamDestroy(stream_);
      throw;
    }
  }
  ~NcclCommunicator() override {
    for (Slot& s : slots_) {
      if (s.ready) cudaEventDestroy(s.ready);
      if (s.done) cudaEventDestroy(s.done);
    }
    if (comm_) {
      // A non-blocking communicator is finalized (polled until done) before it is destroyed;
      // one that cannot finish is aborted. Destructors only log.
      try {
        wait_nccl(comm_, ncclCommFinalize(comm_), "ncclCommFinalize");
      } catch (const std::exception& e) {
        spdlog::warn("{}", e.what());
        if (comm_) ncclCommAbort(comm_);
        comm_ = nullptr;
      }
      if (comm_) {
        const ncclResult_t r = ncclCommDestroy(comm_);
        if (r != ncclSuccess) spdlog::warn("ncclCommDestroy: {}", ncclGetErrorString(r));
      }
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
    wait_nccl(comm_, ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    // Polled rather than cudaStreamSynchronize: a peer that failed shows as an asynchronous
    // error, a peer that stopped as the time limit.
    poll_with_timeout(
        [&] {
          const cudaError_t e = cudaStreamQuery(stream_);
          if (e == cudaSuccess) return PollResult::Done;
          if (e != cudaErrorNotReady) MPX_CUDA_CHECK(e);
          ncclResult_t state = ncclSuccess;
          MPX_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
          if (state != ncclSuccess && state != ncclInProgress)
            mpx::cuda::throw_cuda_error("NCCL", "ncclAllReduce (asynchronous error)", __FILE__, __LINE__,
                                        ncclGetErrorString(state));
          return PollResult::Pending;
        },
        nccl_timeout_seconds(), "the NCCL all-reduce of " + std::to_string(count) + " floats", "MPX_NCCL_TIMEOUT_S",
        [&] {
          ncclCommAbort(comm_);
          comm_ = nullptr;
        });
  }
  /// Queues the all-reduce of `data` (device memory) on stream_ behind the work queued so far on
  /// the compute stream; the host does not wait.
  Handle start_all_reduce_sum(float* data, size_t count) override {
    MPX_CHECK_MSG(compute_set_, "NCCL start_all_reduce_sum before set_compute_stream: the all-reduce would not be "
                                "ordered after the gradients' writers (call set_compute_stream with the backend's "
                                "native_stream() first)");
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
    if (count > 0)
      wait_nccl(comm_, ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
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
  void set_compute_stream(void* stream) override {
    compute_ = static_cast<cudaStream_t>(stream);
    compute_set_ = true;
  }

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
  bool compute_set_ = false;  // start_all_reduce_sum refuses to run before set_compute_stream
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
