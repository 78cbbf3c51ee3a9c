// RUN: sd-opt %s --split-input-file --sd-fold-frozen-masks | FileCheck %s

// nanoGPT's causal mask, a buffer exported as a weight and cut to the
// sequence on every step (Slice, then Equal 0): the bools fold into one
// constant; the float slice is not kept, nor the weight nothing reads now.
//   CHECK-NOT:   sd.global @mask
// CHECK-LABEL: func.func @buffer_mask
//   CHECK-NOT:   sd.slice
//   CHECK-NOT:   sd.equal
//       CHECK:   %[[M:.*]] = sd.constant dense<{{\[\[\[}}[false, true], [false, false]]]]> : tensor<1x1x2x2xi1>
//       CHECK:   sd.where %[[M]]
module {
  sd.global @mask "frozen" : tensor<1x1x3x3xf32> = dense<[[[[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]]]> : tensor<1x1x3x3xf32>
  func.func @buffer_mask(%s: tensor<2x4x2x2xf32>) -> tensor<2x4x2x2xf32> {
    %w = sd.global_load @mask : tensor<1x1x3x3xf32>
    %start = sd.constant dense<[0, 0]> : tensor<2xi64>
    %end = sd.constant dense<[2, 2]> : tensor<2xi64>
    %axes = sd.constant dense<[2, 3]> : tensor<2xi64>
    %none = sd.none
    %cut = sd.slice %w, %start, %end, %axes, %none : (tensor<1x1x3x3xf32>, tensor<2xi64>, tensor<2xi64>, tensor<2xi64>, none) -> tensor<1x1x2x2xf32>
    %zero = sd.constant dense<0.0> : tensor<f32>
    %hide = sd.equal %cut, %zero : (tensor<1x1x2x2xf32>, tensor<f32>) -> tensor<1x1x2x2xi1>
    %ninf = sd.constant dense<0xFF800000> : tensor<f32>
    %y = sd.where %hide, %ninf, %s : (tensor<1x1x2x2xi1>, tensor<f32>, tensor<2x4x2x2xf32>) -> tensor<2x4x2x2xf32>
    return %y : tensor<2x4x2x2xf32>
  }
}

// -----

// A trainable weight changes at run time, and a float result is never folded
// (that would copy weights into the plan): both stay.
//       CHECK:   sd.global @t "trainable"
//       CHECK:   sd.global @f "frozen"
// CHECK-LABEL: func.func @not_folded
//       CHECK:   sd.equal
//       CHECK:   sd.mul
module {
  sd.global @t "trainable" : tensor<2xf32> = dense<[1.0, 0.0]> : tensor<2xf32>
  sd.global @f "frozen" : tensor<2xf32> = dense<[1.0, 0.0]> : tensor<2xf32>
  func.func @not_folded(%x: tensor<2xf32>) -> (tensor<2xi1>, tensor<2xf32>) {
    %t = sd.global_load @t : tensor<2xf32>
    %f = sd.global_load @f : tensor<2xf32>
    %zero = sd.constant dense<0.0> : tensor<f32>
    %hide = sd.equal %t, %zero : (tensor<2xf32>, tensor<f32>) -> tensor<2xi1>
    %sq = sd.mul %f, %f : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %y = sd.add %sq, %x : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    return %hide, %y : tensor<2xi1>, tensor<2xf32>
  }
}
