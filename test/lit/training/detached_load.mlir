// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-autodiff | FileCheck %s

// A detached read of a trainable global (sd.detached, DoRA's weight norm)
// carries no gradient: a loss reaching the parameter only through it does
// not depend on it.
module {
  sd.global @p "trainable" : tensor<2xf32>
  // expected-error @+1 {{the loss does not depend on any trainable parameter}}
  func.func @eval_step(%x: tensor<2xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %p = sd.global_load @p {sd.detached} : tensor<2xf32>
    %y = sd.mul %x, %p : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %axes = sd.constant dense<[0]> : tensor<1xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<2xf32>, tensor<1xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}

// -----

// Next to a plain read of the same global, only the plain read's path
// differentiates: d(sum(p * stop(p)))/dp = stop(p), a product with the
// detached value and no second term.
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[P:.*]] = sd.global_load @p : tensor<2xf32>
// CHECK:       %[[D:.*]] = sd.global_load @p {sd.detached} : tensor<2xf32>
// CHECK:       sd.mul %[[P]], %[[D]]
// CHECK:       %[[G:.*]] = sd.mul %{{.*}}, %[[D]]
// CHECK-NOT:   sd.mul %{{.*}}, %[[P]]
// CHECK:       sd.global_store %{{.*}}, @"grad/p"
module {
  sd.global @p "trainable" : tensor<2xf32>
  func.func @eval_step(%x: tensor<2xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %p = sd.global_load @p : tensor<2xf32>
    %d = sd.global_load @p {sd.detached} : tensor<2xf32>
    %y = sd.mul %p, %d : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %axes = sd.constant dense<[0]> : tensor<1xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<2xf32>, tensor<1xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}

// -----

// sd.detached on a compute op (KTO's KL estimate) stops the gradient there:
// d(sum(p * stop(p * p)))/dp = stop(p * p), so the backward multiplies by
// the detached product only, with no term through it.
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[P:.*]] = sd.global_load @p : tensor<2xf32>
// CHECK:       %[[S:.*]] = sd.mul %[[P]], %[[P]] {sd.detached}
// CHECK:       sd.mul %[[P]], %[[S]]
// CHECK:       sd.mul %{{.*}}, %[[S]]
// CHECK-NOT:   sd.mul %{{.*}}, %[[P]]
// CHECK:       sd.global_store %{{.*}}, @"grad/p"
module {
  sd.global @p "trainable" : tensor<2xf32>
  func.func @eval_step(%x: tensor<2xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %p = sd.global_load @p : tensor<2xf32>
    %s = sd.mul %p, %p {sd.detached} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %y = sd.mul %p, %s : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %axes = sd.constant dense<[0]> : tensor<1xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<2xf32>, tensor<1xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
