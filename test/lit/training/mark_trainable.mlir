// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-mark-trainable="pattern=blocks\.\d+\..*" | FileCheck %s

// Float globals whose full name matches become trainable; others stay frozen.
// CHECK: sd.global @emb "frozen"
// CHECK: sd.global @blocks.0.w "trainable"
// CHECK: sd.global @blocks.0.ids "frozen" : tensor<2xi64>
// CHECK: sd.global @xblocks.0.w "frozen"
module {
  sd.global @emb "frozen" : tensor<2xf32>
  sd.global @blocks.0.w "frozen" : tensor<2xf32>
  sd.global @blocks.0.ids "frozen" : tensor<2xi64>
  sd.global @xblocks.0.w "frozen" : tensor<2xf32>
}

// -----

// expected-error@+1 {{matches no floating-point weight}}
module {
  sd.global @emb "frozen" : tensor<2xf32>
}
