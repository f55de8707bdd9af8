// SPDX-License-Identifier: MIT
// The `mpx` entry point: wires the sub-commands together (one file each),
// sets up console logging and the SIGINT/SIGTERM handlers, and turns every
// failure into one message and the exit code of docs/design.md, in one place.
#include <mpx/config.hpp>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "commands.h"
#include "config/yaml_tree.h"
#include "core/error.h"
#include "core/live_line.h"
#include "train/trainer.h"

namespace {

// ---- console logging --------------------------------------------------------

/// stderr sink: info lines are the bare message, warnings and errors carry
/// their level ("warning: ...", "error: ..."), coloured on a terminal. stdout
/// stays free for machine-readable output (--json).
class ConsoleSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  ConsoleSink() : color_(::isatty(STDERR_FILENO) != 0) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const char* prefix = "";
    const char* color = "";
    switch (msg.level) {
      case spdlog::level::trace: prefix = "trace: "; break;
      case spdlog::level::debug: prefix = "debug: "; break;
      case spdlog::level::warn: prefix = "warning: "; color = "\033[33m"; break;
      case spdlog::level::err: prefix = "error: "; color = "\033[31m"; break;
      case spdlog::level::critical: prefix = "critical: "; color = "\033[1;31m"; break;
      default: break;
    }
    mpx::live_line::clear();  // a log line never starts in the middle of the progress line
    const bool paint = color_ && *color != '\0';
    std::fprintf(stderr, "%s%s%s%.*s\n", paint ? color : "", prefix, paint ? "\033[0m" : "",
                 static_cast<int>(msg.payload.size()), msg.payload.data());
  }
  void flush_() override { std::fflush(stderr); }

 private:
  bool color_;
};

std::shared_ptr<ConsoleSink> g_console;

/// The logger passes info and up (the trainer adds the train.log sink to it);
/// -q/-v change only what the console shows (and -v lets debug through).
void setup_logging() {
  g_console = std::make_shared<ConsoleSink>();
  auto logger = std::make_shared<spdlog::logger>("mpx", g_console);
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

// ---- signals ----------------------------------------------------------------

/// SIGINT and SIGTERM never interrupt a computing thread: they stay blocked in every
/// thread (blocked since the start, omp_wait_policy.cpp, and inherited by the threads
/// OpenMP, oneDNN and MPI start later), and one watcher thread takes them with sigwait().
/// A handler running on a compute thread is not safe: oneDNN's AVX-512 f32 GEMM kernels
/// point the stack pointer into the heap while they run, so a handler's frame pushed
/// there corrupts the heap (docs/design.md, "Signals").
/// First SIGINT/SIGTERM: ask the trainer to stop after the current step (it saves
/// `last`, writes summary.json and exits 130). A second one: the default action.
void watch_stop_signals(sigset_t set) {
  int sig = 0;
  if (sigwait(&set, &sig) != 0) return;
  mpx::stop_requested().store(true);
  if (sigwait(&set, &sig) != 0) return;
  std::signal(sig, SIG_DFL);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // in this thread only: the raise below ends the process
  std::raise(sig);
}

void install_signal_handlers() {
  (void)mpx::stop_requested();  // initialise the static before the watcher can touch it
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  // Blocked since the start already; blocked here too for a build without the preinit step.
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  // A signal that arrived during the start-up is pending: the watcher takes it at once.
  std::thread(watch_stop_signals, stop).detach();
}

}  // namespace

int main(int argc, char** argv) {
  setup_logging();
  install_signal_handlers();

  CLI::App app{"mpx: mixed-precision CNN training (float32, mixed_float16, mixed_bfloat16) on\n"
               "NVIDIA GPUs (cuDNN/cuBLAS) or the CPU, driven by one YAML config.\n"
               "Exit codes: 0 done, 1 internal error, 2 bad command line or config, 3 data missing\n"
               "or corrupt, 4 training diverged, 5 out of device memory, 6 an output could not be\n"
               "written, 130 interrupted.",
               "mpx"};
  app.set_version_flag("--version", std::string("mpx ") + MPX_VERSION, "Print the version and exit");
  // At most one; "none" is reported after parsing so that an unknown flag or
  // command gets CLI11's precise message rather than "a subcommand is required".
  app.require_subcommand(0, 1);
  app.fallthrough();  // -v/-q are accepted after the sub-command too
  app.option_defaults()->always_capture_default();
  app.footer("Run 'mpx <command> --help' for the options of a command.");

  bool verbose = false, quiet = false;
  auto* v = app.add_flag("-v,--verbose", verbose, "Also log debug messages");
  app.add_flag("-q,--quiet", quiet, "Log warnings and errors only")->excludes(v);

  mpx::app::add_train_command(app);
  mpx::app::add_eval_command(app);
  mpx::app::add_bench_command(app);
  mpx::app::add_compare_command(app);
  mpx::app::add_report_command(app);
  mpx::app::add_sweep_command(app);
  mpx::app::add_validate_command(app);
  mpx::app::add_devices_command(app);
  mpx::app::add_export_command(app);
  mpx::app::add_inspect_command(app);
  mpx::app::add_config_reference_command(app);

  // The log level must be set before a sub-command's callback runs.
  app.parse_complete_callback([&] {
    if (verbose) spdlog::set_level(spdlog::level::debug);
    if (quiet) g_console->set_level(spdlog::level::warn);
  });

  // An unknown command: CLI11 would say only that the word was not expected.
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      const std::string near = mpx::config_detail::closest_match(word, names);
      spdlog::error("unknown command '{}'{}; 'mpx --help' lists the commands", word,
                    near.empty() ? std::string() : " (did you mean '" + near + "'?)");
      return mpx::kExitUsage;
    }
    break;
  }
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) throw CLI::RequiredError("A subcommand");
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with code 0; every real usage error is exit 2.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : mpx::kExitUsage;
  } catch (const mpx::Error& e) {
    spdlog::error("{}", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    spdlog::error("out of host memory");
    return mpx::kExitInternal;
  } catch (const std::exception& e) {
    spdlog::error("internal error: {}", e.what());
    return mpx::kExitInternal;
  }
  return mpx::app::command_exit_code();
}
