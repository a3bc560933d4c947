#include "common/parallel.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

#include "common/env.h"

namespace nibble::detail {

int host_threads() {
  const int n = env_int("NIBBLE_NUM_THREADS", 0, 1, 1 << 16);
  if (n >= 1) return n;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void parallel_rows(int64_t n, int64_t min_rows,
                   const std::function<void(int64_t r0, int64_t r1)>& body) {
  if (n <= 0) return;
  const int64_t by_size = std::max<int64_t>(1, n / std::max<int64_t>(1, min_rows));
  const auto parts = static_cast<int>(std::min<int64_t>(host_threads(), by_size));
  if (parts <= 1) return body(0, n);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(parts));
  auto run = [&](int p) {
    try {
      body(n * p / parts, n * (p + 1) / parts);
    } catch (...) {
      errors[static_cast<size_t>(p)] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(parts - 1));
  for (int p = 1; p < parts; ++p) threads.emplace_back(run, p);
  run(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace nibble::detail
