// RUN: sd-opt %s --split-input-file --sd-fuse-attention | FileCheck %s

// PyTorch's causal self-attention: MatMul, scale, Where(mask, -inf), Softmax, MatMul.
// CHECK-LABEL: func.func @causal
//       CHECK:   %[[A:.*]] = sd.attention %arg0, %arg1, %arg2, %arg3, %{{.*}} {mask_value = 0xFF800000 : f32, scale = 2.500000e-01 : f32}
//  CHECK-SAME:     -> tensor<2x4x8x16xf32>
//   CHECK-NOT:   sd.softmax
//   CHECK-NOT:   sd.matmul
//       CHECK:   return %[[A]]
func.func @causal(%q: tensor<2x4x8x16xf32>, %kt: tensor<2x4x16x8xf32>, %v: tensor<2x4x8x16xf32>, %m: tensor<1x1x8x8xi1>) -> tensor<2x4x8x16xf32> {
  %s = sd.matmul %q, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %c = sd.constant dense<0.25> : tensor<f32>
  %t = sd.mul %s, %c : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %ninf = sd.constant dense<0xFF800000> : tensor<f32>
  %u = sd.where %m, %ninf, %t : (tensor<1x1x8x8xi1>, tensor<f32>, tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %y = sd.matmul %p, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  return %y : tensor<2x4x8x16xf32>
}

// -----

// Hugging Face's orientation, Where(keep, scores, fill): the kernel's mask is Not(keep).
// CHECK-LABEL: func.func @keep_mask
//       CHECK:   %[[M:.*]] = sd.not %arg3
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %[[M]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 1.000000e+00 : f32}
func.func @keep_mask(%q: tensor<2x8x4xf32>, %kt: tensor<2x4x8xf32>, %v: tensor<2x8x4xf32>, %keep: tensor<1x8x8xi1>) -> tensor<2x8x4xf32> {
  %s = sd.matmul %q, %kt : (tensor<2x8x4xf32>, tensor<2x4x8xf32>) -> tensor<2x8x8xf32>
  %min = sd.constant dense<-3.40282347E+38> : tensor<f32>
  %u = sd.where %keep, %s, %min : (tensor<1x8x8xi1>, tensor<2x8x8xf32>, tensor<f32>) -> tensor<2x8x8xf32>
  %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x8x8xf32>) -> tensor<2x8x8xf32>
  %y = sd.matmul %p, %v : (tensor<2x8x8xf32>, tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
  return %y : tensor<2x8x4xf32>
}

// -----

// No mask, the scale as a divisor: Div(s, c).
// CHECK-LABEL: func.func @unmasked_div
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %{{.*}}, %{{.*}} {scale = 5.000000e-01 : f32}
func.func @unmasked_div(%q: tensor<3x8x4xf32>, %kt: tensor<3x4x6xf32>, %v: tensor<3x6x5xf32>) -> tensor<3x8x5xf32> {
  %s = sd.matmul %q, %kt : (tensor<3x8x4xf32>, tensor<3x4x6xf32>) -> tensor<3x8x6xf32>
  %c = sd.constant dense<2.0> : tensor<f32>
  %t = sd.div %s, %c : (tensor<3x8x6xf32>, tensor<f32>) -> tensor<3x8x6xf32>
  %p = sd.softmax %t {axis = 2 : i64} : (tensor<3x8x6xf32>) -> tensor<3x8x6xf32>
  %y = sd.matmul %p, %v : (tensor<3x8x6xf32>, tensor<3x6x5xf32>) -> tensor<3x8x5xf32>
  return %y : tensor<3x8x5xf32>
}

// -----

// The probabilities are also returned: nothing is fused.
// CHECK-LABEL: func.func @weights_returned
//   CHECK-NOT:   sd.attention
//       CHECK:   sd.softmax
func.func @weights_returned(%q: tensor<8x4xf32>, %kt: tensor<4x8xf32>, %v: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x8xf32>) {
  %s = sd.matmul %q, %kt : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %p = sd.softmax %s {axis = -1 : i64} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = sd.matmul %p, %v : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %y, %p : tensor<8x4xf32>, tensor<8x8xf32>
}

// -----

// A softmax over another axis is not attention.
// CHECK-LABEL: func.func @other_axis
//   CHECK-NOT:   sd.attention
func.func @other_axis(%q: tensor<8x4xf32>, %kt: tensor<4x8xf32>, %v: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %s = sd.matmul %q, %kt : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %p = sd.softmax %s {axis = 0 : i64} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = sd.matmul %p, %v : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}

// -----

// transformers' eager attention: Mul(scale), Add of a constant causal mask
// (0 on and below the diagonal, the f32 minimum above), Softmax, two casts
// to the same type, MatMul. The additive mask becomes the bool mask M == fill.
// CHECK-LABEL: func.func @additive_causal_mask
//       CHECK:   %[[M:.*]] = sd.constant dense<{{\[\[}}[false, true, true], [false, false, true], [false, false, false]]]> : tensor<1x3x3xi1>
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %[[M]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 1.250000e-01 : f32}
//   CHECK-NOT:   sd.cast
//   CHECK-NOT:   sd.softmax
func.func @additive_causal_mask(%q: tensor<2x3x4xf32>, %kt: tensor<2x4x3xf32>, %v: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  %s = sd.matmul %q, %kt : (tensor<2x3x4xf32>, tensor<2x4x3xf32>) -> tensor<2x3x3xf32>
  %c = sd.constant dense<0.125> : tensor<f32>
  %t = sd.mul %s, %c : (tensor<2x3x3xf32>, tensor<f32>) -> tensor<2x3x3xf32>
  %m = sd.constant dense<[[[0.0, -3.40282347E+38, -3.40282347E+38], [0.0, 0.0, -3.40282347E+38], [0.0, 0.0, 0.0]]]> : tensor<1x3x3xf32>
  %u = sd.add %t, %m : (tensor<2x3x3xf32>, tensor<1x3x3xf32>) -> tensor<2x3x3xf32>
  %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %p1 = sd.cast %p {to = 1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %p2 = sd.cast %p1 {to = 1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %y = sd.matmul %p2, %v : (tensor<2x3x3xf32>, tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
  return %y : tensor<2x3x4xf32>
}

// -----

// An additive bias that is not a mask (ALiBi-style slopes) stays an Add:
// nothing is fused.
// CHECK-LABEL: func.func @additive_bias_kept
//   CHECK-NOT:   sd.attention
//       CHECK:   sd.add
//       CHECK:   sd.softmax
func.func @additive_bias_kept(%q: tensor<2x3x4xf32>, %kt: tensor<2x4x3xf32>, %v: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  %s = sd.matmul %q, %kt : (tensor<2x3x4xf32>, tensor<2x4x3xf32>) -> tensor<2x3x3xf32>
  %m = sd.constant dense<[[[0.0, -1.0, -2.0], [0.0, 0.0, -1.0], [0.0, 0.0, 0.0]]]> : tensor<1x3x3xf32>
  %u = sd.add %s, %m : (tensor<2x3x3xf32>, tensor<1x3x3xf32>) -> tensor<2x3x3xf32>
  %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x3x3xf32>) -> tensor<2x3x3xf32>
  %y = sd.matmul %p, %v : (tensor<2x3x3xf32>, tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
  return %y : tensor<2x3x4xf32>
}

// -----

// transformers' Llama: one mask for every layer, Where(keep, 0, min) over a
// keep mask expanded over the batch, added to each layer's scores. Both
// layers fuse; each takes the unexpanded keep mask (negated), and the shared
// Where and Expand go once the last layer is fused.
// CHECK-LABEL: func.func @shared_expanded_mask
//       CHECK:   %[[M1:.*]] = sd.not %arg3 : (tensor<1x1x8x8xi1>)
//       CHECK:   %[[A1:.*]] = sd.attention %arg0, %arg1, %arg2, %[[M1]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32}
//       CHECK:   %[[M2:.*]] = sd.not %arg3 : (tensor<1x1x8x8xi1>)
//       CHECK:   sd.attention %[[A1]], %arg1, %arg2, %[[M2]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32}
//   CHECK-NOT:   sd.where
//   CHECK-NOT:   sd.expand
//   CHECK-NOT:   sd.softmax
func.func @shared_expanded_mask(%q: tensor<2x4x8x16xf32>, %kt: tensor<2x4x16x8xf32>, %v: tensor<2x4x8x16xf32>, %keep: tensor<1x1x8x8xi1>) -> tensor<2x4x8x16xf32> {
  %shape = sd.constant dense<[2, 1, 8, 8]> : tensor<4xi64>
  %wide = sd.expand %keep, %shape : (tensor<1x1x8x8xi1>, tensor<4xi64>) -> tensor<2x1x8x8xi1>
  %zero = sd.constant dense<0.0> : tensor<f32>
  %min = sd.constant dense<-3.40282347E+38> : tensor<f32>
  %bias = sd.where %wide, %zero, %min : (tensor<2x1x8x8xi1>, tensor<f32>, tensor<f32>) -> tensor<2x1x8x8xf32>
  %c = sd.constant dense<0.25> : tensor<f32>
  %s1 = sd.matmul %q, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %t1 = sd.mul %s1, %c : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %u1 = sd.add %t1, %bias : (tensor<2x4x8x8xf32>, tensor<2x1x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p1 = sd.softmax %u1 {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %y1 = sd.matmul %p1, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  %s2 = sd.matmul %y1, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %t2 = sd.mul %s2, %c : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %u2 = sd.add %t2, %bias : (tensor<2x4x8x8xf32>, tensor<2x1x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p2 = sd.softmax %u2 {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %y2 = sd.matmul %p2, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  return %y2 : tensor<2x4x8x16xf32>
}

// -----

// torch.onnx's dynamo exporter folds transformers' causal mask into a weight,
// repeated per batch item ([2, 1, T, S]): its value is read from the frozen
// weight, and the two equal items become one [1, 1, T, S] mask every item shares.
// CHECK-LABEL: func.func @frozen_additive_mask_per_item
//       CHECK:   %[[M:.*]] = sd.constant dense<{{\[\[\[}}[false, true], [false, false]]]]> : tensor<1x1x2x2xi1>
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %[[M]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 1.000000e+00 : f32}
//   CHECK-NOT:   sd.add
module {
  sd.global @where "frozen" : tensor<2x1x2x2xf32> = dense<[[[[0.0, -3.40282347E+38], [0.0, 0.0]]], [[[0.0, -3.40282347E+38], [0.0, 0.0]]]]> : tensor<2x1x2x2xf32>
  func.func @frozen_additive_mask_per_item(%q: tensor<2x3x2x4xf32>, %kt: tensor<2x3x4x2xf32>, %v: tensor<2x3x2x4xf32>) -> tensor<2x3x2x4xf32> {
    %s = sd.matmul %q, %kt : (tensor<2x3x2x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x2x2xf32>
    %m = sd.global_load @where : tensor<2x1x2x2xf32>
    %u = sd.add %s, %m : (tensor<2x3x2x2xf32>, tensor<2x1x2x2xf32>) -> tensor<2x3x2x2xf32>
    %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x3x2x2xf32>) -> tensor<2x3x2x2xf32>
    %y = sd.matmul %p, %v : (tensor<2x3x2x2xf32>, tensor<2x3x2x4xf32>) -> tensor<2x3x2x4xf32>
    return %y : tensor<2x3x2x4xf32>
  }
}

// -----

// The same mask in a trainable weight is data the step changes: not read.
// CHECK-LABEL: func.func @trainable_additive_mask_kept
//       CHECK:   sd.add
//   CHECK-NOT:   sd.attention
module {
  sd.global @where "trainable" : tensor<1x1x2x2xf32> = dense<[[[[0.0, -3.40282347E+38], [0.0, 0.0]]]]> : tensor<1x1x2x2xf32>
  func.func @trainable_additive_mask_kept(%q: tensor<2x3x2x4xf32>, %kt: tensor<2x3x4x2xf32>, %v: tensor<2x3x2x4xf32>) -> tensor<2x3x2x4xf32> {
    %s = sd.matmul %q, %kt : (tensor<2x3x2x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x2x2xf32>
    %m = sd.global_load @where : tensor<1x1x2x2xf32>
    %u = sd.add %s, %m : (tensor<2x3x2x2xf32>, tensor<1x1x2x2xf32>) -> tensor<2x3x2x2xf32>
    %p = sd.softmax %u {axis = -1 : i64} : (tensor<2x3x2x2xf32>) -> tensor<2x3x2x2xf32>
    %y = sd.matmul %p, %v : (tensor<2x3x2x2xf32>, tensor<2x3x2x4xf32>) -> tensor<2x3x2x4xf32>
    return %y : tensor<2x3x2x4xf32>
  }
}

// -----

// An attention fused while the scale was still computed from the head size
// (Optimum's GPT-2: sqrt(scale) on q and on kt): once the factors are
// constants they join the scale (0.5 * 0.5 * 1), and q and kt are read as
// the projections wrote them.
// CHECK-LABEL: func.func @scale_factors_absorbed
//       CHECK:   %[[Y:.*]] = sd.attention %arg0, %arg1, %arg2, %{{.*}}, %{{.*}} {scale = 2.500000e-01 : f32}
//   CHECK-NOT:   sd.mul
//       CHECK:   return %[[Y]]
func.func @scale_factors_absorbed(%q: tensor<1x4x8x16xf32>, %kt: tensor<1x4x16x8xf32>, %v: tensor<1x4x8x16xf32>) -> tensor<1x4x8x16xf32> {
  %none = sd.none
  %c = sd.constant dense<5.000000e-01> : tensor<1xf32>
  %qs = sd.mul %q, %c : (tensor<1x4x8x16xf32>, tensor<1xf32>) -> tensor<1x4x8x16xf32>
  %ks = sd.mul %c, %kt : (tensor<1xf32>, tensor<1x4x16x8xf32>) -> tensor<1x4x16x8xf32>
  %y = sd.attention %qs, %ks, %v, %none, %none {scale = 1.000000e+00 : f32} : (tensor<1x4x8x16xf32>, tensor<1x4x16x8xf32>, tensor<1x4x8x16xf32>, none, none) -> tensor<1x4x8x16xf32>
  return %y : tensor<1x4x8x16xf32>
}

// -----

// Kept: a multiplier read elsewhere too, and one that is not a constant.
// CHECK-LABEL: func.func @scale_factors_kept
//       CHECK:   sd.attention %{{.*}}, %{{.*}}, %arg2, %{{.*}}, %{{.*}} {scale = 1.000000e+00 : f32}
func.func @scale_factors_kept(%q: tensor<1x4x8x16xf32>, %kt: tensor<1x4x16x8xf32>, %v: tensor<1x4x8x16xf32>, %s: tensor<1xf32>) -> (tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32>) {
  %none = sd.none
  %c = sd.constant dense<5.000000e-01> : tensor<1xf32>
  %qs = sd.mul %q, %c : (tensor<1x4x8x16xf32>, tensor<1xf32>) -> tensor<1x4x8x16xf32>
  %ks = sd.mul %kt, %s : (tensor<1x4x16x8xf32>, tensor<1xf32>) -> tensor<1x4x16x8xf32>
  %y = sd.attention %qs, %ks, %v, %none, %none {scale = 1.000000e+00 : f32} : (tensor<1x4x8x16xf32>, tensor<1x4x16x8xf32>, tensor<1x4x8x16xf32>, none, none) -> tensor<1x4x8x16xf32>
  return %y, %qs : tensor<1x4x8x16xf32>, tensor<1x4x8x16xf32>
}

// -----

// transformers 4.x's BERT mask as Optimum exports it: x = 1 - attention_mask,
// M = Where(Cast(x to bool), min, x), which is min where x is not 0 and 0
// elsewhere: the keys masked where the cast is set.
// CHECK-LABEL: func.func @mask_from_nonzero_test
//       CHECK:   %[[C:.*]] = sd.cast %{{.*}} {to = 9 : i64}
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %[[C]], %{{.*}} {mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32}
//   CHECK-NOT:   sd.softmax
func.func @mask_from_nonzero_test(%q: tensor<2x4x8x16xf32>, %kt: tensor<2x4x16x8xf32>, %v: tensor<2x4x8x16xf32>,
                                  %keep: tensor<2x1x8x8xf32>) -> tensor<2x4x8x16xf32> {
  %one = sd.constant dense<1.000000e+00> : tensor<f32>
  %x = sd.sub %one, %keep : (tensor<f32>, tensor<2x1x8x8xf32>) -> tensor<2x1x8x8xf32>
  %c = sd.cast %x {to = 9 : i64} : (tensor<2x1x8x8xf32>) -> tensor<2x1x8x8xi1>
  %min = sd.constant dense<-3.40282347E+38> : tensor<f32>
  %m = sd.where %c, %min, %x : (tensor<2x1x8x8xi1>, tensor<f32>, tensor<2x1x8x8xf32>) -> tensor<2x1x8x8xf32>
  %s = sd.matmul %q, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %scale = sd.constant dense<2.500000e-01> : tensor<f32>
  %ss = sd.mul %s, %scale : (tensor<2x4x8x8xf32>, tensor<f32>) -> tensor<2x4x8x8xf32>
  %a = sd.add %ss, %m : (tensor<2x4x8x8xf32>, tensor<2x1x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = sd.softmax %a {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %y = sd.matmul %p, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  return %y : tensor<2x4x8x16xf32>
}

// -----

// Kept: Where(Cast(x to bool), min, y) with y another tensor than x is not a
// mask of 0s and min.
// CHECK-LABEL: func.func @nonzero_test_of_another
//       CHECK:   sd.softmax
func.func @nonzero_test_of_another(%q: tensor<2x4x8x16xf32>, %kt: tensor<2x4x16x8xf32>, %v: tensor<2x4x8x16xf32>,
                                   %x: tensor<2x1x8x8xf32>, %y: tensor<2x1x8x8xf32>) -> tensor<2x4x8x16xf32> {
  %c = sd.cast %x {to = 9 : i64} : (tensor<2x1x8x8xf32>) -> tensor<2x1x8x8xi1>
  %min = sd.constant dense<-3.40282347E+38> : tensor<f32>
  %m = sd.where %c, %min, %y : (tensor<2x1x8x8xi1>, tensor<f32>, tensor<2x1x8x8xf32>) -> tensor<2x1x8x8xf32>
  %s = sd.matmul %q, %kt : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>) -> tensor<2x4x8x8xf32>
  %a = sd.add %s, %m : (tensor<2x4x8x8xf32>, tensor<2x1x8x8xf32>) -> tensor<2x4x8x8xf32>
  %p = sd.softmax %a {axis = -1 : i64} : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
  %y2 = sd.matmul %p, %v : (tensor<2x4x8x8xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  return %y2 : tensor<2x4x8x16xf32>
}
