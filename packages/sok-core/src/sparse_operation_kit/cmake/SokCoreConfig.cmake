# SokCore: sok-core's CMake package, for the storage backends of SparseOperationKit. It ships inside
# sok-core (sparse_operation_kit/cmake/); a backend's CMakeLists.txt is
#
#   cmake_minimum_required(VERSION 3.18...3.31)
#   project(${SKBUILD_PROJECT_NAME} VERSION ${SKBUILD_PROJECT_VERSION} LANGUAGES CXX)
#   find_package(SokCore CONFIG REQUIRED)
#   sok_add_backend(my_sok_backend SOURCES csrc/module.cpp csrc/my_table.cpp)
#
# pip's build of the backend (scikit-build-core) finds the sok-core installed in the build's Python
# by itself: sok-core's entry point in the group cmake.root sets SokCore_ROOT. Any other build names
# this directory: -DSokCore_DIR=$(python -c "import sparse_operation_kit as s; print(s.get_cmake_dir())").
#
# SokCoreConfigVersion.cmake beside this file, for find_package(SokCore <version>), is written by
# sok-core's build from its version (pyproject.toml), so an installed sok-core has one and a source
# tree has none: sok-core's own backends build against the checkout they sit in and ask no version.
#
# sok_add_backend(<package> SOURCES <source>...) builds the backend's pybind11 module <package>._core
# from the C++ sources and installs it into <package>. With STORAGE_LIBRARY <name> STORAGE_SOURCES
# <source>... the storage itself is built once as the plain shared library lib<name>.so (its C entry
# point for processes with no Python, such as sok-hps's C++ server) from STORAGE_SOURCES and the
# CUDA sources, installed beside the module, which is built from SOURCES alone and links it (det
# and hkv ship so: sok_det_storage.h, sok_hkv_storage.h). sok_configure_backend(<target>) is the part of
# it that a module target made otherwise (a backend in plain C, another binding library) calls
# itself: it gives the target sok-core's C headers (the contract sok/storage_api.h, the C++ kit
# sok/kit/*.hpp, and sok/gpu_engine/, the GPU hash-table engine of the CUDA sources), C++17, the
# backend's version as SOK_BACKEND_VERSION, and, where a CUDA toolkit is found, the backend's CUDA
# sources csrc/*.cu (architectures: CMAKE_CUDA_ARCHITECTURES or $CUDAARCHS, default 80;90), linked
# with the static CUDA runtime.
#
# A package that compiles TensorFlow ops (sok-core's op libraries, sok-hps's ops of NVIDIA's HPS
# plugin) calls sok_find_tensorflow() after find_package(Python COMPONENTS Interpreter), builds its
# libraries with ${TF_COMPILE_FLAGS} and ${TF_LINK_FLAGS} (sok/tf/python_call.h, under
# SokCore_INCLUDE_DIR, where their kernels call Python), and installs beside them the stamp of
# sok_install_tensorflow_stamp(), which sparse_operation_kit.tf_ops checks when it loads them.
set(SokCore_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include")

# sok_find_tensorflow(): the TensorFlow of the build's Python (Python_EXECUTABLE). Sets TF_FOUND;
# where TensorFlow imports, also TF_VERSION, TF_COMPILE_FLAGS and TF_LINK_FLAGS (;-lists). Link
# the flags as libraries (target_link_libraries), not options: they must follow the objects (the
# linker drops an --as-needed library named before them). Where TensorFlow does not import, the
# caller says what it builds without it.
function(sok_find_tensorflow)
  if(NOT Python_EXECUTABLE)
    message(FATAL_ERROR "sok_find_tensorflow(): Python_EXECUTABLE is not set; call "
                        "find_package(Python REQUIRED COMPONENTS Interpreter) before it")
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import tensorflow as tf; print(tf.__version__); print(';'.join(tf.sysconfig.get_compile_flags())); print(';'.join(tf.sysconfig.get_link_flags()))"
    OUTPUT_VARIABLE _sok_tf_info RESULT_VARIABLE _sok_tf_result ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _sok_tf_result EQUAL 0)
    set(TF_FOUND FALSE PARENT_SCOPE)
    return()
  endif()
  # Three lines: the version, then the compile and the link flags (each a ;-list).
  if(NOT _sok_tf_info MATCHES "^([^\n]*)\n([^\n]*)\n([^\n]*)$")
    message(FATAL_ERROR "unexpected output from TensorFlow's sysconfig (${Python_EXECUTABLE}): ${_sok_tf_info}")
  endif()
  set(TF_FOUND TRUE PARENT_SCOPE)
  set(TF_VERSION "${CMAKE_MATCH_1}" PARENT_SCOPE)
  set(TF_COMPILE_FLAGS "${CMAKE_MATCH_2}" PARENT_SCOPE)
  set(TF_LINK_FLAGS "${CMAKE_MATCH_3}" PARENT_SCOPE)
endfunction()

# sok_install_tensorflow_stamp(<destination>): installs tf_build.txt, holding TF_VERSION (of
# sok_find_tensorflow), into <destination>, the directory of the op libraries built against it:
# sparse_operation_kit.tf_ops (_TF_STAMP) refuses to load them under another TensorFlow.
function(sok_install_tensorflow_stamp destination)
  if(NOT TF_VERSION)
    message(FATAL_ERROR "sok_install_tensorflow_stamp(${destination}): TF_VERSION is not set; call "
                        "sok_find_tensorflow() before it, and build op libraries only where it sets TF_FOUND")
  endif()
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/tf_build.txt" "${TF_VERSION}\n")
  install(FILES "${CMAKE_CURRENT_BINARY_DIR}/tf_build.txt" DESTINATION "${destination}")
endfunction()

# Macros, not functions: enable_language(CUDA) must run in the directory scope.
macro(sok_add_backend package)
  cmake_parse_arguments(_sok_add "" "STORAGE_LIBRARY" "SOURCES;STORAGE_SOURCES" ${ARGN})
  if(NOT _sok_add_SOURCES OR _sok_add_UNPARSED_ARGUMENTS OR (_sok_add_STORAGE_LIBRARY AND NOT _sok_add_STORAGE_SOURCES)
     OR (_sok_add_STORAGE_SOURCES AND NOT _sok_add_STORAGE_LIBRARY))
    message(FATAL_ERROR "sok_add_backend(${package} ${ARGN}): expected sok_add_backend(<package> SOURCES "
                        "<source>... [STORAGE_LIBRARY <name> STORAGE_SOURCES <source>...]), e.g. "
                        "sok_add_backend(my_sok_backend SOURCES csrc/module.cpp)")
  endif()
  if(NOT SKBUILD)
    message(WARNING "Build this package with pip: pip install --no-build-isolation ${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
  find_package(pybind11 CONFIG REQUIRED)
  if(_sok_add_STORAGE_LIBRARY)
    # The storage built once as lib<name>.so (no soname version: found by its file name, shipped in
    # one wheel with its module), for processes with no Python; the module links it (RPATH $ORIGIN)
    # and takes its build facts (version, CUDA and architectures definitions) for BUILD_INFO.
    add_library(${_sok_add_STORAGE_LIBRARY} SHARED ${_sok_add_STORAGE_SOURCES})
    sok_configure_backend(${_sok_add_STORAGE_LIBRARY})
    python_add_library(_core MODULE WITH_SOABI ${_sok_add_SOURCES})
    target_link_libraries(_core PRIVATE pybind11::headers ${_sok_add_STORAGE_LIBRARY})
    target_include_directories(_core PRIVATE "${SokCore_INCLUDE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
    target_compile_definitions(_core PRIVATE $<TARGET_PROPERTY:${_sok_add_STORAGE_LIBRARY},COMPILE_DEFINITIONS>)
    set_target_properties(_core PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_VISIBILITY_PRESET hidden
                                           VISIBILITY_INLINES_HIDDEN ON BUILD_RPATH "$ORIGIN" INSTALL_RPATH "$ORIGIN")
    install(TARGETS _core ${_sok_add_STORAGE_LIBRARY} LIBRARY DESTINATION ${package})
  else()
    python_add_library(_core MODULE WITH_SOABI ${_sok_add_SOURCES})
    target_link_libraries(_core PRIVATE pybind11::headers)
    sok_configure_backend(_core)
    install(TARGETS _core DESTINATION ${package})
  endif()
endmacro()

macro(sok_configure_backend target)
  target_include_directories(${target} PRIVATE "${SokCore_INCLUDE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
  target_compile_definitions(${target} PRIVATE SOK_BACKEND_VERSION="${PROJECT_VERSION}")
  set_target_properties(${target} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_VISIBILITY_PRESET hidden
                                             VISIBILITY_INLINES_HIDDEN ON)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -O3 -Wall -Wextra -Wno-unused-parameter)
  endif()
  find_package(Threads REQUIRED)
  target_link_libraries(${target} PRIVATE Threads::Threads)

  file(GLOB _sok_cuda_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/csrc/*.cu")
  if(_sok_cuda_sources)
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # Architectures: CMAKE_CUDA_ARCHITECTURES, else the CUDAARCHS environment variable (CMake's
      # own), else 80 and 90 (A100, H100/H200).
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      enable_language(CUDA)
      if(NOT CMAKE_CUDA_ARCHITECTURES)  # an empty value cached by an earlier configure
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      find_package(CUDAToolkit REQUIRED)
      target_sources(${target} PRIVATE ${_sok_cuda_sources})
      # Ninja records no header dependencies from nvcc's depfiles here (`ninja -t deps`: 0 for the
      # .cu objects), so an edit of a header under sok/ (the contract, kit/, gpu_engine/) would leave
      # the CUDA objects stale: name them all.
      file(GLOB_RECURSE _sok_headers CONFIGURE_DEPENDS "${SokCore_INCLUDE_DIR}/sok/*.h"
           "${SokCore_INCLUDE_DIR}/sok/*.hpp" "${SokCore_INCLUDE_DIR}/sok/*.cuh")
      set_source_files_properties(${_sok_cuda_sources} PROPERTIES OBJECT_DEPENDS "${_sok_headers}")
      # The target was made before CUDA was enabled: give it the architectures now.
      set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                            CUDA_STANDARD 17 CUDA_RUNTIME_LIBRARY Static)
      # --fmad=false: the initializers' random stream must equal the host's bit for bit.
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -O3 -Xcompiler=-fvisibility=hidden>)
      target_link_libraries(${target} PRIVATE CUDA::cudart_static)
      string(REPLACE ";" "," _sok_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")  # a list would split the define
      target_compile_definitions(${target} PRIVATE SOK_WITH_CUDA=1 SOK_CUDA_ARCHS="${_sok_cuda_archs}")
      message(STATUS "${target}: CUDA build for architectures ${CMAKE_CUDA_ARCHITECTURES}")
    else()
      message(STATUS "${target}: no CUDA toolkit found, CPU-only build")
    endif()
  endif()
endmacro()
