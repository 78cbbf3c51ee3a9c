// Shape rules on their own (the kernels are checked by test/ops/op_harness.py).
#include "sd/ops/schema.h"
#include <gtest/gtest.h>

using namespace sd;

namespace {

TEST(ShapeRules, BroadcastAndReshapeInference) {
  AttrMap none;
  ShapeContext c{none, {TensorInfo{DType::F32, {2, 1, 4}}, TensorInfo{DType::F32, {3, 1}}}, {nullptr, nullptr}, {}, 1};
  ASSERT_TRUE(inferShapes("Add", c).isOk());
  EXPECT_EQ(c.outputs[0].dims, (Dims{2, 3, 4}));
  std::vector<int64_t> shape = {0, -1};
  TensorView sv{shape.data(), DType::I64, {2}};
  ShapeContext r{none, {TensorInfo{DType::F32, {2, 3, 4}}, TensorInfo{DType::I64, {2}}}, {nullptr, &sv}, {}, 1};
  ASSERT_TRUE(inferShapes("Reshape", r).isOk());
  EXPECT_EQ(r.outputs[0].dims, (Dims{2, 12}));
  ShapeContext bad{none, {TensorInfo{DType::F32, {2, 3}}, TensorInfo{DType::F32, {4, 3}}}, {nullptr, nullptr}, {}, 1};
  EXPECT_FALSE(inferShapes("Add", bad).isOk());
}

} // namespace
