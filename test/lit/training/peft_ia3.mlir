// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-ia3="target-modules=attn.v,mlp.down feedforward-modules=down" | FileCheck %s

// (IA)³: l [out, 1] scales attn.v's result, bias included (PEFT's IA3
// multiplies the layer's output); on the feedforward module mlp.down,
// l [1, in] scales the input. Both start as ones; other weights stay frozen.
// CHECK:       sd.peft = {{{.*}}feedforward = ["mlp.down"]{{.*}}modules = ["attn.v", "mlp.down"], peft_type = "IA3"
// CHECK-DAG:   sd.global @attn.v.ia3_l "trainable" : tensor<3x1xf32>
// CHECK-DAG:   sd.global @mlp.down.ia3_l "trainable" : tensor<1x3xf32>
// CHECK-DAG:   sd.global @attn.v.weight "frozen"
// CHECK-LABEL: func.func @eval_step
// CHECK:       %[[V:.*]] = sd.linear %arg0, %{{.*}}, %{{.*}} {layout = "oi", module = "attn.v"}
// CHECK:       %[[LV:.*]] = sd.global_load @attn.v.ia3_l : tensor<3x1xf32>
// CHECK:       %[[LVR:.*]] = sd.reshape %[[LV]], %{{.*}} : (tensor<3x1xf32>, tensor<1xi64>) -> tensor<3xf32>
// CHECK:       %[[VS:.*]] = sd.mul %[[V]], %[[LVR]]
// CHECK:       %[[LD:.*]] = sd.global_load @mlp.down.ia3_l : tensor<1x3xf32>
// CHECK:       %[[LDR:.*]] = sd.reshape %[[LD]], %{{.*}} : (tensor<1x3xf32>, tensor<1xi64>) -> tensor<3xf32>
// CHECK:       %[[XS:.*]] = sd.mul %[[VS]], %[[LDR]]
// CHECK:       sd.linear %[[XS]], %{{.*}}, %{{.*}} {layout = "oi", module = "mlp.down"}
// CHECK:       attn.v.ia3_l: "0x040000000000803F0000803F0000803F"
module {
  sd.global @attn.v.weight "trainable" : tensor<3x3xf32>
  sd.global @attn.v.bias "trainable" : tensor<3xf32>
  sd.global @mlp.down.weight "trainable" : tensor<2x3xf32>
  func.func @eval_step(%x: tensor<4x3xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %wv = sd.global_load @attn.v.weight : tensor<3x3xf32>
    %bv = sd.global_load @attn.v.bias : tensor<3xf32>
    %wd = sd.global_load @mlp.down.weight : tensor<2x3xf32>
    %none = sd.none
    %v = sd.linear %x, %wv, %bv {layout = "oi", module = "attn.v"} : (tensor<4x3xf32>, tensor<3x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
    %y = sd.linear %v, %wd, %none {layout = "oi", module = "mlp.down"} : (tensor<4x3xf32>, tensor<2x3xf32>, none) -> tensor<4x2xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<4x2xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}

// -----

// expected-error @+1 {{--feedforward-modules 'down' matches none of the adapted modules}}
module {
  sd.global @attn.v.weight "trainable" : tensor<3x3xf32>
  func.func @eval_step(%x: tensor<4x3xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %wv = sd.global_load @attn.v.weight : tensor<3x3xf32>
    %none = sd.none
    %v = sd.linear %x, %wv, %none {layout = "oi", module = "attn.v"} : (tensor<4x3xf32>, tensor<3x3xf32>, none) -> tensor<4x3xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %v, %axes {keepdims = 0 : i64} : (tensor<4x3xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
