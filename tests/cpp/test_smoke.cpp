#include <gtest/gtest.h>

#include "nibble/nibble.h"

TEST(Smoke, FormatRoundTripString) {
  EXPECT_EQ(nibble::to_string(nibble::parse_linear_format("w4a8_g128")), "w4a8_g128");
}
