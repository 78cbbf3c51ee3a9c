// RUN: sd-opt %s --sd-optimizer --sd-data-parallel | FileCheck %s
// RUN: sd-opt %s --sd-optimizer --sd-data-parallel=overlap=false | FileCheck %s --check-prefix=BLOCK
// RUN: sd-opt %s --sd-optimizer --sd-data-parallel=bucket-mb=0 | FileCheck %s --check-prefix=PER
// RUN: sd-opt %s --sd-optimizer --sd-data-parallel --sd-bufferize | FileCheck %s --check-prefix=BUF
// RUN: sd-opt %s --sd-optimizer --sd-data-parallel=shard=optimizer | FileCheck %s --check-prefix=ZERO
// RUN: sd-opt %s --sd-optimizer --sd-data-parallel=shard=grads | FileCheck %s --check-prefix=GRADS

// train_step: grad/w is final once the backward stores it, so its bucket's
// AllReduce starts right there (async) and one WaitCollectives completes it
// before GradScale; grad/b, which this backward never stores, and the token
// count are reduced before GradScale, blocking. GradScale and AdamW read the
// gradients again after the wait.
// CHECK-LABEL: func.func @train_step
// CHECK:       sd.global_store %{{.*}}, @"grad/w"
// CHECK-NEXT:  %[[GW:.*]] = sd.global_load @"grad/w"
// CHECK-NEXT:  %[[RW:.*]] = sd.all_reduce %[[GW]] {async = 1 : i64}
// CHECK-NEXT:  sd.global_store %[[RW]], @"grad/w"
// CHECK:       %[[T:.*]] = sd.global_load @tokens_seen
// CHECK:       %[[GB:.*]] = sd.global_load @"grad/b"
// CHECK:       %[[W0:.*]] = sd.global_load @"grad/w"
// CHECK-NEXT:  %[[W:.*]] = sd.wait_collectives %[[W0]]
// CHECK-NEXT:  sd.global_store %[[W]], @"grad/w"
// CHECK-NEXT:  %[[GW2:.*]] = sd.global_load @"grad/w"
// CHECK-NEXT:  %[[R:.*]]:2 = sd.all_reduce %[[T]], %[[GB]] :
// CHECK:       sd.grad_scale %{{.*}}, %{{.*}}, %[[GW2]]
// CHECK-NOT:   sd.all_reduce
// CHECK:       sd.adamw %{{.*}}, %[[GW2]],
// CHECK-LABEL: func.func @apply

// Without overlap: before GradScale the token count and the gradients (in
// the order the backward finishes them, then the others last parameter
// first) are summed over the ranks by one AllReduce per bucket, stored back
// into their globals and read again by GradScale and AdamW.
// BLOCK-LABEL: func.func @train_step
// BLOCK:       %[[T:.*]] = sd.global_load @tokens_seen
// BLOCK:       %[[GW:.*]] = sd.global_load @"grad/w"
// BLOCK:       %[[GB:.*]] = sd.global_load @"grad/b"
// BLOCK:       %[[R:.*]]:3 = sd.all_reduce %[[T]], %[[GW]], %[[GB]]
// BLOCK:       sd.global_store %[[R]]#0, @tokens_seen
// BLOCK:       %[[T2:.*]] = sd.global_load @tokens_seen
// BLOCK:       sd.global_store %[[R]]#1, @"grad/w"
// BLOCK:       %[[GW2:.*]] = sd.global_load @"grad/w"
// BLOCK:       sd.global_store %[[R]]#2, @"grad/b"
// BLOCK:       sd.grad_scale %[[T2]], %{{.*}}, %[[GW2]]
// BLOCK-NOT:   sd.all_reduce
// BLOCK-NOT:   sd.wait_collectives
// BLOCK-LABEL: func.func @apply
// CHECK:       sd.all_reduce
// CHECK-NOT:   sd.all_reduce
// CHECK:       return

// --bucket-mb 0: one reduction per tensor.
// PER-LABEL: func.func @apply
// PER-COUNT-3: sd.all_reduce
// PER-NOT:     sd.all_reduce
// PER:         return

// Bufferized, the reduction writes the globals themselves (no fresh buffer): in place.
// BUF-LABEL: func.func @train_step
// BUF:       sd.step "AllReduce" {async = 1 : i64} ins(%[[A:.*]] : memref<4x4xf32>) outs(%[[B:.*]] : memref<4x4xf32>)
// BUF:       sd.step "WaitCollectives" {} ins(%{{.*}} : memref<4x4xf32>) outs(%{{.*}} : memref<4x4xf32>)
// BUF-LABEL: func.func @apply
// BUF-NOT:   sd.buffer :
// BUF:       sd.step "AllReduce" {} ins(%{{.*}}) outs(%{{.*}} : memref<f32>, memref<4x4xf32>, memref<4xf32>)
// --shard optimizer: every update names its parameter (the session runs it on
// the parameter's owner rank only) and each updated parameter is broadcast
// from its owner before the entry returns.
// ZERO-LABEL: func.func @apply
// ZERO:       sd.adamw {{.*}} shard_param = "w"
// ZERO:       sd.adamw {{.*}} shard_param = "b"
// ZERO:       %[[W:.*]] = sd.global_load @w
// ZERO:       %[[BW:.*]] = sd.broadcast %[[W]] {shard_param = "w"}
// ZERO:       sd.global_store %[[BW]], @w
// ZERO:       %[[B:.*]] = sd.global_load @b
// ZERO:       %[[BB:.*]] = sd.broadcast %[[B]] {shard_param = "b"}
// ZERO:       sd.global_store %[[BB]], @b
// ZERO:       return
// --shard grads: each accumulation adds the gradient reduced to its owner;
// apply reduces only the token count and GradScale sums the ranks' partial norms.
// GRADS-LABEL: func.func @accumulate
// GRADS:       %[[OLD:.*]] = sd.global_load @"grad/w"
// GRADS:       %[[R:.*]] = sd.reduce_to_owner %{{.*}} {shard_param = "w"}
// GRADS:       %[[N:.*]] = sd.add %[[OLD]], %[[R]]
// GRADS:       sd.global_store %[[N]], @"grad/w"
// GRADS-LABEL: func.func @apply
// GRADS:       %[[T:.*]] = sd.all_reduce %{{[^,]*}} :
// GRADS:       sd.grad_scale {{.*}} {sharded_grads = 1 : i64}
// GRADS:       sd.adamw {{.*}} shard_param = "w"
module {
  sd.global @w "trainable" : tensor<4x4xf32>
  sd.global @b "trainable" : tensor<4xf32>
  sd.global @"grad/w" "gradient" : tensor<4x4xf32>
  sd.global @"grad/b" "gradient" : tensor<4xf32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %g = sd.global_load @"grad/w" : tensor<4x4xf32>
    %n = sd.add %g, %g : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    sd.global_store %n, @"grad/w" : tensor<4x4xf32>
    // Work after grad/w is final, for its reduction to overlap.
    %rest = sd.mul %x, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %t, %t : tensor<f32>, tensor<f32>
  }
}
