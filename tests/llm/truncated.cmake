# Runs `nibble info` on the first half of the real model file: it must fail with a clear error.
#   cmake -DNIBBLE=... -DMODEL=... -DOUT=... -P truncated.cmake
file(SIZE "${MODEL}" size)
math(EXPR half "${size} / 2")
execute_process(COMMAND head -c ${half} "${MODEL}" OUTPUT_FILE "${OUT}/truncated.gguf")
execute_process(COMMAND "${NIBBLE}" info "${OUT}/truncated.gguf" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE "${OUT}/truncated.gguf")
message("${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "a model file cut to ${half} of ${size} bytes was accepted")
endif()
