// SPDX-License-Identifier: MIT
// The single-process communicator, world() (which picks MPI under a launcher),
// rank-tagged logging for multi-rank jobs, and the collective failure check.
#include "dist/communicator.h"
#include "core/env.h"

#include <fmt/format.h>
#include <mpx/config.hpp>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace mpx {

#if MPX_WITH_MPI
std::unique_ptr<Communicator> make_mpi_communicator();  // mpi_communicator.cpp
#endif

void Communicator::all_reduce_sum(const Tensor& t) {
  MPX_CHECK_MSG(t.dtype == DType::F32, "all_reduce_sum takes float32, got " + t.str());
  if (t.numel() > 0) all_reduce_sum(static_cast<float*>(t.data), static_cast<size_t>(t.numel()));
}

Communicator::Handle Communicator::start_all_reduce_sum(float* data, size_t count) {
  if (count > 0) all_reduce_sum(data, count);
  return -1;
}

void Communicator::wait(Handle) {}

bool built_with_mpi() { return MPX_WITH_MPI != 0; }
bool built_with_nccl() { return MPX_WITH_NCCL != 0; }

// ---- one process -------------------------------------------------------------

namespace {

class SingleCommunicator final : public Communicator {
 public:
  std::string kind() const override { return "single"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void broadcast(void*, size_t, int root) override { MPX_CHECK(root == 0); }
  void barrier() override {}
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n > 0 && n < 1000000) ? static_cast<int>(n) : 0;
}

/// Multi-rank jobs: warnings and errors carry "rank R: ", info lines are kept on rank 0 only
/// (N copies of every line help nobody; the run directory is rank 0's anyway).
/// MPX_LOG_ALL_RANKS=1 keeps every rank's info lines too, all prefixed (debugging, tests).
class RankSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  RankSink(std::vector<spdlog::sink_ptr> inner, int rank) : inner_(std::move(inner)), rank_(rank) {
    all_ = env_flag("MPX_LOG_ALL_RANKS");
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level < spdlog::level::warn && rank_ != 0 && !all_) return;
    spdlog::details::log_msg m = msg;
    std::string text;
    if (msg.level >= spdlog::level::warn || all_) {
      text = fmt::format("rank {}: {}", rank_, std::string_view(msg.payload.data(), msg.payload.size()));
      m.payload = spdlog::string_view_t(text.data(), text.size());
    }
    for (auto& s : inner_)
      if (s->should_log(m.level)) s->log(m);
  }
  void flush_() override {
    for (auto& s : inner_) s->flush();
  }

 private:
  std::vector<spdlog::sink_ptr> inner_;
  int rank_;
  bool all_ = false;
};

void install_rank_logging(int rank) {
  auto old = spdlog::default_logger();
  auto sink = std::make_shared<RankSink>(old->sinks(), rank);
  auto logger = std::make_shared<spdlog::logger>(old->name(), sink);
  logger->set_level(old->level());
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    if (const int n = env_int(name)) return n;
  }
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) {
    if (const int n = env_int("SLURM_NTASKS")) return n;
    return 2;  // a launcher's rank variable without a size: assume a real job
  }
  return 1;
}

Communicator& world() {
  static std::unique_ptr<Communicator> comm = [] {
    const int n = launcher_world_size();
    std::unique_ptr<Communicator> c;
    if (n > 1) {
#if MPX_WITH_MPI
      c = make_mpi_communicator();
#else
      throw ConfigError(fmt::format(
          "mpx was started by an MPI launcher with {} ranks, but this mpx was built without MPI: each rank would "
          "train its own copy of the model. Rebuild with MPI (apt-get install libopenmpi-dev openmpi-bin; cmake "
          "-DMPX_MPI=ON) or start a single process",
          n));
#endif
    } else {
      c = make_single_communicator();
    }
    if (c->world_size() > 1) install_rank_logging(c->rank());
    return c;
  }();
  return *comm;
}

void run_on_all_ranks(Communicator& comm, const std::string& what, const std::function<void()>& fn) {
  std::exception_ptr err;
  int code = 0;
  try {
    fn();
  } catch (const Error& e) {
    err = std::current_exception();
    code = e.exit_code() != 0 ? e.exit_code() : kExitInternal;
  } catch (const std::bad_alloc&) {
    err = std::current_exception();
    code = kExitInternal;
  } catch (const std::exception&) {
    err = std::current_exception();
    code = kExitInternal;
  }
  if (comm.world_size() == 1) {
    if (err) std::rethrow_exception(err);
    return;
  }
  std::vector<double> codes(static_cast<size_t>(comm.world_size()), 0.0);
  codes[static_cast<size_t>(comm.rank())] = code;
  comm.all_reduce_sum(codes.data(), codes.size());
  if (err) std::rethrow_exception(err);
  for (size_t r = 0; r < codes.size(); ++r) {
    if (codes[r] != 0) {
      const int c = static_cast<int>(codes[r]);
      throw Error(fmt::format("rank {} failed while {} (exit code {}, its error is in its log); every rank stops", r,
                              what, c),
                  c);
    }
  }
}

}  // namespace mpx
