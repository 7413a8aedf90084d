# AddressSanitizer + UndefinedBehaviorSanitizer for everything this build
# makes (libraries, `reshard`, every test binary), off by default. Every UB
# report aborts. tools/sanitize_build.sh configures build-sanitize/ with it
# (and with the fuzz harnesses, so one clang build serves both CI stages):
#   cmake -S . -B build-sanitize -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
#         -DRESHARD_SANITIZE=ON -DRESHARD_WITH_CUDA=OFF
# Included before any target is defined: add_compile_options only reaches
# targets created after it.
option(RESHARD_SANITIZE "Build everything with -fsanitize=address,undefined" OFF)

# The flags, also what cmake/fuzz.cmake builds its harnesses' code with.
set(RESHARD_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
if(RESHARD_SANITIZE)
  add_compile_options(${RESHARD_SANITIZE_FLAGS})
  add_link_options(${RESHARD_SANITIZE_FLAGS})
  add_compile_definitions(RESHARD_SANITIZE=1)
endif()
