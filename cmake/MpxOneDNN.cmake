# SPDX-License-Identifier: MIT
# Finds oneDNN and defines DNNL::dnnl (docs/cpu-performance.md, "Which oneDNN").
#
#   MPX_ONEDNN=AUTO    oneDNN 3.x from MPX_ONEDNN_PREFIX (scripts/install_onednn.sh puts
#                      Intel's PyPI build there), else the system's (Debian's libdnnl-dev 2.6)
#   MPX_ONEDNN=PREFIX  only the prefix's; an error without it
#   MPX_ONEDNN=SYSTEM  only the system's
#
# Sets MPX_ONEDNN_VERSION (x.y.z) and MPX_ONEDNN_SOURCE (words for the configure report).
set(MPX_ONEDNN AUTO CACHE STRING "Which oneDNN: AUTO (the prefix's 3.x, else the system's), PREFIX or SYSTEM")
set_property(CACHE MPX_ONEDNN PROPERTY STRINGS AUTO PREFIX SYSTEM)
set(MPX_ONEDNN_PREFIX /opt/mpx-deps/onednn CACHE PATH "Where scripts/install_onednn.sh installs oneDNN 3.x")

set(_mpx_dnnl_prefix_found OFF)
if(NOT MPX_ONEDNN STREQUAL "SYSTEM")
  find_package(dnnl 3 CONFIG QUIET PATHS "${MPX_ONEDNN_PREFIX}" NO_DEFAULT_PATH)
  if(dnnl_FOUND AND TARGET DNNL::dnnl)
    set(_mpx_dnnl_prefix_found ON)
    get_target_property(_mpx_dnnl_inc DNNL::dnnl INTERFACE_INCLUDE_DIRECTORIES)
    set(MPX_ONEDNN_SOURCE "${MPX_ONEDNN_PREFIX} (Intel's PyPI build)")
    # Installed binaries find the library where they were linked against it.
    set(CMAKE_INSTALL_RPATH_USE_LINK_PATH ON)
  elseif(MPX_ONEDNN STREQUAL "PREFIX")
    message(FATAL_ERROR "MPX_ONEDNN=PREFIX but no oneDNN 3.x in ${MPX_ONEDNN_PREFIX} (run scripts/install_onednn.sh)")
  endif()
endif()

if(NOT _mpx_dnnl_prefix_found)
  # Debian's dnnl-config.cmake insists on the OpenCL SDK (its GPU runtime), which mpx
  # does not use; find the CPU library and headers directly.
  find_path(DNNL_INCLUDE_DIR dnnl.hpp REQUIRED)
  find_library(DNNL_LIBRARY NAMES dnnl REQUIRED)
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION "${DNNL_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
  set(_mpx_dnnl_inc "${DNNL_INCLUDE_DIR}")
  set(MPX_ONEDNN_SOURCE "the system's ${DNNL_LIBRARY}")
endif()

set(MPX_ONEDNN_VERSION "unknown")
foreach(_dir IN LISTS _mpx_dnnl_inc)
  if(EXISTS "${_dir}/oneapi/dnnl/dnnl_version.h")
    file(STRINGS "${_dir}/oneapi/dnnl/dnnl_version.h" _v REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" MPX_ONEDNN_VERSION "${_v}")
    break()
  endif()
endforeach()

if(_mpx_dnnl_prefix_found)
  message(STATUS "mpx: oneDNN ${MPX_ONEDNN_VERSION} from ${MPX_ONEDNN_SOURCE}")
elseif(MPX_ONEDNN STREQUAL "SYSTEM")
  message(STATUS "mpx: oneDNN ${MPX_ONEDNN_VERSION} from ${MPX_ONEDNN_SOURCE} (MPX_ONEDNN=SYSTEM)")
else()
  message(WARNING "mpx: FALLBACK to oneDNN ${MPX_ONEDNN_VERSION} from ${MPX_ONEDNN_SOURCE}: no oneDNN 3.x in "
                  "${MPX_ONEDNN_PREFIX}. Run scripts/install_onednn.sh (Intel's PyPI build) for the faster "
                  "convolution kernels of oneDNN 3.x.")
endif()
