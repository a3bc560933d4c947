// Element types, tensor views and the owning tensors (src/common/types.cpp, src/api/tensor.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

constexpr DType kAllDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::s8,
                                DType::u8,  DType::s4,  DType::u4,   DType::s32};

TEST(Types, DtypeNamesBitsAndClasses) {
  // clang-format off
  const struct { DType t; const char* name; int bits; bool is_float; } cases[] = {
    {DType::f32, "f32", 32, true},  {DType::f16, "f16", 16, true},  {DType::bf16, "bf16", 16, true},
    {DType::e4m3, "e4m3", 8, true}, {DType::s8, "s8", 8, false},    {DType::u8, "u8", 8, false},
    {DType::s4, "s4", 4, false},    {DType::u4, "u4", 4, false},    {DType::s32, "s32", 32, false},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_STREQ(to_string(c.t), c.name);
    EXPECT_EQ(parse_dtype(c.name), c.t);
    EXPECT_EQ(dtype_bits(c.t), c.bits);
    EXPECT_EQ(is_float(c.t), c.is_float);
    EXPECT_EQ(is_integer(c.t), !c.is_float);
  }
  EXPECT_EQ(std::size(kAllDtypes), std::size(cases));
}

TEST(Types, StorageBytesRoundUpForFourBitTypes) {
  EXPECT_EQ(dtype_storage_bytes(DType::s4, 0), 0);
  EXPECT_EQ(dtype_storage_bytes(DType::s4, 1), 1);
  EXPECT_EQ(dtype_storage_bytes(DType::u4, 7), 4);
  EXPECT_EQ(dtype_storage_bytes(DType::u4, 8), 4);
  EXPECT_EQ(dtype_storage_bytes(DType::bf16, 3), 6);
  EXPECT_EQ(dtype_storage_bytes(DType::s32, 5), 20);
  EXPECT_EQ(dtype_storage_bytes(DType::e4m3, 5), 5);
}

TEST(Types, DeviceNames) {
  EXPECT_EQ(to_string(Device::cpu()), "cpu");
  EXPECT_EQ(to_string(Device::cuda()), "cuda:0");
  EXPECT_EQ(to_string(Device::cuda(3)), "cuda:3");
  EXPECT_TRUE(Device::cpu() == Device{});
  EXPECT_FALSE(Device::cuda(0) == Device::cuda(1));
}

TEST(Types, ContiguousViewsStridesAndSizes) {
  int storage = 0;
  const TensorView v = TensorView::contiguous(&storage, DType::bf16, {2, 3, 4});
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.nbytes(), 48);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.describe(), "bf16[2, 3, 4] cpu");
  TensorView gap = v;
  gap.strides[0] = 16;  // a row gap
  EXPECT_FALSE(gap.is_contiguous());
  TensorView unit = TensorView::contiguous(&storage, DType::s4, {1, 6}, Device::cuda(1));
  unit.strides[0] = 100;  // the stride of a size-1 dimension does not matter
  EXPECT_TRUE(unit.is_contiguous());
  EXPECT_EQ(unit.nbytes(), 3);
  EXPECT_EQ(unit.describe(), "s4[1, 6] cuda:1");
  const TensorView scalar = TensorView::contiguous(&storage, DType::f32, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_TRUE(scalar.is_contiguous());
}

TEST(Tensor, OwnsAlignedContiguousStorageAndCopies) {
  Tensor t = Tensor::empty(DType::u4, {3, 10});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.nbytes(), 15);
  EXPECT_EQ(t.view().stride(0), 10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  t.fill_bytes(0x5A);
  for (uint8_t b : test::bytes_of(t)) ASSERT_EQ(b, 0x5A);
  // to() makes an independent copy; copy_from copies every byte.
  Tensor c = t.to(Device::cpu());
  EXPECT_NE(c.data(), t.data());
  EXPECT_EQ(test::bytes_of(c), test::bytes_of(t));
  t.fill_bytes(0x00);
  EXPECT_NE(test::bytes_of(c), test::bytes_of(t));
  t.copy_from(c);
  EXPECT_EQ(test::bytes_of(c), test::bytes_of(t));
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, QuantizedHoldersAllocateWhatTheFormatNeeds) {
  const QuantizedWeight asym(parse_weight_format("w4_g64_asym"), 6, 128);
  const QuantizedWeightView v = asym.view();
  EXPECT_EQ(v.q.describe(), "u4[6, 128] cpu");
  EXPECT_EQ(v.scales.describe(), "bf16[6, 2] cpu");
  EXPECT_EQ(v.zeros.describe(), "u8[6, 2] cpu");
  EXPECT_EQ(v.group_scales.data, nullptr);
  EXPECT_EQ(v.group_scales.rank, 0);
  const QuantizedWeight copy = asym.to(Device::cpu());
  EXPECT_EQ(copy.format, asym.format);
  EXPECT_NE(copy.q.data(), asym.q.data());
  EXPECT_FALSE(copy.group_scales.defined());
  const QuantizedActivation a(ActScheme::s8_per_tensor, 5, 32);
  EXPECT_EQ(a.view().q.describe(), "s8[5, 32] cpu");
  EXPECT_EQ(a.view().scales.describe(), "f32[1] cpu");
  EXPECT_EQ(QuantizedActivation(ActScheme::e4m3_per_token, 5, 32).view().scales.describe(),
            "f32[5] cpu");
}

// weight_storage() golden specs: the buffers of each scheme with their shapes and dtypes.
TEST(Tensor, WeightStorageGoldenSpecs) {
  const auto spec = [](const BufferSpec& b) {
    if (b.rank == 0) return std::string("none");
    std::string s = std::string(to_string(b.dtype)) + "[" + std::to_string(b.shape[0]);
    if (b.rank == 2) s += ", " + std::to_string(b.shape[1]);
    return s + "]";
  };
  struct Case {
    const char* format;
    const char* q;
    const char* scales;
    const char* zeros;
    const char* group_scales;
  };
  // clang-format off
  const Case cases[] = {
      {"w4_pc",           "s4[4, 256]", "f32[4]",      "none",        "none"},
      {"w4_g128",         "s4[4, 256]", "bf16[4, 2]",  "none",        "none"},
      {"w8_pc_sf16",      "s8[4, 256]", "f16[4]",      "none",        "none"},
      {"w8_g64",          "s8[4, 256]", "bf16[4, 4]",  "none",        "none"},
      {"w4_g32_asym",     "u4[4, 256]", "bf16[4, 8]",  "u8[4, 8]",    "none"},
      {"w4_g256_fzp_sf16", "u4[4, 256]", "f16[4, 1]",  "f16[4, 1]",   "none"},
      {"w4_g128_2level",  "u4[4, 256]", "f32[4]",      "u8[4, 2]",    "u8[4, 2]"},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(c.format);
    const WeightStorage st = weight_storage(parse_weight_format(c.format), 4, 256);
    EXPECT_EQ(spec(st.q), c.q);
    EXPECT_EQ(spec(st.scales), c.scales);
    EXPECT_EQ(spec(st.zeros), c.zeros);
    EXPECT_EQ(spec(st.group_scales), c.group_scales);
  }
}

TEST(Device, CpuOnlyBuildReportsNoCudaDevice) {
  const BuildInfo b = build_info();
  EXPECT_FALSE(b.version.empty());
  if (b.cuda) GTEST_SKIP() << "CUDA build: covered by the GPU tests";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_NE(cuda_unavailable_reason().find("no CUDA backend"), std::string::npos);
  EXPECT_TRUE(b.cuda_archs.empty());
  EXPECT_NO_THROW(synchronize(Device::cpu()));
  EXPECT_TRUE(test::throws_error([] { synchronize(Device::cuda()); }, ErrorCode::unsupported,
                                 {"nibble::synchronize", test::arg("device")}));
  EXPECT_TRUE(test::throws_error([] { cuda_device_info(0); }, ErrorCode::unsupported,
                                 {"nibble::cuda_device_info", test::arg("ordinal")}));
}

}  // namespace
}  // namespace nibble
