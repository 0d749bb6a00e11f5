# Provides the `torch_libs` interface target.
#
# With a CUDA toolkit (the GPU machine), LibTorch comes from find_package(Torch) as usual.
# Without one (dev machines, CI), the wheel's CMake config stops ("uses CUDA but I cannot find
# the CUDA libraries"), so we link the wheel's CPU libraries directly: libtorch_cpu + libc10
# run everything on CPU, Gloo collectives included, with no CUDA toolkit present.
# TORCH_ROOT is the `torch` package directory of the wheel (the Makefile passes it).

if(NOT TORCH_ROOT)
  message(FATAL_ERROR "pass -DTORCH_ROOT=<site-packages>/torch (the Makefile does this)")
endif()

option(MEGATRON_CUDA "build against the CUDA LibTorch (needs a CUDA toolkit)" OFF)

add_library(torch_libs INTERFACE)
if(MEGATRON_CUDA)
  list(APPEND CMAKE_PREFIX_PATH "${TORCH_ROOT}/share/cmake")
  find_package(Torch REQUIRED)
  target_link_libraries(torch_libs INTERFACE ${TORCH_LIBRARIES})
  target_compile_definitions(torch_libs INTERFACE MEGATRON_WITH_CUDA)
  # ProcessGroupNCCL.hpp needs nccl.h, which the wheel's NCCL dependency carries.
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS "${TORCH_ROOT}/../nvidia/nccl/include" /usr/include /usr/local/cuda/include)
  if(NCCL_INCLUDE_DIR)
    target_include_directories(torch_libs SYSTEM INTERFACE "${NCCL_INCLUDE_DIR}")
    target_compile_definitions(torch_libs INTERFACE USE_C10D_NCCL)
  else()
    message(WARNING "nccl.h not found: multi-GPU training (NCCL) is disabled in this build")
  endif()
else()
  find_library(TORCH_CPU_LIB torch_cpu PATHS "${TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
  find_library(C10_LIB c10 PATHS "${TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
  target_include_directories(torch_libs SYSTEM INTERFACE
    "${TORCH_ROOT}/include" "${TORCH_ROOT}/include/torch/csrc/api/include")
  target_link_libraries(torch_libs INTERFACE "${TORCH_CPU_LIB}" "${C10_LIB}")
  # The wheels are built with the C++11 ABI.
  target_compile_definitions(torch_libs INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
  set_target_properties(torch_libs PROPERTIES INTERFACE_LINK_OPTIONS "-Wl,-rpath,${TORCH_ROOT}/lib")
endif()
# Gloo (CPU collectives): the wheel carries Gloo's code, Debian's libgloo-dev its headers.
target_compile_definitions(torch_libs INTERFACE USE_C10D_GLOO)
