#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Set-up and the whole test suite: installs the Debian packages, builds in
# Release and runs every test with CTest. Tests read the real data sets from
# ../shared/data (or MPX_DATA_MIRROR); CUDA tests report themselves skipped
# where no GPU is present.
#
# Then the sanitizer stage (docs/testing.md, "Sanitizers and fuzzing in CI"):
# the `fuzz` preset (clang, AddressSanitizer + UBSan, CPU only) in build-fuzz/,
# the fast tests under it, and every libFuzzer target for MPX_CI_FUZZ_SECONDS
# (default 30) each. MPX_CI_SANITIZERS=0 skips the stage.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage prints its wall time, so a CI log shows where the run's minutes go.
stage() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "test.sh: $name took $((SECONDS - t0)) s ($SECONDS s since the start)"
}

stage "set-up" scripts/install_deps.sh
stage "Release build" scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
export MPX_DATA_MIRROR=${MPX_DATA_MIRROR:-$(cd .. && pwd)/shared/data}
stage "Release tests" ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900 -j"$(nproc)"

if [[ ${MPX_CI_SANITIZERS:-1} == 0 ]]; then
  echo "test.sh: MPX_CI_SANITIZERS=0: sanitizer build, tests and fuzzing skipped"
  exit 0
fi
MPX_PRESET=fuzz BUILD_DIR= stage "sanitizer build" scripts/build.sh
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  stage "sanitizer tests" ctest --test-dir build-fuzz -L fast --output-on-failure --timeout 900 -j"$(nproc)"
stage "fuzzing" scripts/fuzz.sh "${MPX_CI_FUZZ_SECONDS:-30}"
