#include "common/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"

namespace nibble::detail {

int env_int(const char* name, int unset, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return unset;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || value < lo || value > hi)
    fail(ErrorCode::invalid_argument, std::string(name) + "=" + v + ": expected a whole number in " +
                                          std::to_string(lo) + ".." + std::to_string(hi));
  return static_cast<int>(value);
}

int env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return -1;
  int i = 0;
  std::string listed;
  for (const char* c : choices) {
    if (std::strcmp(v, c) == 0) return i;
    listed += (i++ == 0 ? "" : ", ") + std::string(c);
  }
  fail(ErrorCode::invalid_argument,
       std::string(name) + "=" + v + ": expected one of " + listed + " (or unset)");
}

}  // namespace nibble::detail
