// SPDX-License-Identifier: MIT
// `mpx config-reference` (hidden): prints the config reference generated from
// the schema, the text of docs/config.md (`mpx config-reference > docs/config.md`).
#include <iostream>

#include "commands.h"
#include "config/config.h"

namespace mpx::app {

void add_config_reference_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("config-reference", "Print docs/config.md, generated from the config schema");
  cmd->group("");  // hidden from --help: a maintainer's tool
  cmd->callback([] { std::cout << config_reference_markdown() << std::flush; });
}

}  // namespace mpx::app
