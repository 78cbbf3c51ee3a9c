// RUN: sd-opt %s --sd-optimizer --sd-data-parallel=shard=params --sd-shard-params | FileCheck %s
// RUN: sd-opt %s --sd-optimizer --sd-data-parallel=shard=params --sd-shard-params --sd-bufferize | FileCheck %s --check-prefix=BUF

// --shard params: the trainable w, its gradient and moments, and the frozen
// e (two rows or more) are split by rows; m (one row) is not.
// CHECK: module attributes {sd.row_sharded = ["w", "grad/w", "adamw.exp_avg/w", "adamw.exp_avg_sq/w", "e"]}

// Each op that reads a sharded weight gets it whole just before it: w twice
// (the second read gathers again, so the arena frees the first copy), e
// once, m as it is. The micro-batch's gradient goes into this rank's rows.
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[W:.*]] = sd.global_load @w
// CHECK:       %[[E:.*]] = sd.global_load @e
// CHECK:       %[[M:.*]] = sd.global_load @m
// CHECK:       %[[W1:.*]] = sd.all_gather_rows %[[W]]
// CHECK:       sd.mul %{{.*}}, %[[W1]]
// CHECK:       %[[E1:.*]] = sd.all_gather_rows %[[E]]
// CHECK:       sd.add %{{.*}}, %[[E1]]
// CHECK:       sd.add %{{.*}}, %[[M]]
// CHECK:       %[[W2:.*]] = sd.all_gather_rows %[[W]]
// CHECK:       %[[D:.*]] = sd.mul %{{.*}}, %[[W2]]
// CHECK:       %[[OLD:.*]] = sd.global_load @"grad/w"
// CHECK:       %[[SUM:.*]] = sd.reduce_scatter_rows %[[OLD]], %[[D]]
// CHECK:       sd.global_store %[[SUM]], @"grad/w"
// CHECK-NOT:   sd.all_reduce
// CHECK:       return

// apply: only the token count is all-reduced; GradScale sums partial norms,
// and AdamW updates this rank's rows, reading no gathered copy.
// CHECK-LABEL: func.func @apply
// CHECK:       sd.all_reduce %{{[^,]*}} :
// CHECK:       sd.grad_scale {{.*}} {sharded_grads = 1 : i64}
// CHECK-NOT:   sd.all_gather_rows
// CHECK:       sd.adamw
// CHECK-NOT:   sd.all_gather_rows
// CHECK:       return

// Bufferized, the scatter accumulates into the gradient global in place.
// BUF-LABEL: func.func @accumulate
// BUF:       %[[G:.*]] = sd.global_buffer @"grad/w"
// BUF:       %[[G2:.*]] = sd.global_buffer @"grad/w"
// BUF:       sd.step "ReduceScatterRows" {} ins(%[[G]], %{{.*}} : memref<4x4xf32>, memref<4x4xf32>) outs(%[[G2]] : memref<4x4xf32>)
module {
  sd.global @w "trainable" : tensor<4x4xf32>
  sd.global @e "frozen" : tensor<4x4xf32>
  sd.global @m "frozen" : tensor<1x4xf32>
  sd.global @"grad/w" "gradient" : tensor<4x4xf32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<4x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @w : tensor<4x4xf32>
    %e = sd.global_load @e : tensor<4x4xf32>
    %m = sd.global_load @m : tensor<1x4xf32>
    %a = sd.mul %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %b = sd.add %a, %e : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %c = sd.add %b, %m : (tensor<4x4xf32>, tensor<1x4xf32>) -> tensor<4x4xf32>
    %d = sd.mul %c, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %g = sd.global_load @"grad/w" : tensor<4x4xf32>
    %n = sd.add %g, %d : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    sd.global_store %n, @"grad/w" : tensor<4x4xf32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %t, %t : tensor<f32>, tensor<f32>
  }
}
