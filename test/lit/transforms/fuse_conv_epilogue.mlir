// RUN: sd-opt %s --split-input-file --sd-fuse-conv-epilogue --sd-propagate-shapes | FileCheck %s

// ResNet's tail: Conv, residual Add, Relu become one sd.fused_conv.
// CHECK-LABEL: func.func @conv_add_relu
//       CHECK:   %[[N:.*]] = sd.none
//       CHECK:   %[[F:.*]] = sd.fused_conv %arg0, %arg1, %[[N]], %arg2 {activation = "Relu", pads = array<i64: 1, 1, 1, 1>}
//   CHECK-NOT:   sd.add
//   CHECK-NOT:   sd.relu
//       CHECK:   return %[[F]]
func.func @conv_add_relu(%x: tensor<1x4x8x8xf32>, %w: tensor<4x4x3x3xf32>, %r: tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
    attributes {sd.entry = "infer"} {
  %n = sd.none
  %c = sd.conv %x, %w, %n {pads = array<i64: 1, 1, 1, 1>} : (tensor<1x4x8x8xf32>, tensor<4x4x3x3xf32>, none) -> tensor<1x4x8x8xf32>
  %a = sd.add %c, %r : (tensor<1x4x8x8xf32>, tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %y = sd.relu %a : (tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  return %y : tensor<1x4x8x8xf32>
}

// -----

// MobileNet's ReLU6 is a Clip with constant bounds; they become the epilogue's.
// CHECK-LABEL: func.func @conv_relu6
//       CHECK:   sd.fused_conv %arg0, %arg1, %arg2, %{{.*}} {activation = "Clip", activation_alpha = 0.000000e+00 : f32, activation_beta = 6.000000e+00 : f32, group = 4 : i64}
//   CHECK-NOT:   sd.clip
func.func @conv_relu6(%x: tensor<1x4x8x8xf32>, %w: tensor<4x1x3x3xf32>, %b: tensor<4xf32>) -> tensor<1x4x6x6xf32>
    attributes {sd.entry = "infer"} {
  %lo = sd.constant dense<0.0> : tensor<f32>
  %hi = sd.constant dense<6.0> : tensor<f32>
  %c = sd.conv %x, %w, %b {group = 4 : i64} : (tensor<1x4x8x8xf32>, tensor<4x1x3x3xf32>, tensor<4xf32>) -> tensor<1x4x6x6xf32>
  %y = sd.clip %c, %lo, %hi : (tensor<1x4x6x6xf32>, tensor<f32>, tensor<f32>) -> tensor<1x4x6x6xf32>
  return %y : tensor<1x4x6x6xf32>
}

// -----

// A Conv whose output has a second user, or that sits in a training entry,
// stays as it is: the backward would read the intermediate.
// CHECK-LABEL: func.func @two_users
//       CHECK:   sd.conv
//       CHECK:   sd.relu
//   CHECK-NOT:   sd.fused_conv
func.func @two_users(%x: tensor<1x4x8x8xf32>, %w: tensor<4x4x1x1xf32>) -> (tensor<1x4x8x8xf32>, tensor<1x4x8x8xf32>)
    attributes {sd.entry = "infer"} {
  %n = sd.none
  %c = sd.conv %x, %w, %n : (tensor<1x4x8x8xf32>, tensor<4x4x1x1xf32>, none) -> tensor<1x4x8x8xf32>
  %y = sd.relu %c : (tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  return %y, %c : tensor<1x4x8x8xf32>, tensor<1x4x8x8xf32>
}

// -----

// CHECK-LABEL: func.func @training_entry
//       CHECK:   sd.conv
//       CHECK:   sd.hard_swish
//   CHECK-NOT:   sd.fused_conv
func.func @training_entry(%x: tensor<1x4x8x8xf32>, %w: tensor<4x4x1x1xf32>) -> tensor<1x4x8x8xf32>
    attributes {sd.entry = "train_step"} {
  %n = sd.none
  %c = sd.conv %x, %w, %n : (tensor<1x4x8x8xf32>, tensor<4x4x1x1xf32>, none) -> tensor<1x4x8x8xf32>
  %y = sd.hard_swish %c : (tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  return %y : tensor<1x4x8x8xf32>
}
