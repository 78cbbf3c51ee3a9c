// RUN: sd-opt %s --split-input-file --sd-fuse-hardswish --sd-fuse-conv-epilogue --sd-propagate-shapes | FileCheck %s

// paddle2onnx's HardSwish, x * Clip(x + 3, 0, 6) / 6, after a Conv: one
// sd.hard_swish, which the convolution's epilogue then takes.
// CHECK-LABEL: func.func @paddle_hardswish
//       CHECK:   %[[F:.*]] = sd.fused_conv %arg0, %arg1, %{{.*}}, %{{.*}} {activation = "HardSwish"
//   CHECK-NOT:   sd.clip
//   CHECK-NOT:   sd.div
//       CHECK:   return %[[F]]
func.func @paddle_hardswish(%x: tensor<1x4x8x8xf32>, %w: tensor<4x4x1x1xf32>) -> tensor<1x4x8x8xf32>
    attributes {sd.entry = "infer"} {
  %n = sd.none
  %three = sd.constant dense<3.0> : tensor<1xf32>
  %zero = sd.constant dense<0.0> : tensor<1xf32>
  %six = sd.constant dense<6.0> : tensor<1xf32>
  %c = sd.conv %x, %w, %n : (tensor<1x4x8x8xf32>, tensor<4x4x1x1xf32>, none) -> tensor<1x4x8x8xf32>
  %a = sd.add %c, %three : (tensor<1x4x8x8xf32>, tensor<1xf32>) -> tensor<1x4x8x8xf32>
  %r = sd.clip %a, %zero, %six : (tensor<1x4x8x8xf32>, tensor<1xf32>, tensor<1xf32>) -> tensor<1x4x8x8xf32>
  %m = sd.mul %c, %r : (tensor<1x4x8x8xf32>, tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32>
  %y = sd.div %m, %six : (tensor<1x4x8x8xf32>, tensor<1xf32>) -> tensor<1x4x8x8xf32>
  return %y : tensor<1x4x8x8xf32>
}

// -----

// The division first, as a product with 1/6: x * (Clip(3 + x, 0, 6) * (1/6)).
// CHECK-LABEL: func.func @scaled_first
//       CHECK:   %[[H:.*]] = sd.hard_swish %arg0
//       CHECK:   return %[[H]]
func.func @scaled_first(%x: tensor<2x5xf32>) -> tensor<2x5xf32> attributes {sd.entry = "infer"} {
  %three = sd.constant dense<3.0> : tensor<f32>
  %zero = sd.constant dense<0.0> : tensor<f32>
  %six = sd.constant dense<6.0> : tensor<f32>
  %sixth = sd.constant dense<0.16666667> : tensor<f32>
  %a = sd.add %three, %x : (tensor<f32>, tensor<2x5xf32>) -> tensor<2x5xf32>
  %r = sd.clip %a, %zero, %six : (tensor<2x5xf32>, tensor<f32>, tensor<f32>) -> tensor<2x5xf32>
  %s = sd.mul %r, %sixth : (tensor<2x5xf32>, tensor<f32>) -> tensor<2x5xf32>
  %y = sd.mul %x, %s : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
  return %y : tensor<2x5xf32>
}

// -----

// Not HardSwish: ReLU6(x + 3) / 6 times a different tensor (a gate), and a
// training entry (HardSwish has no gradient rule). Both stay.
// CHECK-LABEL: func.func @other_operand
//   CHECK-NOT:   sd.hard_swish
// CHECK-LABEL: func.func @training_entry
//   CHECK-NOT:   sd.hard_swish
func.func @other_operand(%x: tensor<2x5xf32>, %g: tensor<2x5xf32>) -> tensor<2x5xf32> attributes {sd.entry = "infer"} {
  %three = sd.constant dense<3.0> : tensor<f32>
  %zero = sd.constant dense<0.0> : tensor<f32>
  %six = sd.constant dense<6.0> : tensor<f32>
  %a = sd.add %x, %three : (tensor<2x5xf32>, tensor<f32>) -> tensor<2x5xf32>
  %r = sd.clip %a, %zero, %six : (tensor<2x5xf32>, tensor<f32>, tensor<f32>) -> tensor<2x5xf32>
  %m = sd.mul %g, %r : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
  %y = sd.div %m, %six : (tensor<2x5xf32>, tensor<f32>) -> tensor<2x5xf32>
  return %y : tensor<2x5xf32>
}
func.func @training_entry(%x: tensor<2x5xf32>) -> tensor<2x5xf32> attributes {sd.entry = "eval_step"} {
  %three = sd.constant dense<3.0> : tensor<f32>
  %zero = sd.constant dense<0.0> : tensor<f32>
  %six = sd.constant dense<6.0> : tensor<f32>
  %a = sd.add %x, %three : (tensor<2x5xf32>, tensor<f32>) -> tensor<2x5xf32>
  %r = sd.clip %a, %zero, %six : (tensor<2x5xf32>, tensor<f32>, tensor<f32>) -> tensor<2x5xf32>
  %m = sd.mul %x, %r : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
  %y = sd.div %m, %six : (tensor<2x5xf32>, tensor<f32>) -> tensor<2x5xf32>
  return %y : tensor<2x5xf32>
}
