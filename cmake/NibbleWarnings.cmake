# Warnings for host C++ (and for the host side of CUDA units). No fast-math anywhere: the
# reference conversions and the quantizers rely on IEEE rounding.
function(nibble_set_warnings target)
  set(flags -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wpedantic)
  if(NIBBLE_WERROR)
    list(APPEND flags -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${flags}>)
endfunction()
