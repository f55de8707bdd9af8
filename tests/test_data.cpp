// SPDX-License-Identifier: MIT
// Data set readers: the real MNIST and CIFAR-10 subset from shared/data, and
// every header / size / label check on small generated files in temp folders.
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>

#include "support/scratch.h"
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/readers.h"
#include "support/log_capture.h"

namespace fs = std::filesystem;
using namespace mpx;

namespace {

const std::string kShared = MPX_SHARED_DATA;

using TempDir = support::ScratchDir;

using support::write_bytes;

void write_gz(const std::string& path, const std::vector<uint8_t>& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  b.push_back(uint8_t(v >> 24));
  b.push_back(uint8_t(v >> 16));
  b.push_back(uint8_t(v >> 8));
  b.push_back(uint8_t(v));
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(uint8_t(i * 7 + 3));
  return b;
}

std::vector<uint8_t> idx_labels(uint32_t n) {
  std::vector<uint8_t> b;
  put_be32(b, 0x801);
  put_be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(uint8_t(i % 10));
  return b;
}

// A small valid MNIST folder: train 12 records of 4x5, test 6.
void write_small_mnist(const TempDir& d) {
  write_bytes(d.file("train-images-idx3-ubyte"), idx_images(12, 4, 5));
  write_bytes(d.file("train-labels-idx1-ubyte"), idx_labels(12));
  write_bytes(d.file("t10k-images-idx3-ubyte"), idx_images(6, 4, 5));
  write_bytes(d.file("t10k-labels-idx1-ubyte"), idx_labels(6));
}

DataConfig cfg_for(DatasetName dataset, const std::string& path) {
  DataConfig c;
  c.dataset = dataset;
  c.path = path;
  return c;
}

std::string error_of(const DataConfig& c, Split s) {
  try {
    (void)load_dataset(c, s, 1);
  } catch (const DataError& e) {
    CHECK(e.exit_code() == kExitData);
    return e.what();
  }
  FAIL("no DataError thrown");
  return "";
}

std::vector<uint8_t> cifar_record(uint8_t label, uint8_t fill) {
  std::vector<uint8_t> r(3073, fill);
  r[0] = label;
  return r;
}

}  // namespace

// ---- real data --------------------------------------------------------------

TEST_CASE("mnist: the shared copy loads with the official counts, labels and mean", "[data][mnist]") {
  const auto c = cfg_for(DatasetName::Mnist, kShared + "/mnist");
  const Dataset train = load_dataset(c, Split::Train, 1);
  const Dataset test = load_dataset(c, Split::Test, 1);
  CHECK(train.name == "mnist");
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.H == 28);
  CHECK(train.W == 28);
  CHECK(train.C == 1);
  CHECK(train.images.size() == size_t(60000) * 784);
  CHECK(train.labels[0] == 5);
  CHECK(test.labels[0] == 7);
  double sum = 0;
  for (uint8_t v : train.images) sum += v;
  CHECK(sum / 255.0 / double(train.images.size()) == Approx(0.1307).margin(1e-3));
  std::vector<int64_t> per_class(10, 0);
  for (int32_t l : train.labels) per_class.at(l)++;
  for (int64_t k : per_class) CHECK(k > 5000);
}

TEST_CASE("mnist: train_limit and test_limit keep the first records", "[data][mnist]") {
  auto c = cfg_for(DatasetName::Mnist, kShared + "/mnist");
  const Dataset full = load_dataset(c, Split::Test, 1);
  c.train_limit = 100;
  c.test_limit = 37;
  const Dataset train = load_dataset(c, Split::Train, 1);
  const Dataset test = load_dataset(c, Split::Test, 1);
  CHECK(train.size() == 100);
  CHECK(train.images.size() == 100 * 784);
  REQUIRE(test.size() == 37);
  CHECK(std::equal(test.labels.begin(), test.labels.end(), full.labels.begin()));
  CHECK(std::equal(test.images.begin(), test.images.end(), full.images.begin()));
  c.test_limit = 1000000;  // more than there is: all of it
  CHECK(load_dataset(c, Split::Test, 1).size() == 10000);
}

TEST_CASE("mnist: decompressed files read the same as the .gz ones", "[data][mnist]") {
  TempDir d;
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"}) {
    write_bytes(d.file(name), data::read_file_bytes(kShared + "/mnist/" + name + std::string(".gz")));
  }
  CHECK(fs::file_size(d.file("train-images-idx3-ubyte")) == 47040016);
  for (Split s : {Split::Train, Split::Test}) {
    const Dataset gz = load_dataset(cfg_for(DatasetName::Mnist, kShared + "/mnist"), s, 1);
    const Dataset raw = load_dataset(cfg_for(DatasetName::Mnist, d.path), s, 1);
    CHECK(raw.size() == gz.size());
    CHECK(raw.images == gz.images);
    CHECK(raw.labels == gz.labels);
  }
}

TEST_CASE("cifar10: the shared subset loads, NHWC from the plane-major records", "[data][cifar]") {
  const auto c = cfg_for(DatasetName::Cifar10, kShared + "/cifar10-subset");
  const Dataset train = load_dataset(c, Split::Train, 1);
  const Dataset test = load_dataset(c, Split::Test, 1);
  CHECK(train.size() == 10000);
  CHECK(test.size() == 1000);
  CHECK(train.H == 32);
  CHECK(train.W == 32);
  CHECK(train.C == 3);
  for (int32_t l : train.labels) REQUIRE((l >= 0 && l <= 9));

  // Record 1234 straight from the file: label, R plane, G plane, B plane.
  const int64_t r = 1234;
  std::ifstream f(kShared + "/cifar10-subset/data_batch_1.bin", std::ios::binary);
  std::vector<uint8_t> rec(3073);
  f.seekg(r * 3073);
  f.read(reinterpret_cast<char*>(rec.data()), 3073);
  REQUIRE(f.good());
  CHECK(train.labels[r] == rec[0]);
  const uint8_t* img = train.images.data() + r * 3072;
  int mismatches = 0;
  for (int y = 0; y < 32; ++y)
    for (int x = 0; x < 32; ++x)
      for (int ch = 0; ch < 3; ++ch)
        if (img[(y * 32 + x) * 3 + ch] != rec[1 + ch * 1024 + y * 32 + x]) ++mismatches;
  CHECK(mismatches == 0);
  // The channels really differ somewhere (a transposition bug would still pass a gray image).
  CHECK(std::memcmp(rec.data() + 1, rec.data() + 1 + 1024, 1024) != 0);

  auto lim = c;
  lim.train_limit = 10;
  lim.test_limit = 3;
  CHECK(load_dataset(lim, Split::Train, 1).size() == 10);
  const Dataset t3 = load_dataset(lim, Split::Test, 1);
  CHECK(t3.size() == 3);
  CHECK(std::equal(t3.images.begin(), t3.images.end(), test.images.begin()));
}

TEST_CASE("cifar10: an info line says how many training records were found", "[data][cifar]") {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(ring);
  const auto n = load_dataset(cfg_for(DatasetName::Cifar10, kShared + "/cifar10-subset"), Split::Train, 1).size();
  logger->sinks().pop_back();
  CHECK(n == 10000);
  std::string all;
  for (const auto& l : ring->last_formatted()) all += l;
  CHECK_THAT(all, Catch::Contains("[info]"));
  CHECK_THAT(all, Catch::Contains("10000 training records in 1 of 5 batch files"));
}

TEST_CASE("cifar10: all present data_batch_N.bin files are used, in order", "[data][cifar]") {
  TempDir d;
  std::vector<uint8_t> b1, b3;
  for (int i = 0; i < 3; ++i) {
    auto r = cifar_record(uint8_t(i), uint8_t(10 + i));
    b1.insert(b1.end(), r.begin(), r.end());
  }
  for (int i = 0; i < 2; ++i) {
    auto r = cifar_record(uint8_t(7 + i), uint8_t(50 + i));
    b3.insert(b3.end(), r.begin(), r.end());
  }
  write_bytes(d.file("data_batch_1.bin"), b1);
  write_bytes(d.file("data_batch_3.bin"), b3);
  write_bytes(d.file("test_batch.bin"), cifar_record(4, 1));
  const Dataset tr = load_dataset(cfg_for(DatasetName::Cifar10, d.path), Split::Train, 1);
  REQUIRE(tr.size() == 5);
  CHECK(tr.labels == std::vector<int32_t>{0, 1, 2, 7, 8});
  CHECK(tr.images[3 * 3072] == 50);
  CHECK(load_dataset(cfg_for(DatasetName::Cifar10, d.path), Split::Test, 1).size() == 1);

  // The official tarball's layout: the files inside cifar-10-batches-bin/.
  TempDir nested;
  fs::create_directory(nested.file("cifar-10-batches-bin"));
  write_bytes(nested.file("cifar-10-batches-bin/data_batch_1.bin"), b1);
  CHECK(load_dataset(cfg_for(DatasetName::Cifar10, nested.path), Split::Train, 1).size() == 3);
}

// ---- corrupt and missing files ----------------------------------------------

TEST_CASE("idx: a truncated images file names the file and the offset where data ran out", "[data][errors]") {
  TempDir d;
  write_small_mnist(d);
  auto img = idx_images(12, 4, 5);
  img.resize(16 + 5 * 20 + 7);  // 5 whole images and 7 bytes of the sixth
  write_bytes(d.file("train-images-idx3-ubyte"), img);
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains(d.file("train-images-idx3-ubyte")));
  CHECK_THAT(msg, Catch::Contains("byte offset 123"));
  CHECK_THAT(msg, Catch::Contains("truncated"));
  CHECK_THAT(msg, Catch::Contains("record 5"));

  // Cut inside the header.
  img.resize(10);
  write_bytes(d.file("train-images-idx3-ubyte"), img);
  CHECK_THAT(error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train), Catch::Contains("byte offset 10"));
}

TEST_CASE("idx: a truncated gzip stream is an error naming the file", "[data][errors]") {
  TempDir d;
  write_small_mnist(d);
  fs::remove(d.file("t10k-labels-idx1-ubyte"));
  write_gz(d.file("t10k-labels-idx1-ubyte.gz"), idx_labels(6));
  CHECK(load_dataset(cfg_for(DatasetName::Mnist, d.path), Split::Test, 1).size() == 6);  // the .gz alone is read
  // Now cut the compressed file short.
  const std::string gz = d.file("t10k-labels-idx1-ubyte.gz");
  std::ifstream in(gz, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  bytes.resize(bytes.size() - 6);
  write_bytes(gz, bytes);
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test);
  CHECK_THAT(msg, Catch::Contains(gz));
  CHECK_THAT(msg, Catch::Contains("offset"));
}

TEST_CASE("idx: trailing bytes after the promised data are an error", "[data][errors]") {
  TempDir d;
  write_small_mnist(d);
  auto lbl = idx_labels(12);
  lbl.push_back(0);
  lbl.push_back(0);
  write_bytes(d.file("train-labels-idx1-ubyte"), lbl);
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains(d.file("train-labels-idx1-ubyte")));
  CHECK_THAT(msg, Catch::Contains("2 unexpected trailing bytes from byte offset 20"));
}

TEST_CASE("idx: a wrong magic number is an error naming the file", "[data][errors]") {
  TempDir d;
  write_small_mnist(d);
  // A labels file where the images should be.
  write_bytes(d.file("t10k-images-idx3-ubyte"), idx_labels(6));
  std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test);
  CHECK_THAT(msg, Catch::Contains(d.file("t10k-images-idx3-ubyte")));
  CHECK_THAT(msg, Catch::Contains("bad magic number 0x00000801"));
  CHECK_THAT(msg, Catch::Contains("expected 0x00000803"));
  // Garbage.
  write_bytes(d.file("t10k-images-idx3-ubyte"), idx_images(6, 4, 5, 0x12345678));
  CHECK_THAT(error_of(cfg_for(DatasetName::Mnist, d.path), Split::Test),
             Catch::Contains("bad magic number 0x12345678"));
}

TEST_CASE("idx: a label outside [0, 9] names the record and offset", "[data][errors]") {
  TempDir d;
  write_small_mnist(d);
  auto lbl = idx_labels(12);
  lbl[8 + 3] = 10;
  write_bytes(d.file("train-labels-idx1-ubyte"), lbl);
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains(d.file("train-labels-idx1-ubyte")));
  CHECK_THAT(msg, Catch::Contains("label 10 of record 3 (byte offset 11)"));
}

TEST_CASE("idx: image and label counts must agree", "[data][errors]") {
  TempDir d;
  write_small_mnist(d);
  write_bytes(d.file("train-labels-idx1-ubyte"), idx_labels(11));
  const std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains("12 images"));
  CHECK_THAT(msg, Catch::Contains("11 labels"));
  CHECK_THAT(msg, Catch::Contains(d.file("train-labels-idx1-ubyte")));
}

TEST_CASE("cifar10: a partial record names the file and its offset", "[data][errors]") {
  TempDir d;
  std::vector<uint8_t> b;
  for (int i = 0; i < 2; ++i) {
    auto r = cifar_record(1, 2);
    b.insert(b.end(), r.begin(), r.end());
  }
  b.resize(b.size() + 100, 0);
  write_bytes(d.file("data_batch_1.bin"), b);
  const std::string msg = error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains(d.file("data_batch_1.bin")));
  CHECK_THAT(msg, Catch::Contains("byte offset 6146"));
}

TEST_CASE("cifar10: a label outside [0, 9] names file, record and offset", "[data][errors]") {
  TempDir d;
  std::vector<uint8_t> b;
  for (int i = 0; i < 3; ++i) {
    auto r = cifar_record(i == 1 ? 200 : 3, 2);
    b.insert(b.end(), r.begin(), r.end());
  }
  write_bytes(d.file("test_batch.bin"), b);
  const std::string msg = error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Test);
  CHECK_THAT(msg, Catch::Contains(d.file("test_batch.bin")));
  CHECK_THAT(msg, Catch::Contains("record 1"));
  CHECK_THAT(msg, Catch::Contains("byte offset 3073"));
}

TEST_CASE("missing files name the file and the script that fetches it", "[data][errors]") {
  TempDir d;
  std::string msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains(d.file("train-images-idx3-ubyte(.gz) not found")));
  CHECK_THAT(msg, Catch::Contains("data_scripts/get_mnist.sh"));
  CHECK_THAT(msg, Catch::Contains("MPX_DATA_MIRROR"));

  msg = error_of(cfg_for(DatasetName::FashionMnist, d.path + "/nope"), Split::Test);
  CHECK_THAT(msg, Catch::Contains("t10k-images-idx3-ubyte(.gz) not found"));
  CHECK_THAT(msg, Catch::Contains("does not exist"));
  CHECK_THAT(msg, Catch::Contains("data_scripts/get_fashion_mnist.sh"));

  msg = error_of(cfg_for(DatasetName::Cifar10, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains(d.file("data_batch_1.bin") + " not found"));
  CHECK_THAT(msg, Catch::Contains("data_scripts/get_cifar10.sh"));

  // Only the labels are missing.
  write_bytes(d.file("train-images-idx3-ubyte"), idx_images(2, 4, 5));
  msg = error_of(cfg_for(DatasetName::Mnist, d.path), Split::Train);
  CHECK_THAT(msg, Catch::Contains("train-labels-idx1-ubyte(.gz) not found"));

  // Default folder: the script without an argument.
  DataConfig c;
  c.dataset = DatasetName::Mnist;
  const std::string here = fs::current_path().string();
  const TempDir cwd;
  fs::create_directories(cwd.file("data/mnist"));
  fs::current_path(cwd.path);
  msg = error_of(c, Split::Train);
  fs::current_path(here);
  CHECK_THAT(msg, Catch::Contains("data/mnist/train-images-idx3-ubyte(.gz) not found; fetch it with "
                                  "data_scripts/get_mnist.sh (offline: MPX_DATA_MIRROR=/path/to/copy "
                                  "data_scripts/get_mnist.sh)"));
}

TEST_CASE("default_normalization gives the standard statistics", "[data]") {
  std::vector<double> m, s;
  default_normalization(DatasetName::Mnist, m, s);
  CHECK(m == std::vector<double>{0.1307});
  CHECK(s == std::vector<double>{0.3081});
  default_normalization(DatasetName::FashionMnist, m, s);
  CHECK(m == std::vector<double>{0.2860});
  CHECK(s == std::vector<double>{0.3530});
  default_normalization(DatasetName::Cifar10, m, s);
  CHECK(m == std::vector<double>{0.4914, 0.4822, 0.4465});
  CHECK(s == std::vector<double>{0.2470, 0.2435, 0.2616});
  default_normalization(DatasetName::Synthetic, m, s);
  CHECK(m == std::vector<double>{0.5});
  CHECK(s == std::vector<double>{0.5});
}

// ---- synthetic ----------------------------------------------------------------

TEST_CASE("synthetic: deterministic from the seed, sized by the config", "[data][synthetic]") {
  DataConfig c;
  c.dataset = DatasetName::Synthetic;
  c.synthetic_train = 300;
  c.synthetic_test = 120;
  const Dataset a = load_dataset(c, Split::Train, 7);
  const Dataset b = load_dataset(c, Split::Train, 7);
  const Dataset other = load_dataset(c, Split::Train, 8);
  const Dataset test = load_dataset(c, Split::Test, 7);
  CHECK(a.size() == 300);
  CHECK(test.size() == 120);
  CHECK(a.H == 28);
  CHECK(a.W == 28);
  CHECK(a.C == 1);
  CHECK(a.num_classes == 10);
  CHECK(a.images == b.images);
  CHECK(a.labels == b.labels);
  CHECK(a.images != other.images);
  CHECK(a.images != std::vector<uint8_t>(test.images.begin(), test.images.end()));
  std::vector<int> per_class(10, 0);
  for (int32_t l : a.labels) per_class.at(l)++;
  for (int k : per_class) CHECK(k > 10);
  c.train_limit = 50;
  const Dataset lim = load_dataset(c, Split::Train, 7);
  CHECK(lim.size() == 50);
  CHECK(std::equal(lim.images.begin(), lim.images.end(), a.images.begin()));
}

TEST_CASE("synthetic: learnable (nearest class mean classifies the test split)", "[data][synthetic]") {
  DataConfig c;
  c.dataset = DatasetName::Synthetic;
  const Dataset train = load_dataset(c, Split::Train, 42);
  const Dataset test = load_dataset(c, Split::Test, 42);
  const int64_t px = train.image_bytes();
  std::vector<double> mean(10 * px, 0.0);
  std::vector<int> count(10, 0);
  for (int64_t i = 0; i < train.size(); ++i) {
    count[train.labels[i]]++;
    for (int64_t j = 0; j < px; ++j) mean[train.labels[i] * px + j] += train.images[i * px + j];
  }
  for (int k = 0; k < 10; ++k)
    for (int64_t j = 0; j < px; ++j) mean[k * px + j] /= std::max(count[k], 1);
  int correct = 0;
  for (int64_t i = 0; i < test.size(); ++i) {
    int best = -1;
    double best_d = 1e300;
    for (int k = 0; k < 10; ++k) {
      double d = 0;
      for (int64_t j = 0; j < px; ++j) {
        const double e = test.images[i * px + j] - mean[k * px + j];
        d += e * e;
      }
      if (d < best_d) best_d = d, best = k;
    }
    correct += best == test.labels[i];
  }
  CHECK(double(correct) / double(test.size()) > 0.95);
}
