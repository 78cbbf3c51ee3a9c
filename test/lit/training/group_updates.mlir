// RUN: sd-opt %s --split-input-file --sd-optimizer --sd-group-updates | FileCheck %s

// sd-optimizer's AdamW per parameter become one GroupedAdamW in apply and in
// train_step: operands step, lr, weight_decay, grad scale, skip (none), then
// params, grads, exp_avgs and exp_avg_sqs; decay per tensor (rank 1: none);
// the stores follow it, each tensor's four in its old order.
// CHECK-LABEL: func.func @train_step
// CHECK-NOT:   sd.adamw
// CHECK:       %[[R:.*]]:12 = sd.grouped_adamw %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[GW:.*]], %[[GB:.*]], %[[GC:.*]], %{{.*}} {{{.*}}decay = array<i64: 1, 0, 1>
// CHECK-NEXT:  sd.global_store %[[R]]#0, @w :
// CHECK-NEXT:  sd.global_store %[[R]]#3, @"adamw.exp_avg/w"
// CHECK-NEXT:  sd.global_store %[[R]]#6, @"adamw.exp_avg_sq/w"
// CHECK-NEXT:  sd.global_store %[[R]]#9, @"grad/w"
// CHECK-NEXT:  sd.global_store %[[R]]#1, @b :
// CHECK-NEXT:  sd.global_store %[[R]]#4, @"adamw.exp_avg/b"
// CHECK-NEXT:  sd.global_store %[[R]]#7, @"adamw.exp_avg_sq/b"
// CHECK-NEXT:  sd.global_store %[[R]]#10, @"grad/b"
// CHECK-NEXT:  sd.global_store %[[R]]#2, @c :
// CHECK:       sd.global_store %[[R]]#11, @"grad/c"
// CHECK-NOT:   sd.adamw
// CHECK-LABEL: func.func @apply
// CHECK-NOT:   sd.adamw
// CHECK:       sd.grouped_adamw {{.*}}decay = array<i64: 1, 0, 1>
// CHECK-NOT:   sd.adamw
module {
  sd.global @w "trainable" : tensor<4x4xf32>
  sd.global @b "trainable" : tensor<4xf32>
  sd.global @c "trainable" : tensor<2x3xf32>
  sd.global @"grad/w" "gradient" : tensor<4x4xf32>
  sd.global @"grad/b" "gradient" : tensor<4xf32>
  sd.global @"grad/c" "gradient" : tensor<2x3xf32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %t = sd.constant dense<1.0> : tensor<f32>
    return %t, %t : tensor<f32>, tensor<f32>
  }
}

// -----

// Kept apart: an update tagged for sharding (shard_param), and one whose
// stored parameter a load between would read before the group wrote it
// (the run ends before that load); updates with other scalars (lr2) form
// their own group.
// CHECK-LABEL: func.func @apply
// CHECK:       sd.adamw {{.*}}shard_param = "a"
// CHECK:       sd.adamw
// CHECK-NEXT:  sd.global_store {{.*}}, @p
// CHECK:       sd.global_load @p
// CHECK:       sd.grouped_adamw %arg0, %arg1, {{.*}}decay = array<i64: 0, 0>
// CHECK:       sd.global_store %{{.*}}#0, @q
// CHECK:       sd.grouped_adamw %arg0, %arg2, {{.*}}decay = array<i64: 0, 0>
// CHECK-NOT:   sd.adamw
// CHECK:       return
module {
  sd.global @a "trainable" : tensor<3xf32>
  sd.global @p "trainable" : tensor<3xf32>
  sd.global @q "trainable" : tensor<3xf32>
  sd.global @r "trainable" : tensor<3xf32>
  sd.global @s "trainable" : tensor<3xf32>
  sd.global @t "trainable" : tensor<3xf32>
  func.func @apply(%step: tensor<f32>, %lr: tensor<f32>, %lr2: tensor<f32>, %wd: tensor<f32>, %gs: tensor<f32>,
                   %g: tensor<3xf32>, %m: tensor<3xf32>, %v: tensor<3xf32>) -> tensor<3xf32>
      attributes {sd.entry = "apply", sd.bucket = {}} {
    %none = sd.none
    %a = sd.global_load @a : tensor<3xf32>
    %a1:4 = sd.adamw %a, %g, %m, %v, %step, %lr, %wd, %gs, %none {decay = 0 : i64, shard_param = "a"} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %a1#0, @a : tensor<3xf32>
    %p = sd.global_load @p : tensor<3xf32>
    %p1:4 = sd.adamw %p, %g, %m, %v, %step, %lr, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %p1#0, @p : tensor<3xf32>
    %pseen = sd.global_load @p : tensor<3xf32>
    %q = sd.global_load @q : tensor<3xf32>
    %q1:4 = sd.adamw %q, %g, %m, %v, %step, %lr, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %q1#0, @q : tensor<3xf32>
    %r = sd.global_load @r : tensor<3xf32>
    %r1:4 = sd.adamw %r, %g, %m, %v, %step, %lr, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %r1#0, @r : tensor<3xf32>
    %s = sd.global_load @s : tensor<3xf32>
    %s1:4 = sd.adamw %s, %g, %m, %v, %step, %lr2, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %s1#0, @s : tensor<3xf32>
    %t = sd.global_load @t : tensor<3xf32>
    %t1:4 = sd.adamw %t, %g, %m, %v, %step, %lr2, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %t1#0, @t : tensor<3xf32>
    return %pseen : tensor<3xf32>
  }
}

// -----

// Row-sharded state (--shard params): every update stays its own step.
// CHECK-LABEL: func.func @apply
// CHECK:       sd.adamw
// CHECK:       sd.adamw
// CHECK-NOT:   sd.grouped_adamw
module attributes {sd.row_sharded = ["p", "q"]} {
  sd.global @p "trainable" : tensor<3xf32>
  sd.global @q "trainable" : tensor<3xf32>
  func.func @apply(%step: tensor<f32>, %lr: tensor<f32>, %wd: tensor<f32>, %gs: tensor<f32>, %g: tensor<3xf32>,
                   %m: tensor<3xf32>, %v: tensor<3xf32>) attributes {sd.entry = "apply", sd.bucket = {}} {
    %none = sd.none
    %p = sd.global_load @p : tensor<3xf32>
    %p1:4 = sd.adamw %p, %g, %m, %v, %step, %lr, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %p1#0, @p : tensor<3xf32>
    %q = sd.global_load @q : tensor<3xf32>
    %q1:4 = sd.adamw %q, %g, %m, %v, %step, %lr, %wd, %gs, %none {decay = 0 : i64} : (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, none) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>)
    sd.global_store %q1#0, @q : tensor<3xf32>
    return
  }
}
