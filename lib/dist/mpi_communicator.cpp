// SPDX-License-Identifier: MIT
// The MPI communicator (OpenMPI): host-buffer collectives over MPI_COMM_WORLD for
// the CPU path, and the bootstrap of the NCCL one. Compiled only with MPX_WITH_MPI.
#include <mpx/config.hpp>

#if MPX_WITH_MPI
#define OMPI_SKIP_MPICXX 1   // the C API only (the C++ bindings are deprecated)
#define MPICH_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace mpx {

namespace {

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(fmt::format("MPI: {} failed: {}", what, std::string(msg, static_cast<size_t>(len))));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
  ~MpiCommunicator() override {
    for (auto& slot : pending_)  // an all-reduce never waited for (an exception unwound past it)
      for (MPI_Request& r : slot)
        if (r != MPI_REQUEST_NULL) MPI_Wait(&r, MPI_STATUS_IGNORE);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

  std::string kind() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }

  void all_reduce_sum(float* data, size_t count) override {
    // MPI counts are int: reduce arenas above 2^31 elements in pieces.
    for (size_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min<size_t>(count - done, INT_MAX));
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
      done += static_cast<size_t>(n);
    }
  }
  Handle start_all_reduce_sum(float* data, size_t count) override {
    size_t h = 0;
    while (h < pending_.size() && !pending_[h].empty()) ++h;
    if (h == pending_.size()) pending_.emplace_back();
    std::vector<MPI_Request>& reqs = pending_[h];
    for (size_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min<size_t>(count - done, INT_MAX));
      reqs.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &reqs.back()),
                "MPI_Iallreduce");
      done += static_cast<size_t>(n);
    }
    if (reqs.empty()) reqs.push_back(MPI_REQUEST_NULL);  // count 0: a handle whose wait() returns at once
    return static_cast<Handle>(h);
  }
  void wait(Handle h) override {
    MPX_CHECK_MSG(h >= 0 && static_cast<size_t>(h) < pending_.size() && !pending_[static_cast<size_t>(h)].empty(),
                  fmt::format("MPI wait: handle {} was not started or was already waited for", h));
    std::vector<MPI_Request>& reqs = pending_[static_cast<size_t>(h)];
    mpi_check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    reqs.clear();
  }
  void progress() override {
    // One MPI_Test drives MPI's progress engine (all pending operations, not just this one).
    for (auto& slot : pending_) {
      for (MPI_Request& r : slot) {
        if (r == MPI_REQUEST_NULL) continue;
        int flag = 0;
        mpi_check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
        return;
      }
    }
  }
  void all_reduce_sum(double* data, size_t count) override {
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    mpi_check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int exit_code) override {
    spdlog::default_logger()->flush();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool owns_ = false;
  /// In-flight asynchronous all-reduces by handle (more than one request above 2^31 elements);
  /// an empty slot is free.
  std::vector<std::vector<MPI_Request>> pending_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace mpx
#endif  // MPX_WITH_MPI
