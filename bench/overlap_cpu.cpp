// SPDX-License-Identifier: MIT
// Does overlapping the gradient all-reduce with backward pay on the CPU path?
// Run under mpirun (bench/overlap_cpu.sh): every rank builds the model of a config
// on the CPU backend (random weights, random input and dlogits, no data set) and
// times, per step (forward + backward + all-reduce of the float32 gradient arena):
//   compute   forward + backward, no all-reduce           (the floor)
//   allreduce one blocking all-reduce of the arena alone  (what overlap can hide at most)
//   blocking  forward + backward, then one MPI_Allreduce  (what the trainer does today)
//   async     buckets (GradBuckets) started by MPI_Iallreduce from the grad-ready hook
//             during backward, all waited after it
//   async+p   the same, plus Communicator::progress() (MPI_Test) at every layer's hook
// The variants run round-robin, one step each in turn; median (min, max) over the
// timed steps of the mean over ranks, in milliseconds.
//   overlap_cpu_bench [config] [batch per rank] [steps] [bucket KiB,...]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "core/rng.h"
#include "dist/communicator.h"
#include "dist/grad_sync.h"
#include "nn/model.h"

using namespace mpx;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string config = argc > 1 ? argv[1] : "configs/cifar10_fp32.yaml";
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 32;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 10;
  std::vector<size_t> bucket_kib{64, 256, 1024};
  if (argc > 4) {
    bucket_kib.clear();
    std::stringstream ss(argv[4]);
    for (std::string item; std::getline(ss, item, ',');) bucket_kib.push_back(std::stoul(item));
  }
  try {
    Communicator& comm = world();
    const int rank = comm.rank(), world_size = comm.world_size();
    const Config cfg = load_config(config);
    const Policy policy = cfg.policy == Policy::Auto ? Policy::Float32 : cfg.policy;
    int H = 32, W = 32, C = 3;
    if (cfg.model.input_shape.size() == 3) {
      H = static_cast<int>(cfg.model.input_shape[0]);
      W = static_cast<int>(cfg.model.input_shape[1]);
      C = static_cast<int>(cfg.model.input_shape[2]);
    }
    auto be = create_backend("cpu");
    Model model(cfg, policy, *be, H, W, C, 10, batch);
    model.init_params(1);

    Rng rng(1000 + static_cast<uint64_t>(rank));
    std::vector<uint8_t> xv(static_cast<size_t>(batch * H * W * C));
    for (auto& v : xv) v = static_cast<uint8_t>(rng.uniform_int(256));
    Buffer xb = be->alloc(xv.size(), "bench input");
    const Tensor x = xb.view(DType::U8, Shape{batch, H, W, C});
    be->upload(x, xv.data());
    std::vector<float> dv(static_cast<size_t>(batch * 10));
    for (auto& v : dv) v = static_cast<float>(rng.uniform(-1e-2, 1e-2));
    Buffer db = be->alloc(dv.size() * 4, "bench dlogits");
    const Tensor dl = db.view(DType::F32, Shape{batch, 10});
    be->upload(dl, dv.data());

    const Tensor g = model.grads();
    float* grads = static_cast<float*>(g.data);
    const size_t count = static_cast<size_t>(model.num_params());

    auto fwd_bwd = [&] {
      model.forward(x, true);
      model.backward(dl);
    };

    // The variants, timed round-robin (one step of each in turn, so that load from other
    // processes on the shared cores hits them alike); each step between barriers.
    struct Variant {
      std::string name;
      std::function<void()> step;
      std::function<void(int64_t, int64_t)> hook;  // empty: none
      size_t buckets = 0, bucket_kib = 0;
      bool progress = false;
      std::vector<double> ms;
    };
    std::vector<Variant> vs;
    vs.push_back({"compute (fwd+bwd, no all-reduce)", fwd_bwd, {}, 0, 0, false, {}});
    vs.push_back({"one blocking all-reduce alone", [&] { comm.all_reduce_sum(grads, count); }, {}, 0, 0, false, {}});
    vs.push_back({"blocking (fwd+bwd, then it)", [&] {
                    fwd_bwd();
                    comm.all_reduce_sum(grads, count);
                  }, {}, 0, 0, false, {}});
    std::vector<std::unique_ptr<GradBuckets>> plans;
    std::vector<Communicator::Handle> inflight;
    auto async_step = [&] {
      inflight.clear();
      fwd_bwd();
      for (auto h : inflight) comm.wait(h);
    };
    for (size_t kib : bucket_kib) {
      plans.push_back(std::make_unique<GradBuckets>(model.grad_ready_ranges(), kib * 1024));
      GradBuckets& gb = *plans.back();
      auto on_bucket = gb.hook([&](int, const GradRange& b) {
        inflight.push_back(comm.start_all_reduce_sum(grads + b.offset, static_cast<size_t>(b.count)));
      });
      for (bool poke : {false, true}) {
        std::function<void(int64_t, int64_t)> hook = [&comm, on_bucket, poke](int64_t off, int64_t n) {
          on_bucket(off, n);
          if (poke) comm.progress();
        };
        vs.push_back({poke ? "  + progress() at every layer"
                           : fmt::format("async, {} bucket{} >= {} KiB", gb.buckets().size(),
                                         gb.buckets().size() == 1 ? "" : "s", kib),
                      async_step, hook, gb.buckets().size(), kib, poke, {}});
      }
    }
    for (int s = 0; s < steps + 2; ++s) {
      for (Variant& v : vs) {
        model.set_grad_ready_hook(v.hook);
        comm.barrier();
        const double t0 = now_ms();
        v.step();
        double dt = now_ms() - t0;
        comm.all_reduce_sum(&dt, 1);
        if (s >= 2) v.ms.push_back(dt / world_size);
      }
    }
    model.set_grad_ready_hook(nullptr);
    auto median = [](std::vector<double> t) {
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    if (rank == 0) {
      fmt::print("config {} ({} policy), {} ranks, batch {} per rank, {} timed steps of each variant\n", config,
                 policy_name(policy), world_size, batch, steps);
      fmt::print("gradient arena: {} float32 = {:.1f} KiB, {} layers with parameters\n", count, count * 4 / 1024.0,
                 model.grad_ready_ranges().size());
      fmt::print("{:<34} {:>10} {:>10} {:>10}\n", "ms per step (mean over ranks)", "median", "min", "max");
      for (const Variant& v : vs)
        fmt::print("  {:<32} {:>10.2f} {:>10.2f} {:>10.2f}\n", v.name, median(v.ms),
                   *std::min_element(v.ms.begin(), v.ms.end()), *std::max_element(v.ms.begin(), v.ms.end()));
    }
    std::string json = fmt::format(
        "{{\"config\": \"{}\", \"ranks\": {}, \"batch_per_rank\": {}, \"arena_floats\": {}, \"compute_ms\": {:.3f}, "
        "\"allreduce_ms\": {:.3f}, \"blocking_ms\": {:.3f}, \"async\": [",
        config, world_size, batch, count, median(vs[0].ms), median(vs[1].ms), median(vs[2].ms));
    for (size_t k = 3; k + 1 < vs.size(); k += 2)
      json += fmt::format("{}{{\"bucket_kib\": {}, \"buckets\": {}, \"async_ms\": {:.3f}, \"async_progress_ms\": {:.3f}}}",
                          k > 3 ? ", " : "", vs[k].bucket_kib, vs[k].buckets, median(vs[k].ms), median(vs[k + 1].ms));
    if (rank == 0) fmt::print("JSON {}]}}\n", json);
  } catch (const std::exception& e) {
    fmt::print(stderr, "overlap_cpu_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
