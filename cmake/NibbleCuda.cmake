# The CUDA backend: found or not, and the targets it is compiled for.
#
# NIBBLE_CUDA_ARCHS is a ;-list of targets. Each becomes
#   -gencode arch=compute_<a>,code=sm_<a>
# and the lowest plain target is also embedded as PTX so newer GPUs can JIT it.
#   80   Ampere A100 (runs on sm_86 / sm_89 too): mma.sync, cp.async, ldmatrix
#   86   Ampere GA10x, 89 Ada: add for native tuning; 80 code already runs there
#   90a  Hopper H100/H200 with the arch-specific features (wgmma, setmaxnreg) that plain
#        sm_90 lacks; the `a` target must be written as compute_90a/sm_90a (the -arch=sm_90a
#        shorthand also runs a plain sm_90 pass that rejects wgmma).
# CMAKE_CUDA_ARCHITECTURES is switched off so CMake adds no flags of its own.
include(CheckLanguage)

set(NIBBLE_WITH_CUDA OFF)
if(NOT NIBBLE_CUDA STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    enable_language(CUDA)
    # CMake before 3.27 has no C++20 flag for nvcc in its tables; nvcc ≥ 12 accepts -std=c++20.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(NIBBLE_WITH_CUDA ON)
  elseif(NIBBLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "NIBBLE_CUDA=ON but no CUDA compiler was found (set CUDACXX or PATH)")
  endif()
endif()
message(STATUS "nibble: CUDA backend ${NIBBLE_WITH_CUDA} (NIBBLE_CUDA=${NIBBLE_CUDA})")

function(nibble_set_cuda_flags target)
  set(gencode "")
  set(lowest "")
  foreach(arch IN LISTS NIBBLE_CUDA_ARCHS)
    if(NOT arch MATCHES "^[0-9]+a?$")
      message(FATAL_ERROR "NIBBLE_CUDA_ARCHS: '${arch}' is not of the form 80 or 90a")
    endif()
    list(APPEND gencode "SHELL:-gencode arch=compute_${arch},code=sm_${arch}")
    if(NOT arch MATCHES "a$" AND (lowest STREQUAL "" OR arch LESS lowest))
      set(lowest ${arch})
    endif()
  endforeach()
  if(NOT lowest STREQUAL "")
    list(APPEND gencode "SHELL:-gencode arch=compute_${lowest},code=compute_${lowest}")
  endif()
  set(flags -lineinfo --expt-relaxed-constexpr -Xptxas=-warn-spills
            "SHELL:-Xcompiler -Wall,-Wextra")
  if(NIBBLE_WERROR)
    list(APPEND flags "SHELL:-Werror all-warnings" "SHELL:-Xcompiler -Werror")
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${gencode} ${flags}>)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
endfunction()
