# libFuzzer harnesses (tests/fuzz/), off by default; clang only. CI builds
# them together with the sanitized test suite (tools/sanitize_build.sh,
# build-sanitize/, at -O1) and tools/test.d/50-fuzz.sh runs them. For long
# fuzzing runs, a faster build of their own:
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
#         -DRESHARD_FUZZ=ON -DRESHARD_BUILD_TESTS=OFF -DRESHARD_WITH_CUDA=OFF
#   ninja -C build-fuzz reshard_plan_fuzz reshard_spec_fuzz
# With RESHARD_FUZZ on, the compiler and runtime libraries are built with
# coverage for libFuzzer and AddressSanitizer + UndefinedBehaviorSanitizer
# (RESHARD_SANITIZE_FLAGS of cmake/sanitize.cmake; every UB report aborts).
option(RESHARD_FUZZ "Build the libFuzzer harnesses in tests/fuzz (clang only)" OFF)

if(RESHARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "RESHARD_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  foreach(lib reshard_compiler reshard_runtime)
    target_compile_options(${lib} PRIVATE -fsanitize=fuzzer-no-link ${RESHARD_SANITIZE_FLAGS})
    target_link_options(${lib} PRIVATE ${RESHARD_SANITIZE_FLAGS})
  endforeach()
  add_library(reshard_fuzz_replay STATIC ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.cc)
  target_link_libraries(reshard_fuzz_replay PUBLIC reshard_compiler reshard_runtime)
  target_compile_options(reshard_fuzz_replay PRIVATE -fsanitize=fuzzer-no-link ${RESHARD_SANITIZE_FLAGS})
  foreach(name plan spec)
    add_executable(reshard_${name}_fuzz ${CMAKE_SOURCE_DIR}/tests/fuzz/${name}_fuzz.cc)
    target_link_libraries(reshard_${name}_fuzz PRIVATE reshard_fuzz_replay)
    target_compile_options(reshard_${name}_fuzz PRIVATE -fsanitize=fuzzer ${RESHARD_SANITIZE_FLAGS})
    target_link_options(reshard_${name}_fuzz PRIVATE -fsanitize=fuzzer ${RESHARD_SANITIZE_FLAGS})
  endforeach()
endif()
