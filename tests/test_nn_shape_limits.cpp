// SPDX-License-Identifier: MIT
// A pooling window (or a conv kernel) larger than its padded input is refused
// when the model is built, whatever the strides: the output-size formula
// truncates toward zero and used to give 1 for such a window (docs/inputs.md).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "nn/model.h"
#include "support/gradcheck.h"
#include "support/log_capture.h"

using namespace mpx;
using support::conv_layer;
using support::dense_layer;
using support::make_layer;
using support::model_config;
using support::pool_layer;

namespace {

std::string build_error(std::vector<LayerConfig> layers, int H, int W, int C) {
  auto be = create_backend("cpu");
  try {
    Model m(model_config(std::move(layers)), Policy::Float32, *be, H, W, C, 10, 2);
  } catch (const ConfigError& e) {
    CHECK(e.exit_code() == kExitUsage);
    return e.what();
  }
  return "";
}

LayerConfig at(LayerConfig l, const std::string& name, const std::string& key_path) {
  l.name = name;
  l.key_path = key_path;
  return l;
}

}  // namespace

TEST_CASE("shape limits: a pool window larger than its input is refused, with any stride", "[nn][limits]") {
  for (LayerType type : {LayerType::MaxPool, LayerType::AvgPool}) {
    INFO(enum_name(type));
    // 3x3 window on a 2x2 input; strides default to the window (3): (2 - 3) / 3 + 1 truncates to 1.
    std::string msg = build_error({at(pool_layer(type, 3), "p", "model.layers[0]"), make_layer(LayerType::Flatten),
                                   dense_layer(10)},
                                  2, 2, 1);
    CHECK_THAT(msg, Catch::Contains("input [2, 2, 1] is smaller than the 3x3 pool window with padding valid"));
    CHECK_THAT(msg, Catch::Contains("model.layers[0]"));
    // Stride 1 was refused before too; a window larger in one direction only as well.
    CHECK_THAT(build_error({pool_layer(type, 5, 1), make_layer(LayerType::Flatten), dense_layer(10)}, 4, 4, 1),
               Catch::Contains("is smaller than the 5x5 pool window"));
    LayerConfig tall = pool_layer(type, 2, 2);
    tall.pool_h = 6;
    CHECK_THAT(build_error({tall, make_layer(LayerType::Flatten), dense_layer(10)}, 5, 8, 1),
               Catch::Contains("is smaller than the 6x2 pool window"));
    // After an earlier pool has shrunk the input.
    CHECK_THAT(build_error({pool_layer(type, 2), pool_layer(type, 4, 3), make_layer(LayerType::Flatten),
                            dense_layer(10)},
                           6, 6, 1),
               Catch::Contains("input [3, 3, 1] is smaller than the 4x4 pool window"));
    // Same padding pads the input up to the window: accepted, as in Keras.
    CHECK(build_error({pool_layer(type, 3, 3, Padding::Same), make_layer(LayerType::Flatten), dense_layer(10)}, 2, 2,
                      1)
              .empty());
    // A window that fits exactly is fine.
    CHECK(build_error({pool_layer(type, 3), make_layer(LayerType::Flatten), dense_layer(10)}, 3, 3, 1).empty());
  }
}

TEST_CASE("shape limits: a conv kernel larger than its input is refused with strides too", "[nn][limits]") {
  CHECK_THAT(build_error({conv_layer(4, 3, 3), make_layer(LayerType::Flatten), dense_layer(10)}, 2, 2, 1),
             Catch::Contains("input [2, 2, 1] is smaller than the 3x3 kernel with padding valid"));
  CHECK_THAT(build_error({conv_layer(4, 3, 1), make_layer(LayerType::Flatten), dense_layer(10)}, 2, 2, 1),
             Catch::Contains("is smaller than the 3x3 kernel"));
  // Same padding: accepted, with a warning that part of the kernel only meets padding.
  support::ExpectLogs logs;
  CHECK(build_error({conv_layer(4, 3, 3, Padding::Same), make_layer(LayerType::Flatten), dense_layer(10)}, 2, 2, 1)
            .empty());
  CHECK(logs.contains("the 3x3 kernel is larger than its 2x2 input"));
}
