// SPDX-License-Identifier: MIT
// End-to-end tests of the `mpx` binary: each runs it in a temporary folder
// (std::system, or fork+exec for the SIGINT test) and checks the exit code,
// the text on stdout/stderr and the files of the run directory.
#include <catch2/catch.hpp>
#include <mpx/config.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <regex>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "config/config.h"
#include "support/cli.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- helpers -------------------------------------------------------------------

using support::read_file;
using support::Run;
using support::run_mpx;
using support::write_file;

struct TempDir : support::TempDir {
  TempDir() : support::TempDir("mpx_cli") {}
};

std::string read_text(const fs::path& p) { return read_file(p); }
void write_text(const fs::path& p, const std::string& s) { write_file(p, s); }

json read_json(const fs::path& p) {
  INFO("reading " << p);
  REQUIRE(fs::exists(p));
  return json::parse(read_text(p));
}

const std::string kMnist = std::string(MPX_SHARED_DATA) + "/mnist";

/// A small real-MNIST config: 2000 training and 500 test images, one epoch.
std::string mnist_config(const std::string& data_path, const std::string& extra = "") {
  return "name: cli_mnist\n"
         "seed: 7\n"
         "device: cpu\n"
         "policy: float32\n"
         "data:\n"
         "  dataset: mnist\n"
         "  path: " + data_path + "\n"
         "  batch_size: 64\n"
         "  train_limit: 2000\n"
         "  test_limit: 500\n"
         "model:\n"
         "  layers:\n"
         "    - {type: conv2d, filters: 8, kernel: 3, activation: relu}\n"
         "    - {type: max_pool, pool_size: 2}\n"
         "    - {type: flatten}\n"
         "    - {type: dense, units: 10, activation: softmax}\n"
         "optimizer:\n"
         "  name: adam\n"
         "  learning_rate: 2.0e-3\n"
         "train:\n"
         "  epochs: 1\n"
         "  log_every: 5\n" + extra;
}

/// A config on the synthetic data set (no files): a small dense model.
std::string synthetic_config(const std::string& policy = "float32", double lr = 1e-3, int epochs = 1,
                             int train_limit = 256, int log_every = 2) {
  return "name: cli_synth\n"
         "seed: 3\n"
         "device: cpu\n"
         "policy: " + policy + "\n"
         "data:\n"
         "  dataset: synthetic\n"
         "  batch_size: 32\n"
         "  train_limit: " + std::to_string(train_limit) + "\n"
         "  test_limit: 64\n"
         "model:\n"
         "  layers:\n"
         "    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
         "    - {type: max_pool, pool_size: 2}\n"
         "    - {type: flatten}\n"
         "    - {type: dense, units: 32, activation: relu}\n"
         "    - {type: dense, units: 10, activation: softmax, dtype: float32}\n"
         "optimizer:\n"
         "  name: adam\n"
         "  learning_rate: " + std::to_string(lr) + "\n"
         "train:\n"
         "  epochs: " + std::to_string(epochs) + "\n"
         "  log_every: " + std::to_string(log_every) + "\n";
}

/// One MNIST training shared by the tests that need a finished run (trained once).
struct MnistRun {
  TempDir dir;
  Run run;
  fs::path run_dir;
  MnistRun() {
    write_text(dir.path / "mnist.yaml", mnist_config(kMnist));
    run = run_mpx("train --config mnist.yaml --run-dir run --no-progress", dir.path);
    run_dir = dir.path / "run";
  }
};

MnistRun& mnist_run() {
  static MnistRun r;
  return r;
}

}  // namespace

// ---- the command line itself ----------------------------------------------------

TEST_CASE("mpx --version prints the project version", "[cli]") {
  TempDir t;
  const Run r = run_mpx("--version", t.path);
  CHECK(r.code == 0);
  CHECK(r.out == std::string("mpx ") + MPX_VERSION + "\n");
}

TEST_CASE("mpx --help lists every command and exits 0", "[cli]") {
  TempDir t;
  const Run r = run_mpx("--help", t.path);
  CHECK(r.code == 0);
  CHECK(r.out.find("6 an output could not be") != std::string::npos);  // every exit code is listed
  for (const char* c : {"train", "eval", "bench", "validate", "devices", "compare", "sweep"}) {
    INFO(c);
    CHECK(r.out.find(c) != std::string::npos);
  }
  const Run sub = run_mpx("train --help", t.path);
  CHECK(sub.code == 0);
  CHECK(sub.out.find("--config") != std::string::npos);
  CHECK(sub.out.find("--set") != std::string::npos);
  CHECK(sub.out.find("--resume") != std::string::npos);
}

TEST_CASE("usage errors exit 2", "[cli]") {
  TempDir t;
  SECTION("unknown flag") {
    const Run r = run_mpx("--frobnicate", t.path);
    CHECK(r.code == 2);
    CHECK(r.err.find("frobnicate") != std::string::npos);
  }
  SECTION("unknown command") {
    const Run r = run_mpx("frobnicate", t.path);
    CHECK(r.code == 2);
    CHECK(r.err.find("unknown command 'frobnicate'; 'mpx --help' lists the commands") != std::string::npos);
    const Run typo = run_mpx("trian --config c.yaml", t.path);
    CHECK(typo.code == 2);
    CHECK(typo.err.find("unknown command 'trian' (did you mean 'train'?)") != std::string::npos);
  }
  SECTION("no command") { CHECK(run_mpx("", t.path).code == 2); }
  SECTION("train without --config") {
    const Run r = run_mpx("train", t.path);
    CHECK(r.code == 2);
    CHECK(r.err.find("--config is required") != std::string::npos);
  }
  SECTION("config file that does not exist") {
    const Run r = run_mpx("train --config nope.yaml", t.path);
    CHECK(r.code == 2);
    CHECK(r.err.find("nope.yaml") != std::string::npos);
  }
  SECTION("--set without '='") {
    write_text(t.path / "c.yaml", synthetic_config());
    CHECK(run_mpx("validate --config c.yaml --set train.epochs", t.path).code == 2);
  }
  SECTION("--steps and --epochs together") {
    write_text(t.path / "c.yaml", synthetic_config());
    CHECK(run_mpx("compare --config c.yaml --steps 2 --epochs 1", t.path).code == 2);
  }
}

// ---- train ------------------------------------------------------------------------

TEST_CASE("train on an MNIST subset writes a complete run directory", "[cli][train]") {
  MnistRun& m = mnist_run();
  REQUIRE(m.run.code == 0);
  CHECK(m.run.out.find("run directory: run") != std::string::npos);
  CHECK(m.run.out.find("completed") != std::string::npos);

  const fs::path d = m.run_dir;
  CHECK(fs::exists(d / "config.yaml"));
  CHECK(fs::exists(d / "train.log"));
  CHECK(fs::file_size(d / "train.log") > 0);
  CHECK(fs::exists(d / "checkpoints" / "last.ckpt"));

  std::ifstream metrics(d / "metrics.jsonl");
  REQUIRE(metrics.good());
  int lines = 0, step_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    if (line.empty()) continue;
    ++lines;
    json j;
    REQUIRE_NOTHROW(j = json::parse(line));
    REQUIRE(j.is_object());
    if (j.contains("step") && j.contains("loss")) ++step_lines;
  }
  CHECK(lines > 0);
  CHECK(step_lines > 0);

  const json s = read_json(d / "summary.json");
  CHECK(s.at("status") == "completed");
  CHECK(s.at("exit_code") == 0);
  CHECK(s.at("steps").get<int64_t>() == 32);  // ceil(2000 / 64)
  CHECK(s.at("final_test_accuracy").get<double>() > 0.5);
  CHECK(s.at("policy") == "float32");
  CHECK(s.at("device") == "cpu");
}

TEST_CASE("a bad config key exits 2 and names the key", "[cli][train]") {
  TempDir t;
  std::string cfg = synthetic_config();
  cfg.replace(cfg.find("learning_rate"), 13, "learnig_rate");
  write_text(t.path / "bad.yaml", cfg);
  const Run r = run_mpx("train --config bad.yaml --run-dir run --no-progress", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("learnig_rate") != std::string::npos);
}

TEST_CASE("a bad --set key exits 2 and names the key", "[cli][train]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config());
  const Run r = run_mpx("train --config c.yaml --set optimizer.learnig_rate=0.1 --run-dir run", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("learnig_rate") != std::string::npos);
}

TEST_CASE("missing data exits 3 and names the fetch script", "[cli][train]") {
  TempDir t;
  write_text(t.path / "c.yaml", mnist_config((t.path / "no_such_folder").string()));
  const Run r = run_mpx("train --config c.yaml --run-dir run --no-progress", t.path);
  CHECK(r.code == 3);
  CHECK(r.err.find("data_scripts/get_mnist.sh") != std::string::npos);
}

TEST_CASE("a truncated data file exits 3", "[cli][train]") {
  TempDir t;
  const fs::path data = t.path / "mnist";
  fs::create_directories(data);
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    fs::create_symlink(fs::path(kMnist) / f, data / f);
  }
  {
    std::ifstream in(fs::path(kMnist) / "train-images-idx3-ubyte.gz", std::ios::binary);
    std::vector<char> head(200000);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream out(data / "train-images-idx3-ubyte.gz", std::ios::binary);
    out.write(head.data(), in.gcount());
  }
  write_text(t.path / "c.yaml", mnist_config(data.string()));
  const Run r = run_mpx("train --config c.yaml --run-dir run --no-progress", t.path);
  CHECK(r.code == 3);
  CHECK(r.err.find("train-images-idx3-ubyte") != std::string::npos);
}

TEST_CASE("a diverging float32 run exits 4 with status diverged", "[cli][train]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config("float32", 1e12));
  const Run r = run_mpx("train --config c.yaml --run-dir run --no-progress", t.path);
  CHECK(r.code == 4);
  const json s = read_json(t.path / "run" / "summary.json");
  CHECK(s.at("status") == "diverged");
  CHECK(s.at("exit_code") == 4);
}

TEST_CASE("--resume of a path that does not exist exits 2", "[cli][train]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config());
  const Run r = run_mpx("train --config c.yaml --resume no_such_run --run-dir run", t.path);
  CHECK(r.code == 2);
  CHECK(r.err.find("no_such_run") != std::string::npos);
}

TEST_CASE("--set overrides reach the run's config.yaml", "[cli][train]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config());
  const Run r = run_mpx(
      "train --config c.yaml --set optimizer.learning_rate=0.01 --set train.max_steps=3 --run-dir run --no-progress",
      t.path);
  REQUIRE(r.code == 0);
  const mpx::Config resolved = mpx::load_config((t.path / "run" / "config.yaml").string());
  CHECK(resolved.optimizer.learning_rate == 0.01);
  CHECK(resolved.train.max_steps == 3);
  const json s = read_json(t.path / "run" / "summary.json");
  CHECK(s.at("steps").get<int64_t>() == 3);
}

TEST_CASE("train --json prints the summary", "[cli][train]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config());
  const Run r = run_mpx("train --config c.yaml --set train.max_steps=2 --run-dir run --no-progress --json", t.path);
  REQUIRE(r.code == 0);
  json j;
  REQUIRE_NOTHROW(j = json::parse(r.out));
  CHECK(j.at("status") == "completed");
  CHECK(j.at("steps").get<int64_t>() == 2);
}

// ---- eval -------------------------------------------------------------------------

TEST_CASE("eval --json is reproducible and matches the run's final accuracy", "[cli][eval]") {
  MnistRun& m = mnist_run();
  REQUIRE(m.run.code == 0);
  const std::string args = "eval --config mnist.yaml --checkpoint run/checkpoints/last.ckpt --json";
  const Run a = run_mpx(args, m.dir.path);
  const Run b = run_mpx(args, m.dir.path);
  REQUIRE(a.code == 0);
  REQUIRE(b.code == 0);
  CHECK(a.out == b.out);
  json j;
  REQUIRE_NOTHROW(j = json::parse(a.out));
  CHECK(j.size() == 6);  // loss, accuracy, count, policy, per_class_accuracy, confusion_matrix
  CHECK(j.at("count") == 500);
  CHECK(j.at("confusion_matrix").size() == 10);
  CHECK(j.at("policy") == "float32");
  CHECK(j.at("loss").is_number());
  const json s = read_json(m.run_dir / "summary.json");
  CHECK(j.at("accuracy").get<double>() == Approx(s.at("final_test_accuracy").get<double>()).epsilon(1e-12));

  SECTION("text output, config taken from the run directory") {
    const Run t = run_mpx("eval --checkpoint run", m.dir.path);
    CHECK(t.code == 0);
    CHECK(t.out.find("accuracy") != std::string::npos);
  }
}

// ---- bench, validate, devices, compare --------------------------------------------

TEST_CASE("bench --json has every key", "[cli][bench]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config());
  const Run r = run_mpx("bench --config c.yaml --steps 3 --warmup 1 --json", t.path);
  REQUIRE(r.code == 0);
  json j;
  REQUIRE_NOTHROW(j = json::parse(r.out));
  for (const char* k : {"images_per_sec", "step_ms_median", "step_ms_min", "step_ms_max", "peak_memory_bytes",
                        "policy", "device", "batch_size"}) {
    INFO(k);
    CHECK(j.contains(k));
  }
  CHECK(j.at("images_per_sec").get<double>() > 0);
  CHECK(j.at("step_ms_min").get<double>() <= j.at("step_ms_max").get<double>());
  CHECK(j.at("batch_size") == 32);
  CHECK(j.at("device") == "cpu");
  REQUIRE(j.contains("plans"));  // the CUDA backend's cuDNN / cuBLASLt plans; none on the CPU
  CHECK(j.at("plans").is_array());
  CHECK(j.at("plans").empty());
}

TEST_CASE("validate prints the resolved config and the model summary with dtypes", "[cli][validate]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config("mixed_bfloat16"));
  const Run r = run_mpx("validate --config c.yaml", t.path);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("learning_rate") != std::string::npos);  // the resolved YAML
  CHECK(r.out.find("bfloat16") != std::string::npos);       // compute dtype of the hidden layers
  CHECK(r.out.find("float32") != std::string::npos);        // variable dtype, output layer
  CHECK(r.out.find("activations") != std::string::npos);    // memory report

  SECTION("a bad config exits 2") {
    write_text(t.path / "bad.yaml", synthetic_config() + "bogus_key: 1\n");
    const Run b = run_mpx("validate --config bad.yaml", t.path);
    CHECK(b.code == 2);
    CHECK(b.err.find("bogus_key") != std::string::npos);
  }
}

TEST_CASE("devices lists the CPU and says whether there is a CUDA device", "[cli][devices]") {
  TempDir t;
  const Run r = run_mpx("devices", t.path);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("cpu") != std::string::npos);
  const Run j = run_mpx("devices --json", t.path);
  REQUIRE(j.code == 0);
  json d;
  REQUIRE_NOTHROW(d = json::parse(j.out));
  CHECK(d.at("cpu").at("threads").get<int>() > 0);
  if (d.at("cuda_built").get<bool>()) {  // the library versions (docs/gpu.md), built with and loaded
    REQUIRE(d.contains("libraries"));
    const json& l = d.at("libraries");
    for (const char* k : {"cudnn_built", "cublaslt_built"}) {
      INFO(k << " = " << l.at(k));
      CHECK(std::regex_match(l.at(k).get<std::string>(), std::regex("[0-9]+\\.[0-9]+\\.[0-9]+")));
    }
    CHECK(std::regex_match(l.at("runtime_built").get<std::string>(), std::regex("[0-9]+\\.[0-9]+")));
    CHECK(l.at("warning").is_string());
    CHECK(r.out.find("libraries: CUDA driver ") != std::string::npos);
  } else {
    CHECK_FALSE(d.contains("libraries"));
  }
  if (mpx::cuda_device_count() == 0) {
    CHECK(r.out.find("no CUDA device") != std::string::npos);
    CHECK(d.at("cuda").empty());
  } else {
    CHECK(r.out.find("cuda:0") != std::string::npos);
    CHECK(d.at("cuda").size() == static_cast<size_t>(mpx::cuda_device_count()));
  }
}

TEST_CASE("compare trains each policy and prints one row each", "[cli][compare]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config());
  const Run r = run_mpx("compare --config c.yaml --policies float32,mixed_bfloat16 --steps 4 --run-dir cmp "
                        "--no-progress --json",
                        t.path);
  REQUIRE(r.code == 0);
  json a;
  REQUIRE_NOTHROW(a = json::parse(r.out));
  REQUIRE(a.is_array());
  REQUIRE(a.size() == 2);
  CHECK(a[0].at("policy") == "float32");
  CHECK(a[1].at("policy") == "mixed_bfloat16");
  for (const auto& row : a) {
    for (const char* k : {"final_loss", "test_accuracy", "accuracy_gap_points", "images_per_sec", "speedup",
                          "activation_mib", "activation_saving_percent", "peak_memory_bytes", "skipped_steps",
                          "final_loss_scale"}) {
      INFO(k);
      CHECK(row.contains(k));
    }
    CHECK(row.at("status") == "completed");
    CHECK(row.at("steps") == 4);
  }
  CHECK(a[0].at("accuracy_gap_points").get<double>() == 0.0);
  CHECK(a[0].at("speedup").get<double>() == Approx(1.0));
  // 16-bit activations take less memory than float32 ones.
  CHECK(a[1].at("activation_mib").get<double>() < a[0].at("activation_mib").get<double>());
  CHECK(fs::exists(t.path / "cmp" / "float32" / "summary.json"));
  CHECK(fs::exists(t.path / "cmp" / "mixed_bfloat16" / "summary.json"));
  CHECK(fs::exists(t.path / "cmp" / "compare.json"));

  SECTION("the table") {
    const Run tab = run_mpx("compare --config c.yaml --policies float32,mixed_bfloat16 --steps 2 --run-dir cmp2 "
                            "--no-progress",
                            t.path);
    CHECK(tab.code == 0);
    CHECK(tab.out.find("speed-up") != std::string::npos);
    CHECK(tab.out.find("mixed_bfloat16") != std::string::npos);
  }
}

// ---- signals ----------------------------------------------------------------------

TEST_CASE("SIGINT stops training with a checkpoint, status interrupted and exit 130", "[cli][signal]") {
  TempDir t;
  write_text(t.path / "c.yaml", synthetic_config("float32", 1e-3, 200, 1024, 1));
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::chdir(t.path.c_str()) != 0) ::_exit(121);
    if (!std::freopen(".mpx_stdout", "w", stdout) || !std::freopen(".mpx_stderr", "w", stderr)) ::_exit(122);
    ::execl(MPX_BINARY, "mpx", "train", "--config", "c.yaml", "--run-dir", "run", "--no-progress",
            static_cast<char*>(nullptr));
    ::_exit(123);
  }
  // Wait until it has logged a step.
  const fs::path metrics = t.path / "run" / "metrics.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool logged = false;
  int status = 0;
  bool exited_early = false;
  while (std::chrono::steady_clock::now() < deadline) {
    std::error_code ec;
    if (fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0) {
      logged = true;
      break;
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      exited_early = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  INFO("stderr:\n" << read_text(t.path / ".mpx_stderr"));
  if (!logged && !exited_early) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  REQUIRE_FALSE(exited_early);
  REQUIRE(logged);

  REQUIRE(::kill(pid, SIGINT) == 0);
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool done = false;
  while (std::chrono::steady_clock::now() < stop_deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      done = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!done) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  REQUIRE(done);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  const json s = read_json(t.path / "run" / "summary.json");
  CHECK(s.at("status") == "interrupted");
  CHECK(s.at("exit_code") == 130);
  CHECK(fs::exists(t.path / "run" / "checkpoints" / "last.ckpt"));
}
