// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-lora="target-modules=qkv r=2 alpha=4" | FileCheck %s

// "qkv" matches blocks.0.attn.qkv (suffix at a dot boundary), not blocks.0.xqkv.
// The base weight stays frozen; A [r, in] gets an initial value, B [out, r]
// starts at zero; y = base + (alpha / r) * B(A(x)).
// CHECK-DAG: sd.global @blocks.0.attn.qkv.weight "frozen"
// CHECK-DAG: sd.global @blocks.0.attn.qkv.lora_A.weight "trainable" : tensor<2x4xf32> = dense_resource
// CHECK-DAG: sd.global @blocks.0.attn.qkv.lora_B.weight "trainable" : tensor<6x2xf32>{{$}}
// CHECK-NOT: xqkv.lora_A
// CHECK-LABEL: func.func @infer
// CHECK:       %[[BASE:.*]] = sd.linear %arg0, %{{.*}}, %{{.*}} {layout = "oi", module = "blocks.0.attn.qkv"}
// CHECK:       %[[DOWN:.*]] = sd.linear %arg0, %{{.*}}, %{{.*}} {layout = "oi", module = "blocks.0.attn.qkv.lora_A"}
// CHECK:       %[[UP:.*]] = sd.linear %[[DOWN]], %{{.*}}, %{{.*}} {layout = "oi", module = "blocks.0.attn.qkv.lora_B"}
// CHECK:       %[[S:.*]] = sd.constant dense<2.000000e+00>
// CHECK:       %[[SC:.*]] = sd.mul %[[UP]], %[[S]]
// CHECK:       %[[Y:.*]] = sd.add %[[BASE]], %[[SC]]
// CHECK:       sd.linear %[[Y]], {{.*}} module = "blocks.0.xqkv"
module {
  sd.global @blocks.0.attn.qkv.weight "trainable" : tensor<6x4xf32>
  sd.global @blocks.0.xqkv.weight "frozen" : tensor<4x6xf32>
  func.func @infer(%x: tensor<3x4xf32>) -> tensor<3x4xf32> attributes {sd.entry = "infer"} {
    %w = sd.global_load @blocks.0.attn.qkv.weight : tensor<6x4xf32>
    %w2 = sd.global_load @blocks.0.xqkv.weight : tensor<4x6xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "oi", module = "blocks.0.attn.qkv"} : (tensor<3x4xf32>, tensor<6x4xf32>, none) -> tensor<3x6xf32>
    %z = sd.linear %y, %w2, %none {layout = "oi", module = "blocks.0.xqkv"} : (tensor<3x6xf32>, tensor<4x6xf32>, none) -> tensor<3x4xf32>
    return %z : tensor<3x4xf32>
  }
}

// -----

// expected-error@+1 {{--target-modules 'qkv' matches no linear module (modules: fc)}}
module {
  sd.global @w "frozen" : tensor<2x2xf32>
  func.func @infer(%x: tensor<1x2xf32>) -> tensor<1x2xf32> attributes {sd.entry = "infer"} {
    %w = sd.global_load @w : tensor<2x2xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "oi", module = "fc"} : (tensor<1x2xf32>, tensor<2x2xf32>, none) -> tensor<1x2xf32>
    return %y : tensor<1x2xf32>
  }
}
