// SPDX-License-Identifier: MIT
// The Loader: per-epoch shuffle as a pure function of (seed, epoch), batching,
// resume mid-epoch, host augmentation (crop + flip) and buffer reuse.
#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "core/error.h"
#include "data/dataset.h"
#include "support/sanitizers.h"

using namespace mpx;


namespace {

// N records of HxWxC whose bytes identify the record and the pixel.
Dataset make_ds(int64_t n, int H = 6, int W = 5, int C = 2) {
  Dataset ds;
  ds.name = "test";
  ds.H = H;
  ds.W = W;
  ds.C = C;
  ds.labels.resize(n);
  ds.images.resize(n * H * W * C);
  for (int64_t i = 0; i < n; ++i) {
    ds.labels[i] = int32_t(i % 10);
    for (int64_t j = 0; j < ds.image_bytes(); ++j) ds.images[i * ds.image_bytes() + j] = uint8_t(1 + (i * 31 + j) % 251);
  }
  return ds;
}

struct EpochLog {
  std::vector<int64_t> indices;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
};

EpochLog run_epoch(Loader& l, int64_t epoch, int64_t first_step = 0) {
  EpochLog log;
  l.start_epoch(epoch, first_step);
  Batch b;
  while (l.next(b)) {
    REQUIRE(b.n == int64_t(b.labels.size()));
    log.sizes.push_back(b.n);
    log.indices.insert(log.indices.end(), b.indices.begin(), b.indices.end());
    log.images.insert(log.images.end(), b.images.begin(), b.images.end());
    log.labels.insert(log.labels.end(), b.labels.begin(), b.labels.end());
  }
  return log;
}

const uint8_t* rec(const Dataset& ds, int64_t i) { return ds.images.data() + i * ds.image_bytes(); }

}  // namespace

TEST_CASE("loader: every record exactly once per epoch, labels and images follow", "[loader]") {
  const Dataset ds = make_ds(103);
  Loader l(ds, 10, true, false, AugmentConfig{}, 5);
  CHECK(l.steps_per_epoch() == 11);
  for (int64_t e = 0; e < 3; ++e) {
    const EpochLog log = run_epoch(l, e);
    REQUIRE(log.indices.size() == 103);
    CHECK(std::set<int64_t>(log.indices.begin(), log.indices.end()).size() == 103);
    for (size_t k = 0; k < log.indices.size(); ++k) {
      const int64_t i = log.indices[k];
      REQUIRE(log.labels[k] == ds.labels[i]);
      REQUIRE(std::equal(rec(ds, i), rec(ds, i) + ds.image_bytes(), log.images.begin() + k * ds.image_bytes()));
    }
    CHECK(l.position() == 11);
    CHECK(l.epoch() == e);
  }
}

TEST_CASE("loader: the order is a pure function of (seed, epoch)", "[loader]") {
  const Dataset ds = make_ds(200);
  Loader a(ds, 16, true, false, AugmentConfig{}, 1234);
  Loader b(ds, 16, true, false, AugmentConfig{}, 1234);
  Loader c(ds, 16, true, false, AugmentConfig{}, 99);
  const auto a0 = run_epoch(a, 0).indices, a1 = run_epoch(a, 1).indices;
  CHECK(a0 != a1);
  // Another loader, epochs visited out of order: the same orders.
  CHECK(run_epoch(b, 1).indices == a1);
  CHECK(run_epoch(b, 0).indices == a0);
  CHECK(run_epoch(c, 0).indices != a0);
  // Shuffled at all.
  std::vector<int64_t> ident(200);
  for (int64_t i = 0; i < 200; ++i) ident[i] = i;
  CHECK(a0 != ident);
  // shuffle=false: the file order every epoch.
  Loader s(ds, 16, false, false, AugmentConfig{}, 1234);
  CHECK(run_epoch(s, 0).indices == ident);
  CHECK(run_epoch(s, 3).indices == ident);
}

TEST_CASE("loader: the last partial batch is kept, or dropped with drop_last", "[loader]") {
  const Dataset ds = make_ds(25);
  Loader keep(ds, 10, true, false, AugmentConfig{}, 3);
  CHECK(keep.steps_per_epoch() == 3);
  CHECK(keep.records_per_epoch() == 25);
  CHECK(run_epoch(keep, 0).sizes == std::vector<int64_t>{10, 10, 5});

  Loader drop(ds, 10, true, true, AugmentConfig{}, 3);
  CHECK(drop.steps_per_epoch() == 2);
  CHECK(drop.records_per_epoch() == 20);
  const EpochLog d = run_epoch(drop, 0);
  CHECK(d.sizes == std::vector<int64_t>{10, 10});
  // The same records as the first 20 of the kept epoch (the order does not depend on drop_last).
  const EpochLog k = run_epoch(keep, 0);
  CHECK(std::vector<int64_t>(k.indices.begin(), k.indices.begin() + 20) == d.indices);

  const Dataset ds30 = make_ds(30);
  Loader exact(ds30, 10, true, true, AugmentConfig{}, 3);
  CHECK(exact.steps_per_epoch() == 3);

  CHECK_THROWS_AS(Loader(ds, 26, true, true, AugmentConfig{}, 3), ConfigError);
  CHECK_THROWS_AS(Loader(ds, 0, true, false, AugmentConfig{}, 3), ConfigError);
  Loader big(ds, 26, true, false, AugmentConfig{}, 3);
  CHECK(run_epoch(big, 0).sizes == std::vector<int64_t>{25});
}

TEST_CASE("loader: start_epoch(e, k) yields exactly batches k.. of a fresh epoch e", "[loader]") {
  const Dataset ds = make_ds(97);
  AugmentConfig aug;
  aug.random_crop_padding = 2;
  aug.horizontal_flip = true;
  Loader fresh(ds, 8, true, false, aug, 77);
  const EpochLog full = run_epoch(fresh, 4);
  for (int64_t k : {0, 1, 5, 12, 13}) {
    Loader resumed(ds, 8, true, false, aug, 77);
    // A different epoch first, as a run would have done before saving.
    run_epoch(resumed, 2);
    const EpochLog tail = run_epoch(resumed, 4, k);
    const size_t skip = size_t(std::min<int64_t>(k * 8, 97));
    REQUIRE(tail.indices.size() == full.indices.size() - skip);
    CHECK(std::equal(tail.indices.begin(), tail.indices.end(), full.indices.begin() + skip));
    CHECK(std::equal(tail.labels.begin(), tail.labels.end(), full.labels.begin() + skip));
    CHECK(std::equal(tail.images.begin(), tail.images.end(), full.images.begin() + skip * ds.image_bytes()));
  }
  Loader l(ds, 8, true, false, aug, 77);
  CHECK_THROWS(l.start_epoch(0, 14));
  CHECK_THROWS(l.start_epoch(0, -1));
}

TEST_CASE("loader: batch buffers are allocated once and reused", "[loader]") {
  const Dataset ds = make_ds(45);
  Loader l(ds, 20, true, false, AugmentConfig{}, 1);
  Batch b;
  REQUIRE(l.next(b));
  const uint8_t* img = b.images.data();
  const int32_t* lbl = b.labels.data();
  for (int64_t e = 0; e < 3; ++e) {
    l.start_epoch(e, e == 0 ? 1 : 0);
    while (l.next(b)) {
      CHECK(b.images.data() == img);
      CHECK(b.labels.data() == lbl);
    }
  }
}

TEST_CASE("loader: horizontal flip mirrors about half of the images, deterministically", "[loader][augment]") {
  const Dataset ds = make_ds(400, 4, 7, 3);
  AugmentConfig aug;
  aug.horizontal_flip = true;
  Loader l(ds, 64, true, false, aug, 11);
  const EpochLog e0 = run_epoch(l, 0);
  const int64_t B = ds.image_bytes();
  int flipped = 0, same = 0;
  for (size_t k = 0; k < e0.indices.size(); ++k) {
    const uint8_t* orig = rec(ds, e0.indices[k]);
    const uint8_t* got = e0.images.data() + k * B;
    bool is_same = std::equal(orig, orig + B, got);
    bool is_mirror = true;
    for (int y = 0; y < ds.H; ++y)
      for (int x = 0; x < ds.W; ++x)
        for (int c = 0; c < ds.C; ++c)
          is_mirror &= got[(y * ds.W + x) * ds.C + c] == orig[(y * ds.W + (ds.W - 1 - x)) * ds.C + c];
    REQUIRE((is_same || is_mirror));
    same += is_same;
    flipped += is_mirror;
  }
  CHECK(flipped > 150);
  CHECK(same > 150);
  // Deterministic: another loader, same seed and epoch, same bytes; another epoch differs.
  Loader again(ds, 64, true, false, aug, 11);
  CHECK(run_epoch(again, 0).images == e0.images);
  const EpochLog e1 = run_epoch(again, 1);
  CHECK(e1.images != e0.images);
}

TEST_CASE("loader: random crop is a zero-padded shift within the padding", "[loader][augment]") {
  const Dataset ds = make_ds(300, 8, 8, 1);
  AugmentConfig aug;
  aug.random_crop_padding = 2;
  Loader l(ds, 50, false, false, aug, 3);
  const EpochLog e = run_epoch(l, 0);
  int shifted = 0;
  std::set<std::pair<int, int>> shifts;
  for (size_t k = 0; k < e.indices.size(); ++k) {
    const uint8_t* orig = rec(ds, e.indices[k]);
    const uint8_t* got = e.images.data() + k * ds.image_bytes();
    bool found = false;
    for (int dy = -2; dy <= 2 && !found; ++dy)
      for (int dx = -2; dx <= 2 && !found; ++dx) {
        bool ok = true;
        for (int y = 0; y < 8 && ok; ++y)
          for (int x = 0; x < 8 && ok; ++x) {
            const int sy = y + dy, sx = x + dx;
            const uint8_t want = (sy < 0 || sy >= 8 || sx < 0 || sx >= 8) ? 0 : orig[sy * 8 + sx];
            ok = got[y * 8 + x] == want;
          }
        if (ok) {
          found = true;
          shifts.insert({dy, dx});
          shifted += dy != 0 || dx != 0;
        }
      }
    REQUIRE(found);
  }
  CHECK(shifts.size() == 25);  // every offset in [-2, 2]^2 occurs
  CHECK(shifted > 250);
}

namespace {

/// The record padded by `pad` pixels on every side by reflection about the edge pixels
/// (numpy's "reflect", PyTorch's F.pad(mode="reflect")), built explicitly: [(H+2p) x (W+2p) x C].
std::vector<uint8_t> reflect_padded(const uint8_t* img, int H, int W, int C, int pad) {
  const int Hp = H + 2 * pad, Wp = W + 2 * pad;
  std::vector<uint8_t> out(static_cast<size_t>(Hp) * Wp * C);
  for (int y = 0; y < Hp; ++y)
    for (int x = 0; x < Wp; ++x) {
      int sy = y - pad, sx = x - pad;
      while (sy < 0 || sy >= H) sy = sy < 0 ? -sy : 2 * H - 2 - sy;
      while (sx < 0 || sx >= W) sx = sx < 0 ? -sx : 2 * W - 2 - sx;
      for (int c = 0; c < C; ++c) out[(static_cast<size_t>(y) * Wp + x) * C + c] = img[(sy * W + sx) * C + c];
    }
  return out;
}

/// The H x W crop of a padded image at (oy, ox), mirrored left-right when `flip`.
std::vector<uint8_t> crop(const std::vector<uint8_t>& padded, int H, int W, int C, int pad, int oy, int ox, bool flip) {
  const int Wp = W + 2 * pad;
  std::vector<uint8_t> out(static_cast<size_t>(H) * W * C);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const int sx = flip ? W - 1 - x : x;
      for (int c = 0; c < C; ++c)
        out[(static_cast<size_t>(y) * W + x) * C + c] = padded[(static_cast<size_t>(y + oy) * Wp + sx + ox) * C + c];
    }
  return out;
}

}  // namespace

TEST_CASE("loader: random crop with reflection padding equals a crop of the reflect-padded image",
          "[loader][augment]") {
  const Dataset ds = make_ds(400, 8, 7, 3);
  AugmentConfig aug;
  aug.random_crop_padding = 2;
  aug.padding_mode = PadMode::Reflect;
  aug.horizontal_flip = true;
  Loader l(ds, 64, true, false, aug, 5);
  const EpochLog e = run_epoch(l, 0);
  std::set<std::tuple<int, int, bool>> seen;
  for (size_t k = 0; k < e.indices.size(); ++k) {
    const std::vector<uint8_t> padded = reflect_padded(rec(ds, e.indices[k]), ds.H, ds.W, ds.C, 2);
    const uint8_t* got = e.images.data() + k * ds.image_bytes();
    // The crop and flip are found by trying all; the loader's own flip decision must agree.
    bool found = false;
    for (int oy = 0; oy <= 4 && !found; ++oy)
      for (int ox = 0; ox <= 4 && !found; ++ox)
        for (bool flip : {false, true})
          if (!found && crop(padded, ds.H, ds.W, ds.C, 2, oy, ox, flip) ==
                            std::vector<uint8_t>(got, got + ds.image_bytes())) {
            found = true;
            seen.insert({oy, ox, flip});
            CHECK(flip == l.flips(e.indices[k]));
          }
    INFO("record " << e.indices[k]);
    REQUIRE(found);
  }
  CHECK(seen.size() == 50);  // every offset in [0, 4]^2, mirrored and not
}

TEST_CASE("loader: reflection padding must be smaller than the image", "[loader][augment]") {
  const Dataset ds = make_ds(10, 4, 6, 1);
  AugmentConfig aug;
  aug.padding_mode = PadMode::Reflect;
  aug.random_crop_padding = 4;
  CHECK_THROWS_WITH(Loader(ds, 5, true, false, aug, 1),
                    Catch::Contains("reflect needs data.augment.random_crop_padding (4) smaller than") &&
                        Catch::Contains("4x6"));
  aug.random_crop_padding = 3;
  CHECK_NOTHROW(Loader(ds, 5, true, false, aug, 1));
  aug.padding_mode = PadMode::Zeros;  // zero padding may exceed the image (black images)
  aug.random_crop_padding = 9;
  CHECK_NOTHROW(Loader(ds, 5, true, false, aug, 1));
}

TEST_CASE("loader: alternating flips: epoch 0 at random, then each image flips every other epoch",
          "[loader][augment]") {
  const Dataset ds = make_ds(300, 4, 5, 2);
  AugmentConfig random_aug;
  random_aug.horizontal_flip = true;
  AugmentConfig alt = random_aug;
  alt.flip_mode = FlipMode::Alternating;
  Loader r(ds, 64, true, false, random_aug, 21), a(ds, 64, true, false, alt, 21);
  // Epoch 0: the same coins (and the same bytes) as the random mode.
  CHECK(run_epoch(a, 0).images == run_epoch(r, 0).images);
  std::vector<bool> first(300);
  a.start_epoch(0);
  int flipped0 = 0;
  for (int64_t i = 0; i < 300; ++i) flipped0 += (first[i] = a.flips(i));
  CHECK(flipped0 > 110);
  CHECK(flipped0 < 190);
  for (int64_t epoch = 1; epoch <= 4; ++epoch) {
    const EpochLog e = run_epoch(a, epoch);
    for (size_t k = 0; k < e.indices.size(); ++k) {
      const int64_t i = e.indices[k];
      const bool want = first[i] != (epoch % 2 == 1);
      CHECK(a.flips(i) == want);
      // The bytes: the record itself, or its mirror image.
      const uint8_t* orig = rec(ds, i);
      const uint8_t* got = e.images.data() + k * ds.image_bytes();
      bool ok = true;
      for (int y = 0; y < ds.H; ++y)
        for (int x = 0; x < ds.W; ++x)
          for (int c = 0; c < ds.C; ++c)
            ok &= got[(y * ds.W + x) * ds.C + c] == orig[(y * ds.W + (want ? ds.W - 1 - x : x)) * ds.C + c];
      INFO("epoch " << epoch << " record " << i);
      CHECK(ok);
    }
  }
  // A resumed loader (fresh object, mid-epoch) sees the same bytes.
  const EpochLog full = run_epoch(a, 3);
  Loader resumed(ds, 64, true, false, alt, 21);
  const EpochLog tail = run_epoch(resumed, 3, 2);
  CHECK(std::equal(tail.images.begin(), tail.images.end(), full.images.begin() + 2 * 64 * ds.image_bytes()));
}

TEST_CASE("loader: padding wider than the image gives black images, never out-of-bounds", "[loader][augment]") {
  const Dataset ds = make_ds(200, 3, 4, 3);
  AugmentConfig aug;
  aug.random_crop_padding = 9;
  aug.horizontal_flip = true;
  Loader l(ds, 32, true, false, aug, 8);
  const EpochLog e = run_epoch(l, 0);
  int black = 0, kept = 0;
  for (size_t k = 0; k < e.indices.size(); ++k) {
    const uint8_t* got = e.images.data() + k * ds.image_bytes();
    const uint8_t* orig = rec(ds, e.indices[k]);
    black += std::all_of(got, got + ds.image_bytes(), [](uint8_t v) { return v == 0; });
    // Every non-zero byte comes from the record (make_ds bytes are never 0).
    for (int64_t j = 0; j < ds.image_bytes(); ++j)
      if (got[j] != 0) REQUIRE(std::find(orig, orig + ds.image_bytes(), got[j]) != orig + ds.image_bytes());
    kept += got[0] != 0 || got[ds.image_bytes() - 1] != 0;
  }
  CHECK(black > 50);
  CHECK(kept > 0);
}

TEST_CASE("loader: an MNIST-sized epoch costs well under a second", "[loader][perf]") {
  const Dataset ds = make_ds(60000, 28, 28, 1);
  Loader l(ds, 128, true, false, AugmentConfig{}, 1);
  AugmentConfig aug;
  aug.random_crop_padding = 2;
  aug.horizontal_flip = true;
  Loader la(ds, 128, true, false, aug, 1);
  Batch b;
  const auto t0 = std::chrono::steady_clock::now();
  l.start_epoch(1);
  int64_t n = 0;
  while (l.next(b)) n += b.n;
  const auto t1 = std::chrono::steady_clock::now();
  la.start_epoch(1);
  while (la.next(b)) n += b.n;
  const auto t2 = std::chrono::steady_clock::now();
  CHECK(n == 120000);
  const double plain = std::chrono::duration<double>(t1 - t0).count();
  const double augmented = std::chrono::duration<double>(t2 - t1).count();
  INFO("plain " << plain << " s, augmented " << augmented << " s");
#if defined(NDEBUG) && !MPX_TEST_ASAN
  // Timing holds for optimized builds only (Debug and sanitizer builds are several times slower).
  CHECK(plain < 0.5);
  CHECK(augmented < 1.0);
#endif
}
