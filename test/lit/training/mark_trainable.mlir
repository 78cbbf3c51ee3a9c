// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-mark-trainable="pattern=blocks\.\d+\..*" | FileCheck %s

// Float globals whose full name matches become trainable; others stay frozen.
// A matching weight whose values only become bools (a causal mask registered
// as a buffer) or that nothing reads cannot get a gradient and stays frozen.
// CHECK: sd.global @emb "frozen"
// CHECK: sd.global @blocks.0.w "trainable"
// CHECK: sd.global @blocks.0.ids "frozen" : tensor<2xi64>
// CHECK: sd.global @xblocks.0.w "frozen"
// CHECK: sd.global @blocks.0.mask "frozen"
// CHECK: sd.global @blocks.0.unused "frozen"
module {
  sd.global @emb "frozen" : tensor<2xf32>
  sd.global @blocks.0.w "frozen" : tensor<2xf32>
  sd.global @blocks.0.ids "frozen" : tensor<2xi64>
  sd.global @xblocks.0.w "frozen" : tensor<2xf32>
  sd.global @blocks.0.mask "frozen" : tensor<2xf32>
  sd.global @blocks.0.unused "frozen" : tensor<2xf32>
  func.func @infer(%x: tensor<2xf32>) -> tensor<2xf32> attributes {sd.entry = "infer"} {
    %e = sd.global_load @emb : tensor<2xf32>
    %w = sd.global_load @blocks.0.w : tensor<2xf32>
    %x2 = sd.global_load @xblocks.0.w : tensor<2xf32>
    %m = sd.global_load @blocks.0.mask : tensor<2xf32>
    %zero = sd.constant dense<0.0> : tensor<f32>
    %hide = sd.equal %m, %zero : (tensor<2xf32>, tensor<f32>) -> tensor<2xi1>
    %a = sd.mul %x, %w : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %b = sd.add %a, %e : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %c = sd.add %b, %x2 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %y = sd.where %hide, %zero, %c : (tensor<2xi1>, tensor<f32>, tensor<2xf32>) -> tensor<2xf32>
    return %y : tensor<2xf32>
  }
}

// -----

// expected-error@+1 {{matches no floating-point weight}}
module {
  sd.global @emb "frozen" : tensor<2xf32>
}
