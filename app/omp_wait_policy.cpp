// SPDX-License-Identifier: MIT
// The mpx executable runs libgomp with a short spin before idle threads sleep, unless the user chose
// one. Kept in app/ so that the library and the test executables never re-execute.
#include <signal.h>
#include <unistd.h>

#include <cstring>

// ---- OpenMP wait policy ----------------------------------------------------------
// libgomp's default makes idle threads spin (GOMP_SPINCOUNT 300000 pause loops) after
// every parallel region and at every barrier. On the shared 2-core machines mpx runs
// on, a spinning thread burns the time slice that its partner needs: perf showed ~60%
// of all samples in libgomp's spin loop, and the smoke net at load ~6 ran 2-4x slower
// than with OMP_WAIT_POLICY=passive (threads sleep at once). Sleeping at once costs a
// wake-up between every two parallel regions, though, and a step of a small net has dozens
// of them. So mpx runs libgomp with GOMP_SPINCOUNT=1000: an idle thread spins for a few
// microseconds, long enough to catch the next region of the same step, then sleeps
// (measured figures: docs/cpu-performance.md, "OpenMP threads and their wait policy").
// libgomp reads its environment once, in its initializer, before main(); setenv() in a
// .preinit_array function is too early instead (libc's environ is not set up yet, so the
// change is lost). So the executable re-executes itself once with the variable added,
// unless the user already chose OMP_WAIT_POLICY or GOMP_SPINCOUNT (set either to keep
// libgomp's default). Only the mpx executable does this (this file is part of app/, not of
// the library).
//
// SIGINT, SIGTERM and SIGHUP are blocked from here until main() has installed its handlers
// (app/main.cpp unblocks them): a Ctrl-C during the start-up, the re-execution included
// (the mask and pending signals survive execve), then stops the run through the handler
// instead of killing the process (docs/design.md, "The run directory").
extern "C" {
static void mpx_omp_wait_policy_preinit(int /*argc*/, char** argv, char** envp) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  sigprocmask(SIG_BLOCK, &stop, nullptr);
  if (!argv || !argv[0] || !envp) return;
  constexpr size_t kMax = 4096;
  static char* env[kMax + 2];
  size_t n = 0;
  for (char** e = envp; *e; ++e) {
    if (std::strncmp(*e, "OMP_WAIT_POLICY=", 16) == 0 || std::strncmp(*e, "GOMP_SPINCOUNT=", 15) == 0) return;
    if (n == kMax) return;
    env[n++] = *e;
  }
  static char spin[] = "GOMP_SPINCOUNT=1000";
  env[n++] = spin;
  env[n] = nullptr;
  execve("/proc/self/exe", argv, env);  // returns only on failure: then run with the default
}
__attribute__((section(".preinit_array"), used)) static void (*const mpx_omp_preinit_entry)(int, char**, char**) =
    &mpx_omp_wait_policy_preinit;
}

