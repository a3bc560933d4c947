// The environment's settings (src/common/env.h): NIBBLE_NUM_THREADS, the kernels' measurement
// knobs and the kernel-forcing names. Unset or empty gives the default; a number outside the
// range, one that is not a whole decimal number, or a name that is not a choice, is an
// invalid_argument error naming the variable and value.
#include <gtest/gtest.h>

#include <string>

#include "common/env.h"
#include "common/parallel.h"
#include "cuda_test_util.h"

namespace nibble {
namespace {

constexpr const char* kVar = "NIBBLE_TEST_ENV_INT";

TEST(EnvInt, UnsetOrEmptyGivesTheDefault) {
  unsetenv(kVar);
  EXPECT_EQ(detail::env_int(kVar, -7, 1, 8), -7);
  const ScopedEnv empty(kVar, "");
  EXPECT_EQ(detail::env_int(kVar, 42, 1, 8), 42);
}

TEST(EnvInt, WholeNumbersInRangeAreRead) {
  for (const auto& [text, value] : {std::pair<std::string, int>{"1", 1}, {"8", 8}, {"+3", 3},
                                    {"-2", -2}, {"007", 7}}) {
    const ScopedEnv set(kVar, text);
    EXPECT_EQ(detail::env_int(kVar, 0, -2, 8), value) << text;
  }
}

TEST(EnvInt, AnythingElseIsAnErrorNamingTheVariable) {
  for (const char* text : {"9", "-3", "abc", "4x", "2.5", " ", "99999999999999999999"}) {
    const ScopedEnv set(kVar, text);
    try {
      detail::env_int(kVar, 0, -2, 8);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(std::string(kVar) + "=" + text), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("-2..8"), std::string::npos) << e.what();
    }
  }
}

TEST(EnvChoice, NamesPickTheirPositionAndOthersAreErrors) {
  unsetenv(kVar);
  EXPECT_EQ(detail::env_choice(kVar, {"sm80_x", "sm90_x"}), -1);
  {
    const ScopedEnv empty(kVar, "");
    EXPECT_EQ(detail::env_choice(kVar, {"sm80_x", "sm90_x"}), -1);
  }
  {
    const ScopedEnv set(kVar, "sm90_x");
    EXPECT_EQ(detail::env_choice(kVar, {"sm80_x", "sm90_x"}), 1);
  }
  for (const char* text : {"sm90", "SM80_X", "sm80_x "}) {
    const ScopedEnv set(kVar, text);
    try {
      detail::env_choice(kVar, {"sm80_x", "sm90_x"});
      ADD_FAILURE() << "no error for '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("expected one of sm80_x, sm90_x"), std::string::npos)
          << e.what();
    }
  }
}

TEST(EnvInt, HostThreadsRejectsABadThreadCount) {
  {
    const ScopedEnv set("NIBBLE_NUM_THREADS", "3");
    EXPECT_EQ(detail::host_threads(), 3);
  }
  const ScopedEnv bad("NIBBLE_NUM_THREADS", "0");
  EXPECT_THROW(detail::host_threads(), Error);
}

}  // namespace
}  // namespace nibble
