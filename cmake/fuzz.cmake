# libFuzzer harnesses (tests/fuzz/), off by default. Build them in a build
# directory of their own with clang, e.g.
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
#         -DRESHARD_FUZZ=ON -DRESHARD_BUILD_TESTS=OFF -DRESHARD_WITH_CUDA=OFF
#   ninja -C build-fuzz reshard_plan_fuzz reshard_spec_fuzz
# (tools/test.d/50-fuzz.sh does this and runs them). With RESHARD_FUZZ on, the
# compiler and runtime libraries are built with coverage for libFuzzer and
# AddressSanitizer + UndefinedBehaviorSanitizer (every UB report aborts).
option(RESHARD_FUZZ "Build the libFuzzer harnesses in tests/fuzz (clang only)" OFF)

if(RESHARD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "RESHARD_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  set(RESHARD_SANITIZE -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  foreach(lib reshard_compiler reshard_runtime)
    target_compile_options(${lib} PRIVATE -fsanitize=fuzzer-no-link ${RESHARD_SANITIZE})
    target_link_options(${lib} PRIVATE ${RESHARD_SANITIZE})
  endforeach()
  add_library(reshard_fuzz_replay STATIC ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.cc)
  target_link_libraries(reshard_fuzz_replay PUBLIC reshard_compiler reshard_runtime)
  target_compile_options(reshard_fuzz_replay PRIVATE -fsanitize=fuzzer-no-link ${RESHARD_SANITIZE})
  foreach(name plan spec)
    add_executable(reshard_${name}_fuzz ${CMAKE_SOURCE_DIR}/tests/fuzz/${name}_fuzz.cc)
    target_link_libraries(reshard_${name}_fuzz PRIVATE reshard_fuzz_replay)
    target_compile_options(reshard_${name}_fuzz PRIVATE -fsanitize=fuzzer ${RESHARD_SANITIZE})
    target_link_options(reshard_${name}_fuzz PRIVATE -fsanitize=fuzzer ${RESHARD_SANITIZE})
  endforeach()
endif()
