// SPDX-License-Identifier: MIT
// Data-parallel communication (docs/distributed.md): the Communicator
// interface and its three implementations: one process (no MPI), MPI (host
// buffers; the CPU path and the bootstrap) and NCCL (device buffers, the GPU path).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/tensor.h"

namespace mpx {

/**
 * @brief The ranks of one data-parallel job and the collectives mpx needs.
 *
 * Every collective must be called by every rank in the same order (MPI's rule).
 * all_reduce_sum(float*) works on the buffers of the backend the communicator
 * serves: host memory for "single" and "mpi", device memory for "nccl". The
 * double all-reduce (metrics, status codes), broadcast and barrier always take
 * host memory.
 */
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// "single" | "mpi" | "nccl"
  virtual std::string kind() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Rank among the processes of this node (picks the GPU: cuda:LOCAL_RANK).
  virtual int local_rank() const = 0;
  /// In-place sum over all ranks of `count` float32 (the flat gradient arena). Blocks until done.
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  /// In-place sum over all ranks of a few host doubles (metrics, status codes).
  virtual void all_reduce_sum(double* data, size_t count) = 0;
  /// Copies `bytes` host bytes of rank `root` to every other rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Ends every rank of the job now with `exit_code` (MPI_Abort); the last resort
  /// when one rank failed where the others cannot learn of it (mid-collective).
  [[noreturn]] virtual void abort(int exit_code) = 0;

  /// The float32 tensor `t` (all of it) summed in place.
  void all_reduce_sum(const Tensor& t);

  // ---- asynchronous gradient all-reduce (overlap with the backward pass) ----
  /// Names one all-reduce started by start_all_reduce_sum(); pass it to wait() exactly once.
  using Handle = int64_t;
  /**
   * @brief Starts the in-place sum over all ranks of `count` float32 at `data` (a
   * bucket of the flat gradient arena, same memory kind as all_reduce_sum) and
   * returns without waiting for it. Several may be in flight; every rank must start
   * them in the same order (MPI's rule) and must not touch `data` before wait().
   * The default (single process, and any communicator without an asynchronous path)
   * sums synchronously here and returns a handle whose wait() does nothing.
   *  - "mpi": MPI_Iallreduce. MPI progresses it only inside MPI calls: call progress()
   *    while computing (e.g. from Model's grad-ready hook) or it may run at wait().
   *  - "nccl": queued on the communicator's own stream behind an event recorded now
   *    on the compute stream (set_compute_stream), so it starts once the gradient
   *    work queued so far is done; no host synchronisation.
   */
  virtual Handle start_all_reduce_sum(float* data, size_t count);
  /**
   * @brief Completes the all-reduce `h`. "mpi": blocks until the sum is in place
   * (MPI_Wait). "nccl": makes the compute stream wait for it (an event), the host
   * does not wait: work queued on the compute stream afterwards sees the sum.
   */
  virtual void wait(Handle h);
  /// Lets in-flight asynchronous all-reduces progress (MPI_Test); cheap, call it often. No-op by default.
  virtual void progress() {}
  /// NCCL: the cudaStream_t (as void*) the backend queues its compute on; start_all_reduce_sum
  /// orders after it and wait() orders it after the all-reduce; nullptr is the legacy default
  /// stream. NCCL refuses start_all_reduce_sum before this was called (an all-reduce not
  /// ordered after the gradients' writers would read them half-written). Ignored by the host
  /// communicators.
  virtual void set_compute_stream(void* stream) { (void)stream; }
};

/// Ranks the launcher says this process belongs to (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
/// PMIX_SIZE/SLURM_NTASKS with PMIX_RANK); 1 when not started by mpirun/srun.
int launcher_world_size();

/**
 * @brief The process-wide communicator, created on first use: MPI when mpx was
 * built with it and a launcher started more than one rank, else the single-process
 * one. With more than one rank it also tags every warning and error with the rank
 * and silences info lines on ranks other than 0.
 *
 * Throws ConfigError (exit 2) when started with more than one rank by a launcher
 * but built without MPI: that would train N independent copies.
 */
Communicator& world();

/// A one-process communicator (tests, and world() outside mpirun).
std::unique_ptr<Communicator> make_single_communicator();

/**
 * @brief A NCCL communicator over the ranks of `bootstrap` (MPI), for device
 * buffers on CUDA device `device` (the ncclUniqueId is broadcast from rank 0 over
 * `bootstrap`, which also serves its host collectives). Throws Error when mpx was
 * built without NCCL (it needs both CUDA and MPI) and CudaError on NCCL failures.
 */
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);

/// True when this mpx has the MPI / NCCL communicators.
bool built_with_mpi();
bool built_with_nccl();
/// Sets v.nccl_built and v.nccl (the NCCL of the headers and the loaded one); zeros without NCCL.
void add_nccl_versions(CudaLibraryVersions& v);

/**
 * @brief Runs `fn` on every rank, then tells every rank whether any rank failed
 * (one all-reduce of a status code per rank). If one did, every rank throws: the
 * failing rank rethrows its own error, the others throw mpx::Error carrying the
 * exit code of the lowest failing rank. `what` names the phase in the message.
 * Used at the collective points where a rank may fail alone (loading data, the
 * checkpoint to resume), so that no rank waits in a collective forever.
 */
void run_on_all_ranks(Communicator& comm, const std::string& what, const std::function<void()>& fn);

}  // namespace mpx
