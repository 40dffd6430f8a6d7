// TensorRef helpers, build configuration, and the test suite's own bf16 / f16 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace kdatest {
namespace {

TEST(TensorRef, MakeTensorIsContiguousRowMajor) {
  double buf[120];
  TensorRef t = openkda::make_tensor(buf, DType::kF64, {2, 3, 4, 5});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.ndim, 4);
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.stride[0], 60);
  EXPECT_EQ(t.stride[1], 20);
  EXPECT_EQ(t.stride[2], 5);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(t.size(-4), 2);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.is_float());
  EXPECT_EQ(t.device, openkda::Device{});
  EXPECT_EQ(openkda::shape_str(t), "[2, 3, 4, 5]");
}

TEST(TensorRef, ContiguityIgnoresSizeOneDims) {
  float buf[12];
  TensorRef t = openkda::make_tensor(buf, DType::kF32, {1, 3, 1, 4});
  t.stride[0] = 999;
  t.stride[2] = -7;
  EXPECT_TRUE(t.is_contiguous());
  t.stride[1] = 5;
  EXPECT_FALSE(t.is_contiguous());
}

TEST(TensorRef, UndefinedAndIntegerTensors) {
  TensorRef u;
  EXPECT_FALSE(u.defined());
  EXPECT_FALSE(u.is_float());
  int32_t idx[4];
  TensorRef i = openkda::make_tensor(idx, DType::kI32, {4});
  EXPECT_FALSE(i.is_float());
  EXPECT_EQ(i.numel(), 4);
}

TEST(TensorRef, DtypeNamesAndSizes) {
  const struct {
    DType dt;
    const char* name;
    size_t size;
  } table[] = {{DType::kF16, "f16", 2}, {DType::kBF16, "bf16", 2}, {DType::kF32, "f32", 4},
               {DType::kF64, "f64", 8}, {DType::kI32, "i32", 4},   {DType::kI64, "i64", 8},
               {DType::kU8, "u8", 1}};
  for (const auto& r : table) {
    EXPECT_STREQ(openkda::dtype_name(r.dt), r.name);
    EXPECT_EQ(openkda::dtype_size(r.dt), r.size);
  }
  EXPECT_STREQ(openkda::device_name(openkda::DeviceType::kCPU), "cpu");
  EXPECT_STREQ(openkda::device_name(openkda::DeviceType::kCUDA), "cuda");
}

TEST(BuildConfig, HasVersion) {
  const openkda::BuildConfig c = openkda::build_config();
  ASSERT_NE(c.version, nullptr);
  EXPECT_GT(std::string(c.version).size(), 0u);
  ASSERT_NE(c.cuda_archs, nullptr);
}

// The test suite's own conversions (used to build low-precision inputs).
TEST(TestUtil, Bf16AndF16Conversions) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  // Round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);               // rounds to inf
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (0)
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -14)), 0x8400);        // smallest normal, negative
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  for (int i = 0; i < 0x7c00; i += 7) {  // finite positive halves (every 7th) round-trip
    const uint16_t h = static_cast<uint16_t>(i);
    EXPECT_EQ(f32_to_f16(f16_to_f32(h)), h);
  }
}

TEST(TestUtil, HostTensorRoundsOnWrite) {
  HostTensor t(DType::kBF16, {3});
  t.set(0, 1.0 + 1e-3);
  EXPECT_EQ(t.get(0), 1.0);
  HostTensor i(DType::kI64, {2});
  i.set(1, 123456789012.0);
  EXPECT_EQ(i.get(1), 123456789012.0);
  EXPECT_NEAR(rel_rms({1, 2, 3}, {1, 2, 3.0000003}), 1e-7 * 3 / std::sqrt(14.0), 1e-12);
}

}  // namespace
}  // namespace kdatest
