// RUN: sd-opt %s --split-input-file --sd-accumulate-into-gemm --sd-propagate-shapes | FileCheck %s

// LoRA's forward where the layer's output joins the residual stream:
// r + (base + 2 * up). The adapter's up product becomes a Gemm on the
// flattened rows that accumulates onto the residual with alpha 2; the base
// Linear, with its bias, accumulates onto that (sd.linear_add). No Add, no
// Mul is left.
// CHECK-LABEL: func.func @lora_residual
//       CHECK:   %[[D:.*]] = sd.linear %arg0, %arg3, %{{.*}} {layout = "oi", module = "proj.lora_A"}
//       CHECK:   %[[D2:.*]] = sd.reshape %[[D]], %{{.*}} -> tensor<6x2xf32>
//       CHECK:   %[[R2:.*]] = sd.reshape %arg5, %{{.*}} -> tensor<6x8xf32>
//       CHECK:   %[[U:.*]] = sd.gemm %[[D2]], %arg4, %[[R2]] {alpha = 2.000000e+00 : f32, beta = 1.000000e+00 : f32, transB = 1 : i64} : (tensor<6x2xf32>, tensor<8x2xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
//       CHECK:   %[[U3:.*]] = sd.reshape %[[U]], %{{.*}} -> tensor<2x3x8xf32>
//       CHECK:   %[[Y:.*]] = sd.linear_add %arg0, %arg1, %arg2, %[[U3]] {layout = "oi", module = "proj"} : (tensor<2x3x4xf32>, tensor<8x4xf32>, tensor<8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
//   CHECK-NOT:   sd.add
//   CHECK-NOT:   sd.mul
//       CHECK:   return %[[Y]]
func.func @lora_residual(%x: tensor<2x3x4xf32>, %w: tensor<8x4xf32>, %b: tensor<8xf32>, %a: tensor<2x4xf32>,
                         %bb: tensor<8x2xf32>, %r: tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
    attributes {sd.entry = "train_step"} {
  %n = sd.none
  %base = sd.linear %x, %w, %b {layout = "oi", module = "proj"} : (tensor<2x3x4xf32>, tensor<8x4xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  %down = sd.linear %x, %a, %n {layout = "oi", module = "proj.lora_A"} : (tensor<2x3x4xf32>, tensor<2x4xf32>, none) -> tensor<2x3x2xf32>
  %up = sd.linear %down, %bb, %n {layout = "oi", module = "proj.lora_B"} : (tensor<2x3x2xf32>, tensor<8x2xf32>, none) -> tensor<2x3x8xf32>
  %two = sd.constant dense<2.0> : tensor<f32>
  %scaled = sd.mul %up, %two : (tensor<2x3x8xf32>, tensor<f32>) -> tensor<2x3x8xf32>
  %sum = sd.add %base, %scaled : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %y = sd.add %r, %sum : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  return %y : tensor<2x3x8xf32>
}

// -----

// The backward's input gradient: the base product plus the adapter's (its
// scale already the Gemm's alpha), through reshapes. The first Gemm's
// product is the second's C.
// CHECK-LABEL: func.func @input_gradient
//       CHECK:   %[[G:.*]] = sd.gemm %arg0, %arg1, %{{.*}} : (tensor<6x8xbf16>, tensor<8x4xbf16>, none) -> tensor<6x4xbf16>
//       CHECK:   %[[S:.*]] = sd.gemm %arg2, %arg3, %[[G]] {alpha = 2.000000e+00 : f32, beta = 1.000000e+00 : f32} : (tensor<6x2xbf16>, tensor<2x4xbf16>, tensor<6x4xbf16>) -> tensor<6x4xbf16>
//   CHECK-NOT:   sd.add
//       CHECK:   return
func.func @input_gradient(%dy: tensor<6x8xbf16>, %w: tensor<8x4xbf16>, %t: tensor<6x2xbf16>, %a: tensor<2x4xbf16>)
    -> tensor<2x3x4xbf16> attributes {sd.entry = "train_step"} {
  %n = sd.none
  %g0 = sd.gemm %dy, %w, %n : (tensor<6x8xbf16>, tensor<8x4xbf16>, none) -> tensor<6x4xbf16>
  %g1 = sd.gemm %t, %a, %n {alpha = 2.0 : f32} : (tensor<6x2xbf16>, tensor<2x4xbf16>, none) -> tensor<6x4xbf16>
  %shape = sd.constant dense<[2, 3, 4]> : tensor<3xi64>
  %r0 = sd.reshape %g0, %shape : (tensor<6x4xbf16>, tensor<3xi64>) -> tensor<2x3x4xbf16>
  %r1 = sd.reshape %g1, %shape : (tensor<6x4xbf16>, tensor<3xi64>) -> tensor<2x3x4xbf16>
  %sum = sd.add %r0, %r1 : (tensor<2x3x4xbf16>, tensor<2x3x4xbf16>) -> tensor<2x3x4xbf16>
  return %sum : tensor<2x3x4xbf16>
}

// -----

// Autocast's LoRA sum: f32 over the widened bf16 products, rounded back to
// bf16 (a q|k|v projection's). The GEMMs sum in bf16; no cast is left.
// CHECK-LABEL: func.func @autocast_rounded
//       CHECK:   %[[D:.*]] = sd.linear %arg0, %arg3
//       CHECK:   %[[U:.*]] = sd.gemm %[[D]], %arg4, %{{.*}} {alpha = 2.000000e+00 : f32, transB = 1 : i64} : (tensor<6x2xbf16>, tensor<8x2xbf16>, none) -> tensor<6x8xbf16>
//       CHECK:   %[[Y:.*]] = sd.linear_add %arg0, %arg1, %arg2, %[[U]] {layout = "oi", module = "qkv"}
//   CHECK-NOT:   sd.cast
//   CHECK-NOT:   sd.add
//       CHECK:   return %[[Y]]
func.func @autocast_rounded(%x: tensor<6x4xbf16>, %w: tensor<8x4xbf16>, %b: tensor<8xbf16>, %a: tensor<2x4xbf16>,
                            %bb: tensor<8x2xbf16>) -> tensor<6x8xbf16> attributes {sd.entry = "train_step"} {
  %n = sd.none
  %base = sd.linear %x, %w, %b {layout = "oi", module = "qkv"} : (tensor<6x4xbf16>, tensor<8x4xbf16>, tensor<8xbf16>) -> tensor<6x8xbf16>
  %down = sd.linear %x, %a, %n {layout = "oi", module = "qkv.lora_A"} : (tensor<6x4xbf16>, tensor<2x4xbf16>, none) -> tensor<6x2xbf16>
  %up = sd.linear %down, %bb, %n {layout = "oi", module = "qkv.lora_B"} : (tensor<6x2xbf16>, tensor<8x2xbf16>, none) -> tensor<6x8xbf16>
  %wb = sd.cast %base {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %wu = sd.cast %up {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %two = sd.constant dense<2.0> : tensor<f32>
  %m = sd.mul %wu, %two : (tensor<6x8xf32>, tensor<f32>) -> tensor<6x8xf32>
  %s = sd.add %wb, %m : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %r = sd.cast %s {to = 16 : i64} : (tensor<6x8xf32>) -> tensor<6x8xbf16>
  return %r : tensor<6x8xbf16>
}

// -----

// The same sum read in f32 (an MLP's GELU and, training, its gradient): the
// bf16 sum widened once.
// CHECK-LABEL: func.func @autocast_widened
//       CHECK:   %[[Y:.*]] = sd.linear_add %arg0, %arg1, %arg2, %{{.*}} {layout = "oi", module = "fc1"}
//       CHECK:   %[[W:.*]] = sd.cast %[[Y]] {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
//       CHECK:   sd.gelu %[[W]]
func.func @autocast_widened(%x: tensor<6x4xbf16>, %w: tensor<8x4xbf16>, %b: tensor<8xbf16>, %a: tensor<2x4xbf16>,
                            %bb: tensor<8x2xbf16>) -> (tensor<6x8xf32>, tensor<6x8xf32>) attributes {sd.entry = "train_step"} {
  %n = sd.none
  %base = sd.linear %x, %w, %b {layout = "oi", module = "fc1"} : (tensor<6x4xbf16>, tensor<8x4xbf16>, tensor<8xbf16>) -> tensor<6x8xbf16>
  %down = sd.linear %x, %a, %n {layout = "oi", module = "fc1.lora_A"} : (tensor<6x4xbf16>, tensor<2x4xbf16>, none) -> tensor<6x2xbf16>
  %up = sd.linear %down, %bb, %n {layout = "oi", module = "fc1.lora_B"} : (tensor<6x2xbf16>, tensor<8x2xbf16>, none) -> tensor<6x8xbf16>
  %wb = sd.cast %base {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %wu = sd.cast %up {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %two = sd.constant dense<2.0> : tensor<f32>
  %m = sd.mul %wu, %two : (tensor<6x8xf32>, tensor<f32>) -> tensor<6x8xf32>
  %s = sd.add %wb, %m : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %g = sd.gelu %s {approximate = "tanh"} : (tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g, %s : tensor<6x8xf32>, tensor<6x8xf32>
}

// -----

// Kept: a product something else reads too, a broadcast addend, a sum of
// values no product makes, a scaled Linear with a bias (a Gemm has none),
// an f64 sum, and Add(p, p).
// CHECK-LABEL: func.func @kept
//   CHECK-NOT:   sd.linear_add
//   CHECK-NOT:   beta
//   CHECK-COUNT-6:   sd.add
func.func @kept(%x: tensor<3x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>, %r: tensor<3x8xf32>, %row: tensor<8xf32>,
                %xd: tensor<3x4xf64>, %wd: tensor<4x8xf64>)
    -> (tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf64>, tensor<3x8xf32>)
    attributes {sd.entry = "train_step"} {
  %n = sd.none
  %p0 = sd.linear %x, %w, %n {layout = "io", module = "a"} : (tensor<3x4xf32>, tensor<4x8xf32>, none) -> tensor<3x8xf32>
  %s0 = sd.add %p0, %r : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
  %p1 = sd.linear %x, %w, %n {layout = "io", module = "b"} : (tensor<3x4xf32>, tensor<4x8xf32>, none) -> tensor<3x8xf32>
  %s1 = sd.add %p1, %row : (tensor<3x8xf32>, tensor<8xf32>) -> tensor<3x8xf32>
  %s2 = sd.add %r, %r : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
  %p3 = sd.linear %x, %w, %b {layout = "io", module = "c"} : (tensor<3x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<3x8xf32>
  %two = sd.constant dense<2.0> : tensor<f32>
  %m3 = sd.mul %p3, %two : (tensor<3x8xf32>, tensor<f32>) -> tensor<3x8xf32>
  %s3 = sd.add %m3, %r : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
  %pd = sd.linear %xd, %wd, %n {layout = "io", module = "d"} : (tensor<3x4xf64>, tensor<4x8xf64>, none) -> tensor<3x8xf64>
  %sd = sd.add %pd, %pd : (tensor<3x8xf64>, tensor<3x8xf64>) -> tensor<3x8xf64>
  %p5 = sd.linear %x, %w, %n {layout = "io", module = "e"} : (tensor<3x4xf32>, tensor<4x8xf32>, none) -> tensor<3x8xf32>
  %s5 = sd.add %p5, %p5 : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xf32>
  return %s0, %p0, %s1, %s2, %s3, %sd, %s5
      : tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf64>, tensor<3x8xf32>
}
