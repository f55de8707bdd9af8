// SPDX-License-Identifier: MIT
// placeholder entry point
#include <mpx/config.hpp>
#include <cstdio>
#include <cstring>
int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) { std::printf("mpx %s\n", MPX_VERSION); return 0; }
  std::printf("mpx\n");
  return 0;
}
