# CUDA kernels and the NCCL transport (runtime/cuda/), included at the end of
# CMakeLists.txt once reshard_runtime, reshard and the test targets exist.
#
# RESHARD_WITH_CUDA: auto (on when nvcc and NCCL are found), gpu (auto where
# this machine has an NVIDIA GPU, else off: the Python package's default, so
# that `pip install` on a CPU machine with a CUDA toolkit builds the CPU path),
# ON (required), OFF.
# With CUDA the sources of runtime/cuda/ join reshard_runtime (one library for
# C++ and C/ctypes users), which then links cudart and NCCL. The host-side copy
# planning (region_plan.cc) and its CPU tests build either way.

set(RESHARD_CUDA_ARCHITECTURES "90" CACHE STRING
    "CUDA architectures the kernels are compiled for (default 90: H100/H200; e.g. \"90;100\")")

set(RESHARD_CUDA_DIR ${CMAKE_SOURCE_DIR}/runtime/cuda)
string(TOUPPER "${RESHARD_WITH_CUDA}" _reshard_cuda_want)
set(RESHARD_HAVE_CUDA OFF)
set(_reshard_cuda_missing "")
if(_reshard_cuda_want STREQUAL "GPU")
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE _reshard_smi OUTPUT_VARIABLE _reshard_gpus ERROR_QUIET)
  if(_reshard_smi EQUAL 0 AND _reshard_gpus MATCHES "GPU")
    set(_reshard_cuda_want "AUTO")
  else()
    set(_reshard_cuda_want "OFF")
    message(STATUS "reshard: no NVIDIA GPU here (nvidia-smi -L): CUDA path off "
                   "(RESHARD_WITH_CUDA=ON builds it anyway)")
  endif()
endif()

if(NOT _reshard_cuda_want STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(RESHARD_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin)
    if(RESHARD_NVCC)
      set(CMAKE_CUDA_COMPILER ${RESHARD_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_reshard_cuda_root "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    get_filename_component(_reshard_cuda_root "${_reshard_cuda_root}" DIRECTORY)
    find_path(RESHARD_NCCL_INCLUDE_DIR nccl.h HINTS ENV NCCL_HOME PATH_SUFFIXES include
              PATHS ${_reshard_cuda_root}/include /usr/include /usr/local/include)
    find_library(RESHARD_NCCL_LIBRARY nccl HINTS ENV NCCL_HOME PATH_SUFFIXES lib lib64
                 PATHS ${_reshard_cuda_root}/lib ${_reshard_cuda_root}/lib64 /usr/lib/x86_64-linux-gnu)
    if(NOT RESHARD_NCCL_INCLUDE_DIR OR NOT RESHARD_NCCL_LIBRARY)
      set(_reshard_cuda_missing "NCCL (nccl.h and libnccl; set NCCL_HOME)")
    endif()
  else()
    set(_reshard_cuda_missing "nvcc (set CUDACXX or CUDA_HOME)")
  endif()
  if(_reshard_cuda_missing STREQUAL "")
    set(RESHARD_HAVE_CUDA ON)
  elseif(_reshard_cuda_want STREQUAL "ON")
    message(FATAL_ERROR "RESHARD_WITH_CUDA=ON but ${_reshard_cuda_missing} was not found")
  else()
    message(STATUS "reshard: CUDA path off: ${_reshard_cuda_missing} not found")
  endif()
endif()

if(RESHARD_HAVE_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${RESHARD_CUDA_ARCHITECTURES})
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 dialect flag for nvcc (CMakeLists.txt asks for
  # C++20, and the CUDA sources of reshard_runtime inherit it): name it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "reshard: CUDA path on: nvcc ${CMAKE_CUDA_COMPILER_VERSION} for sm_${RESHARD_CUDA_ARCHITECTURES}, "
                 "NCCL ${RESHARD_NCCL_LIBRARY}")

  # CMakeLists.txt's warning flags are for the host compiler: nvcc gets them
  # through -Xcompiler. Targets made before this file copied them already.
  function(reshard_cuda_wrap_options target)
    get_target_property(_opts ${target} COMPILE_OPTIONS)
    if(NOT _opts)
      return()
    endif()
    set(_wrapped "")
    foreach(_o IN LISTS _opts)
      if(_o MATCHES "^\\$<")
        list(APPEND _wrapped "${_o}")
      else()
        list(APPEND _wrapped "$<$<COMPILE_LANGUAGE:CXX>:${_o}>" "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_o}>")
      endif()
    endforeach()
    set_target_properties(${target} PROPERTIES COMPILE_OPTIONS "${_wrapped}")
  endfunction()
  get_directory_property(_reshard_dir_opts COMPILE_OPTIONS)
  set(_reshard_dir_wrapped "")
  foreach(_o IN LISTS _reshard_dir_opts)
    list(APPEND _reshard_dir_wrapped "$<$<COMPILE_LANGUAGE:CXX>:${_o}>" "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_o}>")
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_reshard_dir_wrapped}")
  reshard_cuda_wrap_options(reshard_runtime)

  target_sources(reshard_runtime PRIVATE
    ${RESHARD_CUDA_DIR}/region_plan.cc
    ${RESHARD_CUDA_DIR}/check.cc
    ${RESHARD_CUDA_DIR}/device_kernels.cc
    ${RESHARD_CUDA_DIR}/nccl_transport.cc
    ${RESHARD_CUDA_DIR}/comm_check.cc
    ${RESHARD_CUDA_DIR}/copy_kernels.cu)
  target_include_directories(reshard_runtime PUBLIC ${RESHARD_NCCL_INCLUDE_DIR})
  target_link_libraries(reshard_runtime PUBLIC CUDA::cudart ${RESHARD_NCCL_LIBRARY})
  target_compile_definitions(reshard_runtime PUBLIC RESHARD_HAVE_CUDA=1)
  set_target_properties(reshard_runtime PROPERTIES CUDA_ARCHITECTURES "${RESHARD_CUDA_ARCHITECTURES}")
  set_target_properties(reshard_runtime PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)

  # tools/bench/*.cu and gpu_*.cc: the kernels against a device-to-device
  # copy, the executor against raw NCCL.
  file(GLOB RESHARD_GPU_BENCH_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tools/bench/*.cu
       ${CMAKE_SOURCE_DIR}/tools/bench/gpu_*.cc)
  foreach(src ${RESHARD_GPU_BENCH_SRC})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_link_libraries(${name} PRIVATE reshard_runtime CUDA::cudart)
  endforeach()
endif()

if(RESHARD_BUILD_TESTS)
  # CPU tests of the device path's host side: copy planning against
  # CopyRegion, the executor's kernel and transport hooks, the loopback plan.
  set(_reshard_cuda_cpu_tests ${RESHARD_CUDA_DIR}/region_plan_test.cc ${RESHARD_CUDA_DIR}/hooks_test.cc
      ${RESHARD_CUDA_DIR}/comm_check_test.cc)
  if(RESHARD_HAVE_CUDA)
    add_executable(reshard_cuda_cpu_test ${_reshard_cuda_cpu_tests})
  else()
    add_executable(reshard_cuda_cpu_test ${_reshard_cuda_cpu_tests} ${RESHARD_CUDA_DIR}/region_plan.cc
                   ${RESHARD_CUDA_DIR}/comm_check.cc)
  endif()
  target_link_libraries(reshard_cuda_cpu_test PRIVATE reshard_runtime GTest::gtest_main)
  gtest_discover_tests(reshard_cuda_cpu_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)

  if(RESHARD_HAVE_CUDA)
    # GPU tests: label `gpu`; each skips (GTEST_SKIP) when no device is usable.
    add_executable(reshard_gpu_test ${RESHARD_CUDA_DIR}/gpu_test.cc)
    target_link_libraries(reshard_gpu_test PRIVATE reshard_runtime CUDA::cudart GTest::gtest_main)
    gtest_discover_tests(reshard_gpu_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS gpu)
  endif()
endif()
