// RUN: sd-opt %s --split-input-file --sd-attention-stats | FileCheck %s

// A training entry after autodiff: the attention and its gradient on the same
// operands. The attention gains its row statistics (f32 [B, H, T]) and the
// gradient takes them with the forward's output.
// CHECK-LABEL: func.func @step
//       CHECK:   %[[Y:.*]], %[[L:.*]] = sd.attention %arg0, %arg1, %arg2, %arg3, %{{.*}} {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<1x1x8x8xi1>, none) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>)
//       CHECK:   sd.attention_grad %arg4, %arg0, %arg1, %arg2, %arg3, %{{.*}}, %[[Y]], %[[L]] {layout = "bshd", scale = 2.500000e-01 : f32}
func.func @step(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x8x2x16xbf16>, %v: tensor<2x8x2x16xbf16>,
                %mask: tensor<1x1x8x8xi1>, %dy: tensor<2x8x4x16xbf16>)
    -> (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>) {
  %none = sd.none
  %y = sd.attention %q, %k, %v, %mask, %none {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<1x1x8x8xi1>, none) -> tensor<2x8x4x16xbf16>
  %dq, %dk, %dv = sd.attention_grad %dy, %q, %k, %v, %mask, %none, %none, %none {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>, tensor<1x1x8x8xi1>, none, none, none) -> (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>)
  return %y, %dq, %dk, %dv : tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>
}

// -----

// A gradient whose operands no attention in its entry reads the same way
// (another scale) is left as it is.
// CHECK-LABEL: func.func @other
//       CHECK:   sd.attention %{{.*}} -> tensor<1x2x8x16xf32>
//       CHECK:   sd.attention_grad %arg3, %arg0, %arg1, %arg2, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {scale = 5.000000e-01 : f32}
func.func @other(%q: tensor<1x2x8x16xf32>, %kt: tensor<1x2x16x8xf32>, %v: tensor<1x2x8x16xf32>, %dy: tensor<1x2x8x16xf32>)
    -> (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>) {
  %none = sd.none
  %y = sd.attention %q, %kt, %v, %none, %none {scale = 2.500000e-01 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x16x8xf32>, tensor<1x2x8x16xf32>, none, none) -> tensor<1x2x8x16xf32>
  %dq, %dkt, %dv = sd.attention_grad %dy, %q, %kt, %v, %none, %none, %none, %none {scale = 5.000000e-01 : f32} : (tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>, tensor<1x2x16x8xf32>, tensor<1x2x8x16xf32>, none, none, none, none) -> (tensor<1x2x8x16xf32>, tensor<1x2x16x8xf32>, tensor<1x2x8x16xf32>)
  return %y, %dq : tensor<1x2x8x16xf32>, tensor<1x2x8x16xf32>
}
