// RUN: sd-opt %s --split-input-file --sd-pack-swiglu | FileCheck %s

// Llama's MLP after sd-fuse-projections: gate and up in one Linear [.., 2F],
// split apart for the SwiGLU. SwiGLUPacked reads the Linear's output as it is.
// CHECK-LABEL: func.func @mlp
//   CHECK-NOT:   sd.split
//       CHECK:   %[[Y:.*]] = sd.swiglu_packed %arg0 : (tensor<2x4x16xf32>) -> tensor<2x4x8xf32>
//       CHECK:   return %[[Y]]
func.func @mlp(%gu: tensor<2x4x16xf32>) -> tensor<2x4x8xf32> {
  %sizes = sd.constant dense<[8, 8]> : tensor<2xi64>
  %g, %u = sd.split %gu, %sizes {axis = 2 : i64} : (tensor<2x4x16xf32>, tensor<2xi64>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
  %y = sd.swiglu %g, %u : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %y : tensor<2x4x8xf32>
}

// -----

// Kept: halves in the other order, a half read by something else, a split
// along another axis.
// CHECK-LABEL: func.func @kept
//   CHECK-NOT:   sd.swiglu_packed
//       CHECK:   return
func.func @kept(%gu: tensor<2x4x16xf32>, %x: tensor<4x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>) {
  %sizes = sd.constant dense<[8, 8]> : tensor<2xi64>
  %g, %u = sd.split %gu, %sizes {axis = 2 : i64} : (tensor<2x4x16xf32>, tensor<2xi64>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
  %y = sd.swiglu %u, %g : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %g2, %u2 = sd.split %gu, %sizes {axis = 2 : i64} : (tensor<2x4x16xf32>, tensor<2xi64>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
  %y2 = sd.swiglu %g2, %u2 : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %rows = sd.constant dense<[2, 2]> : tensor<2xi64>
  %a, %b = sd.split %x, %rows {axis = 0 : i64} : (tensor<4x4x8xf32>, tensor<2xi64>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>)
  %y3 = sd.swiglu %a, %b : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %y, %y2, %g2, %y3 : tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>
}
