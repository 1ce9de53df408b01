# CMake helper for storage backends of SparseOperationKit, shipped inside sok-core.
#
#   include(<sparse_operation_kit>/cmake/SokStorageApi.cmake)
#   python_add_library(_core MODULE WITH_SOABI csrc/module.cpp ...)
#   sok_configure_backend(_core)
#
# gives the target sok-core's C headers (sok/storage_api.h, sok/backend.hpp, sok/python_table.hpp),
# the backend's version as SOK_BACKEND_VERSION, and, where a CUDA toolkit is found, the CUDA sources
# csrc/*.cu of the backend (architectures: CMAKE_CUDA_ARCHITECTURES, default 80;90).
include_guard(GLOBAL)
set(SOK_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}/../include")

function(sok_configure_backend target)
  target_include_directories(${target} PRIVATE "${SOK_INCLUDE_DIR}" "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
  target_compile_definitions(${target} PRIVATE SOK_BACKEND_VERSION="${PROJECT_VERSION}")
  set_target_properties(${target} PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -O3 -Wall -Wextra -Wno-unused-parameter)
  endif()
  find_package(Threads REQUIRED)
  target_link_libraries(${target} PRIVATE Threads::Threads)

  file(GLOB cuda_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/csrc/*.cu")
  if(cuda_sources)
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 80 90 PARENT_SCOPE)
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
      endif()
      enable_language(CUDA)
      target_sources(${target} PRIVATE ${cuda_sources})
      target_compile_definitions(${target} PRIVATE SOK_WITH_CUDA=1
                                 SOK_CUDA_ARCHS="${CMAKE_CUDA_ARCHITECTURES}")
      message(STATUS "${target}: CUDA build for architectures ${CMAKE_CUDA_ARCHITECTURES}")
    else()
      message(STATUS "${target}: no CUDA toolkit found, CPU-only build")
    endif()
  endif()
endfunction()
