# CMake helper for storage backends of SparseOperationKit, shipped inside sok-core.
#
#   include(<sparse_operation_kit>/cmake/SokStorageApi.cmake)
#   python_add_library(_core MODULE WITH_SOABI csrc/module.cpp ...)
#   sok_configure_backend(_core)
#
# gives the target sok-core's C headers (the contract sok/storage_api.h, the C++ kit sok/kit/*.hpp),
# the backend's version as SOK_BACKEND_VERSION, and, where a CUDA toolkit is found, the CUDA sources
# csrc/*.cu of the backend (architectures: CMAKE_CUDA_ARCHITECTURES or $CUDAARCHS, default 80;90),
# linked with the static CUDA runtime; sok/gpu_engine/ holds the GPU hash-table engine they share.
include_guard(GLOBAL)
set(SOK_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include")

# A macro, not a function: enable_language(CUDA) must run in the directory scope.
macro(sok_configure_backend target)
  target_include_directories(${target} PRIVATE "${SOK_INCLUDE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
  target_compile_definitions(${target} PRIVATE SOK_BACKEND_VERSION="${PROJECT_VERSION}")
  set_target_properties(${target} PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
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
      file(GLOB_RECURSE _sok_headers CONFIGURE_DEPENDS "${SOK_INCLUDE_DIR}/sok/*.h" "${SOK_INCLUDE_DIR}/sok/*.hpp"
           "${SOK_INCLUDE_DIR}/sok/*.cuh")
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
