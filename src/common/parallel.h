// Row-parallel loops of the host code (weight quantization and packing, the slow host steps of
// quantizing a model): rows are independent, so a matrix is cut into contiguous row ranges, one
// per thread, and the results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace nibble::detail {

/// Threads parallel_rows uses at most: NIBBLE_NUM_THREADS when set (≥ 1), else the hardware's
/// concurrency.
int host_threads();

/// Runs body(r0, r1) over [0, n) in contiguous ranges, at least `min_rows` rows each, on up to
/// host_threads() threads (the calling thread takes the first range). When bodies throw, the
/// exception of the lowest range is rethrown after every thread has finished: the one a serial
/// loop would have thrown first, as long as each body stops at its first bad row.
void parallel_rows(int64_t n, int64_t min_rows,
                   const std::function<void(int64_t r0, int64_t r1)>& body);

}  // namespace nibble::detail
