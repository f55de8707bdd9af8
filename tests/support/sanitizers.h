// SPDX-License-Identifier: MIT
// MPX_TEST_ASAN: 1 in AddressSanitizer builds (GCC defines __SANITIZE_ADDRESS__, clang
// answers __has_feature), where timings and resident memory are not the program's own
// (ASan's quarantine keeps freed blocks resident), else 0.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define MPX_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MPX_TEST_ASAN 1
#endif
#endif
#ifndef MPX_TEST_ASAN
#define MPX_TEST_ASAN 0
#endif
