// SPDX-License-Identifier: MIT
// `mpx devices`: what this machine offers mpx: the CPU (model, threads, the ISA
// extensions that matter for 16-bit math) and each CUDA GPU, with the policy
// `policy: auto` would choose on each and why.
#include <fmt/format.h>
#include <mpx/config.hpp>

#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "backend/versions.h"
#include "commands.h"
#include "config/config.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "train/trainer.h"

namespace mpx::app {

namespace {

struct CpuFacts {
  std::string model = "unknown CPU";
  unsigned threads = 0;
  bool amx_bf16 = false, avx512f = false, avx512_bf16 = false, avx2 = false, f16c = false;
};

CpuFacts read_cpu_facts() {
  CpuFacts f;
  f.threads = std::thread::hardware_concurrency();
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string value = colon + 1 < line.size() ? line.substr(colon + 1) : "";
    if (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (key == "model name" && !have_model) {
      f.model = value;
      have_model = true;
    } else if (key == "flags" && !have_flags) {
      std::istringstream ss(value);
      std::set<std::string> flags;
      for (std::string w; ss >> w;) flags.insert(w);
      f.amx_bf16 = flags.count("amx_bf16") > 0;
      f.avx512f = flags.count("avx512f") > 0;
      f.avx512_bf16 = flags.count("avx512_bf16") > 0;
      f.avx2 = flags.count("avx2") > 0;
      f.f16c = flags.count("f16c") > 0;
      have_flags = true;
    }
  }
  return f;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

/// "141.0 GiB" inside a DeviceInfo description, in bytes; 0 when absent.
double gib_in(const std::string& description) {
  static const std::regex re("([0-9]+(\\.[0-9]+)?) GiB");
  std::smatch m;
  if (std::regex_search(description, m, re)) return std::stod(m[1].str());
  return 0;
}

void run_devices(bool json) {
  const CpuFacts cpu = read_cpu_facts();
  std::string cpu_reason;
  Policy cpu_policy = Policy::Float32;
  std::string cpu_library;
  DeviceInfo cpu_info;
  {
    auto backend = create_backend("cpu");
    cpu_info = backend->info();
    cpu_policy = resolve_policy(Policy::Auto, cpu_info, &cpu_reason);
    cpu_library = backend->library();
  }
  const std::vector<DeviceInfo> gpus = cuda_devices();
  const bool built_with_cuda = MPX_WITH_CUDA != 0;
  // Data parallel (lib/dist): this process's place in an mpirun job and the device it trains on.
  const int launched = launcher_world_size();
  Communicator* comm = nullptr;
  if (launched == 1 || built_with_mpi()) comm = &world();
  const int rank = comm ? comm->rank() : 0, world_size = comm ? comm->world_size() : launched;
  const int local_rank = comm ? comm->local_rank() : 0;
  const std::string rank_device =
      gpus.empty() ? std::string("cpu") : fmt::format("cuda:{}", local_rank % static_cast<int>(gpus.size()));
  const std::string dist_line = fmt::format(
      "world size {}, rank {} (local rank {}), device {}{}; MPI {}, NCCL {}", world_size, rank, local_rank,
      rank_device, comm ? "" : " (this mpx was built without MPI: `mpx train` would refuse this job)",
      built_with_mpi() ? "built in" : "not built in", built_with_nccl() ? "built in" : "not built in");
  CudaLibraryVersions versions = cuda_library_versions();
  add_nccl_versions(versions);
  const std::string cudnn_warning = cudnn_version_warning(versions.cudnn_built, versions.cudnn);
  const std::string no_gpu_line =
      built_with_cuda ? "no CUDA device found" : "no CUDA device: this mpx was built without CUDA";

  if (json) {
    nlohmann::ordered_json j;
    j["cpu"] = {{"name", "cpu"},
                {"model", cpu.model},
                {"threads", cpu.threads},
                {"amx_bf16", cpu.amx_bf16},
                {"avx512f", cpu.avx512f},
                {"avx512_bf16", cpu.avx512_bf16},
                {"avx2", cpu.avx2},
                {"f16c", cpu.f16c},
                {"auto_policy", policy_name(cpu_policy)},
                {"auto_reason", cpu_reason},
                {"library", cpu_library},
                {"math_bfloat16", cpu_info.math_bf16},
                {"math_float16", cpu_info.math_f16}};
    j["cuda_built"] = built_with_cuda;
    j["cuda"] = nlohmann::ordered_json::array();
    for (const auto& d : gpus) {
      std::string reason;
      const Policy p = resolve_policy(Policy::Auto, d, &reason);
      j["cuda"].push_back({{"name", d.name},
                           {"description", d.description},
                           {"compute_capability", fmt::format("{}.{}", d.compute_capability / 10,
                                                              d.compute_capability % 10)},
                           {"memory_gib", gib_in(d.description)},
                           {"tensor_cores", d.compute_capability >= 70},
                           {"bf16", d.compute_capability >= 80},
                           {"auto_policy", policy_name(p)},
                           {"auto_reason", reason}});
    }
    if (built_with_cuda)
      j["libraries"] = {{"driver", format_cuda_version(versions.driver)},
                        {"runtime", format_cuda_version(versions.runtime)},
                        {"runtime_built", format_cuda_version(versions.runtime_built)},
                        {"cudnn", format_cudnn_version(versions.cudnn)},
                        {"cudnn_built", format_cudnn_version(versions.cudnn_built)},
                        {"cublaslt", format_library_version(versions.cublaslt)},
                        {"cublaslt_built", format_library_version(versions.cublaslt_built)},
                        {"nccl", versions.nccl_built ? format_library_version(versions.nccl) : "not built in"},
                        {"nccl_built", versions.nccl_built ? format_library_version(versions.nccl_built)
                                                           : "not built in"},
                        {"warning", cudnn_warning}};
    j["dist"] = {{"world_size", world_size}, {"rank", rank}, {"local_rank", local_rank},
                 {"device", rank_device}, {"mpi", built_with_mpi()}, {"nccl", built_with_nccl()}};
    if (gpus.empty()) j["note"] = no_gpu_line;
    print_json(j);
    command_exit_code() = kExitOk;
    return;
  }

  std::cout << "cpu: " << cpu.model << '\n'
            << fmt::format("  threads       {}\n", cpu.threads)
            << fmt::format("  AMX-BF16      {}\n", yes_no(cpu.amx_bf16))
            << fmt::format("  AVX-512       {}{}\n", yes_no(cpu.avx512f),
                           cpu.avx512_bf16 ? " (with AVX512-BF16)" : "")
            << fmt::format("  AVX2          {}\n", yes_no(cpu.avx2))
            << fmt::format("  F16C          {}\n", yes_no(cpu.f16c))
            << fmt::format("  library       {}\n", cpu_library)
            << fmt::format("  bfloat16 math {}\n", cpu_info.math_bf16)
            << fmt::format("  float16 math  {}\n", cpu_info.math_f16)
            << fmt::format("  policy auto   {}{}\n", policy_name(cpu_policy),
                           cpu_reason.empty() ? "" : " (" + cpu_reason + ")");
  if (gpus.empty()) {
    std::cout << '\n' << no_gpu_line << '\n';
  }
  if (built_with_cuda) {
    std::cout << "\nlibraries: " << describe_versions(versions) << '\n';
    if (!cudnn_warning.empty()) std::cout << "  warning: " << cudnn_warning << '\n';
  }
  std::cout << "\ndistributed: " << dist_line << '\n';
  for (const auto& d : gpus) {
    std::string reason;
    const Policy p = resolve_policy(Policy::Auto, d, &reason);
    const int cc = d.compute_capability;
    std::cout << '\n'
              << d.name << ": " << d.description << '\n'
              << fmt::format("  compute capability  {}.{}\n", cc / 10, cc % 10)
              << fmt::format("  memory              {:.1f} GiB\n", gib_in(d.description))
              << fmt::format("  Tensor Cores        {}\n", yes_no(cc >= 70))
              << fmt::format("  bfloat16            {}\n", yes_no(cc >= 80))
              << fmt::format("  policy auto         {}{}\n", policy_name(p), reason.empty() ? "" : " (" + reason + ")");
  }
  command_exit_code() = kExitOk;
}

}  // namespace

void add_devices_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("devices", "List the CPU and CUDA GPUs and the policy `auto` would choose on each");
  cmd->add_flag("--json", *json, "Print one JSON object on stdout");
  cmd->callback([json] { run_devices(*json); });
}

}  // namespace mpx::app
