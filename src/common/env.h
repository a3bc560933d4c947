// Integer settings read from the environment (NIBBLE_NUM_THREADS and the kernels' measurement
// knobs such as NIBBLE_SM90_BM): one reader, so that every one of them rejects a value it cannot
// use instead of silently running something else.
#pragma once

#include <initializer_list>

namespace nibble::detail {

/// The value of environment variable `name` when it is set and not empty, else `unset`. A value
/// that is not a whole decimal number in [lo, hi] is an invalid_argument error naming the
/// variable, its value and the range.
int env_int(const char* name, int unset, int lo, int hi);

/// The position in `choices` of environment variable `name`'s value, -1 when it is unset or
/// empty. Any other value is an invalid_argument error naming the variable and the choices (a
/// misspelt kernel name must not quietly run another kernel).
int env_choice(const char* name, std::initializer_list<const char*> choices);

}  // namespace nibble::detail
