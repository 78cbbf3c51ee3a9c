// RUN: sd-opt %s --split-input-file --sd-fuse-gemm-epilogues --sd-propagate-shapes | FileCheck %s

// Inference: Linear then Gelu become one sd.linear_gelu, with no `pre` result.
// CHECK-LABEL: func.func @linear_gelu
//       CHECK:   %[[F:.*]] = sd.linear_gelu %arg0, %arg1, %arg2 {approximate = "tanh", layout = "io", module = "fc"} : (tensor<2x3x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
//   CHECK-NOT:   sd.linear
//   CHECK-NOT:   sd.gelu
//       CHECK:   return %[[F]]
func.func @linear_gelu(%x: tensor<2x3x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<2x3x8xf32>
    attributes {sd.entry = "infer"} {
  %p = sd.linear %x, %w, %b {layout = "io", module = "fc"} : (tensor<2x3x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  %g = sd.gelu %p {approximate = "tanh"} : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  return %g : tensor<2x3x8xf32>
}

// -----

// Training: the backward of Linear + GELU. The forward keeps the product for
// GeluGrad; the input gradient's Gemm, GeluGrad and the bias gradient's
// ReduceSum become one sd.gemm_dgelu over the flattened product.
// CHECK-LABEL: func.func @train
//       CHECK:   %[[OUT:.*]], %[[PRE:.*]] = sd.linear_gelu %arg0, %arg1, %arg2 {layout = "oi", module = "fc"} : (tensor<2x3x4xf32>, tensor<8x4xf32>, tensor<8xf32>) -> (tensor<2x3x8xf32>, tensor<2x3x8xf32>)
//       CHECK:   %[[P:.*]] = sd.reshape %[[PRE]], %{{.*}} : (tensor<2x3x8xf32>, tensor<2xi64>) -> tensor<6x8xf32>
//       CHECK:   %[[DP:.*]], %[[DB:.*]] = sd.gemm_dgelu %arg3, %arg4, %[[P]] {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, tensor<6x8xf32>) -> (tensor<6x8xf32>, tensor<8xf32>)
//   CHECK-NOT:   sd.gelu_grad
//   CHECK-NOT:   sd.reduce_sum
//       CHECK:   return %[[OUT]], %[[DP]], %[[DB]]
func.func @train(%x: tensor<2x3x4xf32>, %w: tensor<8x4xf32>, %b: tensor<8xf32>, %dz: tensor<6x5xf32>,
                 %w2: tensor<8x5xf32>) -> (tensor<2x3x8xf32>, tensor<6x8xf32>, tensor<8xf32>)
    attributes {sd.entry = "train_step"} {
  %p = sd.linear %x, %w, %b {layout = "oi", module = "fc"} : (tensor<2x3x4xf32>, tensor<8x4xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  %g = sd.gelu %p : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %n = sd.none
  %dg = sd.gemm %dz, %w2, %n {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, none) -> tensor<6x8xf32>
  %s3 = sd.constant dense<[2, 3, 8]> : tensor<3xi64>
  %dg3 = sd.reshape %dg, %s3 : (tensor<6x8xf32>, tensor<3xi64>) -> tensor<2x3x8xf32>
  %dp = sd.gelu_grad %dg3, %p : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %s2 = sd.constant dense<[6, 8]> : tensor<2xi64>
  %dp2 = sd.reshape %dp, %s2 : (tensor<2x3x8xf32>, tensor<2xi64>) -> tensor<6x8xf32>
  %axes = sd.constant dense<0> : tensor<1xi64>
  %db = sd.reduce_sum %dp2, %axes {keepdims = 0 : i64} : (tensor<6x8xf32>, tensor<1xi64>) -> tensor<8xf32>
  return %g, %dp2, %db : tensor<2x3x8xf32>, tensor<6x8xf32>, tensor<8xf32>
}

// -----

// A product read by anything but the GELU and its gradient, a Gemm whose
// result has another reader, or a GELU of another approximation than its
// gradient's stay as they are.
// CHECK-LABEL: func.func @other_readers
//       CHECK:   sd.linear
//       CHECK:   sd.gelu
//       CHECK:   sd.gemm
//       CHECK:   sd.gelu_grad
//   CHECK-NOT:   sd.linear_gelu
//   CHECK-NOT:   sd.gemm_dgelu
func.func @other_readers(%x: tensor<6x4xf32>, %w: tensor<4x8xf32>, %dz: tensor<6x5xf32>, %w2: tensor<8x5xf32>)
    -> (tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>) attributes {sd.entry = "train_step"} {
  %n = sd.none
  %p = sd.linear %x, %w, %n {layout = "io", module = "fc"} : (tensor<6x4xf32>, tensor<4x8xf32>, none) -> tensor<6x8xf32>
  %g = sd.gelu %p : (tensor<6x8xf32>) -> tensor<6x8xf32>
  %dg = sd.gemm %dz, %w2, %n {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, none) -> tensor<6x8xf32>
  %dp = sd.gelu_grad %dg, %p {approximate = "tanh"} : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g, %p, %dp, %dg : tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>
}
