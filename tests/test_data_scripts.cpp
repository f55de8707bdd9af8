// SPDX-License-Identifier: MIT
// data_scripts/get_*.sh end to end, offline: copy from the shared mirror into a
// temp folder, load what they wrote, run again (idempotent), fail clearly.
#include <stdlib.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include "support/scratch.h"
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/dataset.h"

namespace fs = std::filesystem;
using namespace mpx;

namespace {

using TempDir = support::ScratchDir;

struct Run {
  int rc;
  std::string out;
};

// Runs `env ... data_scripts/<script> args` with stdout and stderr captured.
Run run_script(const std::string& env, const std::string& script, const std::string& args, const TempDir& tmp) {
  const std::string log = tmp.path + "/log.txt";
  const std::string cmd = "cd '" + tmp.path + "' && env -u MPX_DATA_MIRROR " + env + " '" MPX_SOURCE_DIR
                          "/data_scripts/" + script + "' " + args + " >'" + log + "' 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

const std::string kMirror = std::string("MPX_DATA_MIRROR=") + MPX_SHARED_DATA;

}  // namespace

TEST_CASE("get_mnist.sh copies from a mirror, verifies, and is idempotent", "[data][scripts]") {
  TempDir tmp;
  Run r = run_script(kMirror, "get_mnist.sh", "", tmp);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("SHA-256 of all four files verified"));
  DataConfig c;
  c.dataset = DatasetName::Mnist;
  c.path = tmp.path + "/data/mnist";
  CHECK(load_dataset(c, Split::Train, 1).size() == 60000);
  CHECK(load_dataset(c, Split::Test, 1).size() == 10000);

  r = run_script("", "get_mnist.sh", "", tmp);  // no mirror, nothing to download
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("already present and verified"));

  // A corrupt copy is replaced from the mirror.
  fs::permissions(c.path + "/t10k-labels-idx1-ubyte.gz", fs::perms::owner_write, fs::perm_options::add);
  std::ofstream(c.path + "/t10k-labels-idx1-ubyte.gz", std::ios::trunc) << "junk";
  r = run_script("", "get_mnist.sh", "--from " MPX_SHARED_DATA, tmp);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("does not match the official checksum"));
  CHECK(load_dataset(c, Split::Test, 1).size() == 10000);
}

TEST_CASE("get_cifar10.sh copies the mirror into a given folder", "[data][scripts]") {
  TempDir tmp;
  Run r = run_script(kMirror, "get_cifar10.sh", "out/c10", tmp);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  // The script takes the mirror's whole training set (cifar10/) where it has one, else the
  // subset (cifar10-subset/: the first batch); both have the first 1,000 test records.
  const bool whole = fs::exists(std::string(MPX_SHARED_DATA) + "/cifar10/data_batch_5.bin");
  CHECK_THAT(r.out, Catch::Contains(whole ? "50000 training records in 5 of 5 batch files, 1000 test records"
                                          : "10000 training records in 1 of 5 batch files, 1000 test records"));
  DataConfig c;
  c.dataset = DatasetName::Cifar10;
  c.path = tmp.path + "/out/c10";
  CHECK(load_dataset(c, Split::Test, 1).size() == 1000);
  r = run_script(kMirror, "get_cifar10.sh", "out/c10", tmp);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("already present and verified"));
}

TEST_CASE("get_*.sh fail with a clear message and a non-zero exit", "[data][scripts]") {
  TempDir tmp;
  Run r = run_script("MPX_DATA_MIRROR=/nonexistent/mirror", "get_mnist.sh", "", tmp);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("/nonexistent/mirror"));
  CHECK_THAT(r.out, Catch::Contains("does not exist"));

  // The shared mirror has no Fashion-MNIST (and this machine no Debian package, or it is used).
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) {
    r = run_script(kMirror, "get_fashion_mnist.sh", "", tmp);
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("no Fashion-MNIST files"));
    CHECK_THAT(r.out, Catch::Contains("dataset-fashion-mnist"));
  }
  // MNIST is not Fashion-MNIST, although the format is the same.
  r = run_script("", "get_fashion_mnist.sh", "--from " MPX_SHARED_DATA "/mnist fm", tmp);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("not Fashion-MNIST"));

  r = run_script("", "get_cifar10.sh", "--bogus", tmp);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("unknown option --bogus"));
}
