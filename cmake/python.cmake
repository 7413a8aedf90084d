# The Python package's extension module reshard._reshard (python/src/), built
# with nanobind. Off in the plain C++ build; on when scikit-build-core builds
# the package (`pip install ./python`: python/pyproject.toml points CMake at
# this repository's root) or with -DRESHARD_PYTHON=ON (then give
# -DPython_EXECUTABLE=<a python with nanobind>).
option(RESHARD_PYTHON "Build the Python extension module reshard._reshard" OFF)
if(NOT RESHARD_PYTHON AND NOT SKBUILD)
  return()
endif()

find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE nanobind_ROOT RESULT_VARIABLE _reshard_nb)
if(NOT _reshard_nb EQUAL 0)
  message(FATAL_ERROR "reshard: the Python package needs nanobind in ${Python_EXECUTABLE} (pip install nanobind)")
endif()
find_package(nanobind CONFIG REQUIRED)

# (The compiler library, linked into the module, is position-independent in
# every build: CMakeLists.txt.)

file(GLOB RESHARD_PYTHON_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/src/*.cc)
nanobind_add_module(_reshard NB_STATIC ${RESHARD_PYTHON_SRC})
target_link_libraries(_reshard PRIVATE reshard_compiler reshard_runtime)
target_include_directories(_reshard PRIVATE ${CMAKE_SOURCE_DIR})
# The runtime library is installed beside the module.
set_target_properties(_reshard PROPERTIES INSTALL_RPATH "$ORIGIN" BUILD_RPATH "$<TARGET_FILE_DIR:reshard_runtime>")

# What the Python layer must know before loading the extension: whether the
# runtime links NCCL (then reshard/__init__.py first loads the framework's
# libnccl.so.2, so that the runtime binds to it rather than the system's).
if(RESHARD_HAVE_CUDA)
  set(_reshard_py_cuda True)
else()
  set(_reshard_py_cuda False)
endif()
file(WRITE ${CMAKE_BINARY_DIR}/python/_build.py
     "# Written by cmake/python.cmake when the package is built.\nHAVE_CUDA = ${_reshard_py_cuda}\n")

if(SKBUILD)
  # The CLI inside the package (reshard/bin/reshard, beside the runtime it
  # links): the `reshard` console command (reshard/_cli.py) runs it.
  set_target_properties(reshard PROPERTIES INSTALL_RPATH "$ORIGIN/..")
  install(TARGETS reshard RUNTIME DESTINATION reshard/bin COMPONENT python)
  set_target_properties(reshard_simgrid PROPERTIES INSTALL_RPATH "$ORIGIN/..")
  install(TARGETS reshard_simgrid LIBRARY DESTINATION reshard/bin COMPONENT python)  # beside it: simulate loads it
  install(FILES ${CMAKE_BINARY_DIR}/python/_build.py DESTINATION reshard COMPONENT python)
  install(TARGETS _reshard LIBRARY DESTINATION reshard COMPONENT python)
  install(TARGETS reshard_runtime LIBRARY DESTINATION reshard COMPONENT python)
endif()
