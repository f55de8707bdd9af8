// SPDX-License-Identifier: MIT
// The `mpx` entry point: wires the sub-commands together (one file each),
// sets up console logging and the SIGINT/SIGTERM/SIGHUP watcher, and turns every
// failure (a failed write to stdout or stderr included) into one message and the
// exit code of docs/design.md, in one place.
#include <mpx/config.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <csignal>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "commands.h"
#include "core/env.h"
#include "config/yaml_tree.h"
#include "core/error.h"
#include "core/live_line.h"
#include "io/run_dir.h"
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

/// SIGINT, SIGTERM and SIGHUP never interrupt a computing thread: they stay blocked in every
/// thread (blocked since the start, omp_wait_policy.cpp, and inherited by the threads
/// OpenMP, oneDNN and MPI start later), and one watcher thread takes them with sigwait().
/// A handler running on a compute thread is not safe: oneDNN's AVX-512 f32 GEMM kernels
/// point the stack pointer into the heap while they run, so a handler's frame pushed
/// there corrupts the heap (docs/design.md, "Signals").
/// First signal: a command that saves state (train, compare, bench: it called
/// app::stop_at_step_boundary()) is asked to stop after the current step (it saves `last`,
/// writes summary.json and exits 130); if it has not ended `timeout` seconds later, the
/// process ends with exit 130 and says that no checkpoint was written. Any other command ends
/// at once with exit 130. A second signal: the signal's default action.
void say(const std::string& line) {
  // The progress line is wiped with the message itself: stdio's stderr lock may be held by a
  // thread that is blocked writing, and this must not wait for it.
  const std::string text = (mpx::live_line::shown() ? "\r\033[K" : "") + line + "\n";
  (void)!::write(STDERR_FILENO, text.data(), text.size());  // never waits on spdlog's lock
}

[[noreturn]] void end_now(const std::string& why) {
  say("error: " + why);
  mpx::remove_temp_files_in_progress();
  ::_exit(mpx::kExitInterrupted);
}

void watch_stop_signals(sigset_t set, int timeout_s) {
  int sig = 0;
  if (sigwait(&set, &sig) != 0) return;
  mpx::stop_requested().store(true);
  const std::string name = sigabbrev_np(sig) ? std::string("SIG") + sigabbrev_np(sig) : "signal";
  if (!mpx::app::stop_at_step_boundary().load())
    end_now(fmt::format("interrupted by {}: stopped (nothing of this command to save)", name));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0)) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    const int got = sigtimedwait(&set, nullptr, &ts);
    if (got > 0) {  // a second stop signal: its default action
      std::signal(got, SIG_DFL);
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // in this thread only: the raise below ends the process
      std::raise(got);
      return;
    }
    if (errno != EINTR && errno != EAGAIN) break;
  }
  end_now(fmt::format("interrupted by {}, and the command did not reach the end of a step within {} s "
                      "(MPX_STOP_TIMEOUT_S): stopped without writing a checkpoint; checkpoints/last.ckpt, if "
                      "there is one, is from an earlier step, and summary.json was not updated",
                      name, timeout_s));
}

void install_signal_handlers(int timeout_s) {
  (void)mpx::stop_requested();  // initialise the statics before the watcher can touch them
  (void)mpx::app::stop_at_step_boundary();
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  // SIGHUP (a closed terminal or ssh session) is a stop request too, unless it was ignored
  // when mpx started (nohup): then it stays ignored.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&stop, SIGHUP);
  // Blocked since the start already; blocked here too for a build without the preinit step.
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  // A signal that arrived during the start-up is pending: the watcher takes it at once.
  std::thread(watch_stop_signals, stop, timeout_s).detach();
}

/// stdout and stderr are outputs too: a write to either that failed (a full disk, a closed
/// file) is exit 6, after the command's own outcome (docs/design.md, "Errors and exit codes").
int check_standard_streams(int rc) {
  std::cout.flush();
  errno = 0;
  const bool out_failed = std::fflush(stdout) != 0 || std::ferror(stdout) || std::cout.bad();
  int out_err = errno;
  // The failing write may have been an earlier one (its errno is gone): ask the descriptor again.
  if (out_failed && out_err == 0 && ::write(STDOUT_FILENO, "\n", 1) < 0) out_err = errno;
  if (out_failed) {
    spdlog::error("cannot write the standard output{}: the output is lost",
                  out_err != 0 ? std::string(": ") + std::strerror(out_err) : std::string());
  }
  std::fflush(stderr);
  const bool err_failed = std::ferror(stderr) != 0;
  if (rc == mpx::kExitOk && (out_failed || err_failed)) return mpx::kExitIo;
  return rc;
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  setup_logging();
  int stop_timeout_s = 10;
  try {
    stop_timeout_s = static_cast<int>(mpx::env_int("MPX_STOP_TIMEOUT_S", 10, 1, 3600));
  } catch (const mpx::Error& e) {
    spdlog::error("{}", e.what());
    return e.exit_code();
  }
  install_signal_handlers(stop_timeout_s);
  return check_standard_streams(run(argc, argv));
}

int run(int argc, char** argv) {
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
