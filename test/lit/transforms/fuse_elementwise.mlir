// RUN: sd-opt %s --split-input-file --sd-fuse-elementwise --sd-propagate-shapes | FileCheck %s

// A LoRA branch's scaling and sum: one step, operands in first-use order.
// CHECK-LABEL: func.func @scale_and_add
//       CHECK:   %[[F:.*]] = sd.fused_elementwise %arg0, %arg1, %arg2 {program = array<i64: 2, 0, 1, 0, 2, 3>} : (tensor<2x3xf32>, tensor<f32>, tensor<2x3xf32>) -> tensor<2x3xf32>
//   CHECK-NOT:   sd.mul
//   CHECK-NOT:   sd.add
//       CHECK:   return %[[F]]
func.func @scale_and_add(%lora: tensor<2x3xf32>, %s: tensor<f32>, %base: tensor<2x3xf32>) -> tensor<2x3xf32>
    attributes {sd.entry = "infer"} {
  %m = sd.mul %lora, %s : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  %y = sd.add %base, %m : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

// -----

// A longer chain with an operand used twice and a negation.
// CHECK-LABEL: func.func @chain
//       CHECK:   sd.fused_elementwise %arg0, %arg1 {program = array<i64: 0, 0, 1, 2, 2, 2, 4, 3, 3, 3, 4, 0>}
//   CHECK-NOT:   sd.sub
func.func @chain(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> attributes {sd.entry = "infer"} {
  %s = sd.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %q = sd.mul %s, %s : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %n = sd.neg %q : (tensor<4xf32>) -> tensor<4xf32>
  %d = sd.div %n, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %d : tensor<4xf32>
}

// -----

// An intermediate read outside the chain, a broadcast that is not a single
// element, and f64 stay as they are.
// CHECK-LABEL: func.func @not_fused
//   CHECK-NOT:   sd.fused_elementwise
func.func @not_fused(%a: tensor<4xf32>, %b: tensor<4xf32>, %r: tensor<2x4xf32>, %x: tensor<4xf64>)
    -> (tensor<4xf32>, tensor<4xf32>, tensor<2x4xf32>, tensor<4xf64>) attributes {sd.entry = "infer"} {
  %s = sd.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %m = sd.mul %s, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %row = sd.add %r, %a : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %row2 = sd.mul %row, %r : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %d = sd.add %x, %x : (tensor<4xf64>, tensor<4xf64>) -> tensor<4xf64>
  %d2 = sd.mul %d, %x : (tensor<4xf64>, tensor<4xf64>) -> tensor<4xf64>
  return %m, %s, %row2, %d2 : tensor<4xf32>, tensor<4xf32>, tensor<2x4xf32>, tensor<4xf64>
}

// -----

// Single elements of several ranks broadcast to the highest rank.
// CHECK-LABEL: func.func @single_elements
//       CHECK:   sd.fused_elementwise %arg0, %arg1, %arg2 {program = array<i64: 0, 0, 1, 2, 3, 2>} : (tensor<1x1xf32>, tensor<f32>, tensor<1x1xf32>) -> tensor<1x1xf32>
func.func @single_elements(%a: tensor<1x1xf32>, %b: tensor<f32>, %c: tensor<1x1xf32>) -> tensor<1x1xf32>
    attributes {sd.entry = "infer"} {
  %s = sd.add %a, %b : (tensor<1x1xf32>, tensor<f32>) -> tensor<1x1xf32>
  %m = sd.mul %s, %c : (tensor<1x1xf32>, tensor<1x1xf32>) -> tensor<1x1xf32>
  return %m : tensor<1x1xf32>
}

// -----

// Single elements only, the highest rank second: the result takes its shape.
// CHECK-LABEL: func.func @scalar_first
//       CHECK:   sd.fused_elementwise %arg0, %arg1 {program = array<i64: 0, 0, 1, 2, 2, 0>} : (tensor<f32>, tensor<1x1xf32>) -> tensor<1x1xf32>
func.func @scalar_first(%a: tensor<f32>, %b: tensor<1x1xf32>) -> tensor<1x1xf32> attributes {sd.entry = "infer"} {
  %s = sd.add %a, %b : (tensor<f32>, tensor<1x1xf32>) -> tensor<1x1xf32>
  %m = sd.mul %s, %a : (tensor<1x1xf32>, tensor<f32>) -> tensor<1x1xf32>
  return %m : tensor<1x1xf32>
}

// -----

// Autocast: the half products' casts to f32 become half operands, the cast of
// the sum back to bf16 the step's result type.
// CHECK-LABEL: func.func @autocast
//       CHECK:   %[[F:.*]] = sd.fused_elementwise %arg0, %arg2, %arg1 {program = array<i64: 2, 0, 2, 0, 1, 3>, to = 16 : i64} : (tensor<2x3xbf16>, tensor<2x3xbf16>, tensor<f32>) -> tensor<2x3xbf16>
//   CHECK-NOT:   sd.cast
//       CHECK:   return %[[F]]
func.func @autocast(%lora: tensor<2x3xbf16>, %s: tensor<f32>, %base: tensor<2x3xbf16>) -> tensor<2x3xbf16>
    attributes {sd.entry = "infer"} {
  %l = sd.cast %lora {to = 1 : i64} : (tensor<2x3xbf16>) -> tensor<2x3xf32>
  %b = sd.cast %base {to = 1 : i64} : (tensor<2x3xbf16>) -> tensor<2x3xf32>
  %m = sd.mul %l, %s : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  %y = sd.add %b, %m : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %h = sd.cast %y {to = 16 : i64} : (tensor<2x3xf32>) -> tensor<2x3xbf16>
  return %h : tensor<2x3xbf16>
}

// -----

// A widened value something else reads too: the chain widens the half value
// itself (2 bytes an element read, not 4) and the cast stays for its other
// reader. A cast alone is not fused.
// CHECK-LABEL: func.func @casts_kept
//       CHECK:   %[[W:.*]] = sd.cast %arg0 {to = 1 : i64}
//       CHECK:   %[[A:.*]] = sd.fused_elementwise %arg0, %arg1 {program = array<i64: 0, 0, 1>}
//       CHECK:   %[[N:.*]] = sd.cast %arg1 {to = 16 : i64}
//       CHECK:   return %[[A]], %[[W]], %[[N]]
func.func @casts_kept(%x: tensor<4xbf16>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xbf16>)
    attributes {sd.entry = "infer"} {
  %w = sd.cast %x {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %a = sd.add %w, %y : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %n = sd.cast %y {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  return %a, %w, %n : tensor<4xf32>, tensor<4xf32>, tensor<4xbf16>
}

// -----

// A GELU and its gradient reading one widened bf16 product (an autocast
// plan's MLP): each chain widens the product itself, and the f32 copy goes.
// CHECK-LABEL: func.func @shared_widening
//   CHECK-NOT:   sd.cast
//       CHECK:   sd.fused_elementwise %arg0 {program = array<i64: 10, 0, 0>, to = 16 : i64}
//       CHECK:   sd.fused_elementwise %arg0, %arg1 {program = array<i64: 12, 1, 0>}
//   CHECK-NOT:   sd.cast
func.func @shared_widening(%h: tensor<4xbf16>, %dy: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xf32>)
    attributes {sd.entry = "train_step"} {
  %w = sd.cast %h {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %g = sd.gelu %w {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>
  %gh = sd.cast %g {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %dx = sd.gelu_grad %dy, %w {approximate = "tanh"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %gh, %dx : tensor<4xbf16>, tensor<4xf32>
}

// -----

// LoRA's sum (base + scale * adapter product, both bf16) read by the GELU and
// by its gradient: each chain computes the sum again from the two bf16
// products, and the f32 sum is never written.
// CHECK-LABEL: func.func @recomputed_sum
//   CHECK-NOT:   sd.add
//       CHECK:   sd.fused_elementwise %arg0, %arg1, %arg2 {program = array<i64: 2, 1, 2, 0, 0, 3, 10, 4, 4>, to = 16 : i64}
//       CHECK:   sd.fused_elementwise %arg0, %arg1, %arg2, %arg3 {program = array<i64: 2, 1, 2, 0, 0, 4, 12, 3, 5>}
//   CHECK-NOT:   sd.add
func.func @recomputed_sum(%base: tensor<4xbf16>, %lora: tensor<4xbf16>, %s: tensor<f32>, %dy: tensor<4xf32>)
    -> (tensor<4xbf16>, tensor<4xf32>) attributes {sd.entry = "train_step"} {
  %b = sd.cast %base {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %l = sd.cast %lora {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %ls = sd.mul %l, %s : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %sum = sd.add %b, %ls : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %g = sd.gelu %sum {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>
  %gh = sd.cast %g {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %dx = sd.gelu_grad %dy, %sum {approximate = "tanh"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %gh, %dx : tensor<4xbf16>, tensor<4xf32>
}

// -----

// The same sum of two f32 values, or read by a step no chain starts from
// (a Reshape): computed once and kept.
// CHECK-LABEL: func.func @sum_kept
//       CHECK:   %[[S:.*]] = sd.fused_elementwise %arg1, %arg2, %arg0 {program = array<i64: 2, 0, 1, 0, 2, 3>}
//       CHECK:   sd.fused_elementwise %[[S]] {program = array<i64: 10, 0, 0>, to = 16 : i64}
//       CHECK:   sd.gelu_grad %arg3, %[[S]]
// CHECK-LABEL: func.func @sum_read_by_reshape
//       CHECK:   %[[S:.*]] = sd.fused_elementwise %arg0, %arg1, %arg2 {program = array<i64: 2, 1, 2, 0, 0, 3>}
//       CHECK:   sd.fused_elementwise %[[S]] {program = array<i64: 10, 0, 0>, to = 16 : i64}
//       CHECK:   sd.reshape %[[S]]
func.func @sum_kept(%base: tensor<4xf32>, %lora: tensor<4xf32>, %s: tensor<f32>, %dy: tensor<4xf32>)
    -> (tensor<4xbf16>, tensor<4xf32>) attributes {sd.entry = "train_step"} {
  %ls = sd.mul %lora, %s : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %sum = sd.add %base, %ls : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %g = sd.gelu %sum {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>
  %gh = sd.cast %g {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %dx = sd.gelu_grad %dy, %sum {approximate = "tanh"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %gh, %dx : tensor<4xbf16>, tensor<4xf32>
}
func.func @sum_read_by_reshape(%base: tensor<4xbf16>, %lora: tensor<4xbf16>, %s: tensor<f32>, %shape: tensor<2xi64>)
    -> (tensor<4xbf16>, tensor<2x2xf32>) attributes {sd.entry = "train_step"} {
  %b = sd.cast %base {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %l = sd.cast %lora {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %ls = sd.mul %l, %s : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %sum = sd.add %b, %ls : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %g = sd.gelu %sum {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>
  %gh = sd.cast %g {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %r = sd.reshape %sum, %shape : (tensor<4xf32>, tensor<2xi64>) -> tensor<2x2xf32>
  return %gh, %r : tensor<4xbf16>, tensor<2x2xf32>
}

// -----

// Relu's gradient as its VJP writes it, Where(Greater(x, 0), dy, 0): one
// ReluGrad instruction (13) on (dy, x), alone or after the sum of two
// gradients; the mask goes with it. A mask another step reads, or a -0.0
// filler (the fused step would give +0.0), stays as it is.
// CHECK-LABEL: func.func @relu_grad
//       CHECK:   %[[A:.*]] = sd.fused_elementwise %arg1, %arg0 {program = array<i64: 13, 0, 1>}
//       CHECK:   %[[B:.*]] = sd.fused_elementwise %arg1, %arg2, %arg0 {program = array<i64: 0, 0, 1, 13, 3, 2>}
//   CHECK-NOT:   sd.greater
//       CHECK:   return %[[A]], %[[B]]
func.func @relu_grad(%x: tensor<2x3xf32>, %dy: tensor<2x3xf32>, %dz: tensor<2x3xf32>)
    -> (tensor<2x3xf32>, tensor<2x3xf32>) attributes {sd.entry = "train_step"} {
  %zero = sd.constant dense<0.0> : tensor<f32>
  %pos = sd.greater %x, %zero : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xi1>
  %dx = sd.where %pos, %dy, %zero : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  %sum = sd.add %dy, %dz : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
  %pos2 = sd.greater %x, %zero : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xi1>
  %dx2 = sd.where %pos2, %sum, %zero : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  return %dx, %dx2 : tensor<2x3xf32>, tensor<2x3xf32>
}

// -----

// CHECK-LABEL: func.func @relu_grad_kept
//   CHECK-NOT:   sd.fused_elementwise
func.func @relu_grad_kept(%x: tensor<2x3xf32>, %dy: tensor<2x3xf32>)
    -> (tensor<2x3xf32>, tensor<2x3xi1>, tensor<2x3xf32>) attributes {sd.entry = "train_step"} {
  %zero = sd.constant dense<0.0> : tensor<f32>
  %negzero = sd.constant dense<-0.0> : tensor<f32>
  %pos = sd.greater %x, %zero : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xi1>
  %dx = sd.where %pos, %dy, %zero : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  %pos2 = sd.greater %x, %zero : (tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xi1>
  %dx2 = sd.where %pos2, %dy, %negzero : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
  return %dx, %pos, %dx2 : tensor<2x3xf32>, tensor<2x3xi1>, tensor<2x3xf32>
}

// -----

// A global's load read before a store to that global stays where it is: the
// fused step would compute after the store and read the stored value (the
// optimizer's zeroed gradient, written in place into the same buffer).
// CHECK-LABEL: func.func @read_before_store
//       CHECK:   %[[G:.*]] = sd.global_load @grad
//       CHECK:   %[[M:.*]] = sd.mul %[[G]], %arg0
//       CHECK:   sd.global_store %arg1, @grad
//       CHECK:   sd.neg %[[M]]
//   CHECK-NOT:   sd.fused_elementwise
module {
  sd.global @grad "gradient" : tensor<4xf32>
  func.func @read_before_store(%s: tensor<f32>, %zero: tensor<4xf32>) -> tensor<4xf32> attributes {sd.entry = "apply"} {
    %g = sd.global_load @grad : tensor<4xf32>
    %m = sd.mul %g, %s : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
    sd.global_store %zero, @grad : tensor<4xf32>
    %a = sd.neg %m : (tensor<4xf32>) -> tensor<4xf32>
    return %a : tensor<4xf32>
  }
}
