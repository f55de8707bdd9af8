# SPDX-License-Identifier: MIT
# Finds cuDNN: CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION and the IMPORTED
# target CUDNN::cudnn. Searched first in CUDNN_ROOT / CUDNN_PATH (cache or
# environment), then next to the CUDA toolkit that find_package(CUDAToolkit)
# found, then in the system paths.
set(_cudnn_hints ${CUDNN_PATH} $ENV{CUDNN_PATH} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_cudnn_toolkit_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _cudnn_hints ${_cudnn_toolkit_root})
endif()

find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} PATH_SUFFIXES include targets/x86_64-linux/include)
find_library(CUDNN_LIBRARY NAMES cudnn HINTS ${_cudnn_hints} PATH_SUFFIXES lib64 lib lib/x64 targets/x86_64-linux/lib)

if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(READ "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_version_h)
  string(REGEX MATCH "define CUDNN_MAJOR ([0-9]+)" _ "${_cudnn_version_h}")
  set(_major ${CMAKE_MATCH_1})
  string(REGEX MATCH "define CUDNN_MINOR ([0-9]+)" _ "${_cudnn_version_h}")
  set(_minor ${CMAKE_MATCH_1})
  string(REGEX MATCH "define CUDNN_PATCHLEVEL ([0-9]+)" _ "${_cudnn_version_h}")
  set(CUDNN_VERSION "${_major}.${_minor}.${CMAKE_MATCH_1}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES IMPORTED_LOCATION "${CUDNN_LIBRARY}"
                                                INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
