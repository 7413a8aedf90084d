# Compiles through ccache (Debian's ccache: tools/setup.sh installs it) where
# it is installed, so that the build trees of one checkout share what they
# compile:
#  - the Python wheel's tree (tools/python_install.sh: build-python/, at the
#    depth of build/) compiles the runtime, the compiler and the CLI with the
#    flags build/ used, and takes build/'s objects instead of compiling them
#    a second time, so that a wheel build takes a fraction of the time;
#  - a machine that keeps ~/.cache/ccache (CI, a developer's) recompiles
#    only what changed, in a fresh clone too.
# CCACHE_BASEDIR makes the paths inside the checkout relative to the build
# tree, so that two trees at one depth hash alike. RESHARD_CCACHE=OFF turns
# it off; a launcher given on the command line (CMAKE_CXX_COMPILER_LAUNCHER)
# is kept.
option(RESHARD_CCACHE "Compile through ccache where it is installed" ON)
if(RESHARD_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(RESHARD_CCACHE_PROGRAM ccache)
  if(RESHARD_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}
                                    ${RESHARD_CCACHE_PROGRAM})
    message(STATUS "reshard: compiling through ccache (${RESHARD_CCACHE_PROGRAM})")
  endif()
endif()
