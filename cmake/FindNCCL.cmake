# SPDX-License-Identifier: MIT
# Finds NCCL: NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the IMPORTED target
# NCCL::nccl. Searched first in NCCL_ROOT (cache or environment), then next to the
# CUDA toolkit that find_package(CUDAToolkit) found, then in the system paths.
set(_nccl_hints ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_nccl_toolkit_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_hints ${_nccl_toolkit_root})
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include targets/x86_64-linux/include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib targets/x86_64-linux/lib)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(READ "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_h)
  string(REGEX MATCH "define NCCL_MAJOR ([0-9]+)" _ "${_nccl_h}")
  set(_major ${CMAKE_MATCH_1})
  string(REGEX MATCH "define NCCL_MINOR ([0-9]+)" _ "${_nccl_h}")
  set(_minor ${CMAKE_MATCH_1})
  string(REGEX MATCH "define NCCL_PATCH ([0-9]+)" _ "${_nccl_h}")
  set(NCCL_VERSION "${_major}.${_minor}.${CMAKE_MATCH_1}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
