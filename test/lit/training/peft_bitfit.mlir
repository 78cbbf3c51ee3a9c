// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-bitfit | FileCheck %s

// BitFit: the weights ops read as biases train (a linear layer's, a
// LayerNorm's shift), whatever their names; the rest freezes.
// CHECK-DAG:   sd.global @fc.weight "frozen"
// CHECK-DAG:   sd.global @fc.b "trainable"
// CHECK-DAG:   sd.global @norm.gamma "frozen"
// CHECK-DAG:   sd.global @norm.beta "trainable"
// CHECK-DAG:   sd.global @head.weight "frozen"
module {
  sd.global @fc.weight "frozen" : tensor<3x4xf32> = dense<0.5> : tensor<3x4xf32>
  sd.global @fc.b "frozen" : tensor<3xf32> = dense<0.1> : tensor<3xf32>
  sd.global @norm.gamma "frozen" : tensor<3xf32> = dense<1.0> : tensor<3xf32>
  sd.global @norm.beta "frozen" : tensor<3xf32> = dense<0.0> : tensor<3xf32>
  sd.global @head.weight "frozen" : tensor<2x3xf32> = dense<0.25> : tensor<2x3xf32>
  func.func @forward(%x: tensor<5x4xf32>) -> tensor<5x2xf32> {
    %none = sd.none
    %w = sd.global_load @fc.weight : tensor<3x4xf32>
    %b = sd.global_load @fc.b : tensor<3xf32>
    %g = sd.global_load @norm.gamma : tensor<3xf32>
    %beta = sd.global_load @norm.beta : tensor<3xf32>
    %wh = sd.global_load @head.weight : tensor<2x3xf32>
    %h = sd.linear %x, %w, %b {layout = "oi", module = "fc"} : (tensor<5x4xf32>, tensor<3x4xf32>, tensor<3xf32>) -> tensor<5x3xf32>
    %n = sd.layer_normalization %h, %g, %beta {axis = -1 : i64, epsilon = 1.0e-5 : f32} : (tensor<5x3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<5x3xf32>
    %y = sd.linear %n, %wh, %none {layout = "oi", module = "head"} : (tensor<5x3xf32>, tensor<2x3xf32>, none) -> tensor<5x2xf32>
    return %y : tensor<5x2xf32>
  }
}

// -----

// expected-error @+1 {{--peft bitfit: the model has no bias terms to train}}
module {
  sd.global @fc.weight "frozen" : tensor<3x4xf32> = dense<0.5> : tensor<3x4xf32>
  func.func @forward(%x: tensor<5x4xf32>) -> tensor<5x3xf32> {
    %none = sd.none
    %w = sd.global_load @fc.weight : tensor<3x4xf32>
    %h = sd.linear %x, %w, %none {layout = "oi", module = "fc"} : (tensor<5x4xf32>, tensor<3x4xf32>, none) -> tensor<5x3xf32>
    return %h : tensor<5x3xf32>
  }
}
