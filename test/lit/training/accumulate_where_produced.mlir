// RUN: sd-opt %s --sd-accumulate-where-produced | FileCheck %s

// Each gradient is added into its accumulator right after its delta is
// computed, in the order the deltas are produced (b's before a's), both of
// one op's deltas (split's) in their original order; c's stays where it was,
// as an op between reads grad/c.
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[DB:.*]] = sd.mul
// CHECK-NEXT:  %[[OB:.*]] = sd.global_load @"grad/b"
// CHECK-NEXT:  %[[SB:.*]] = sd.add %[[OB]], %[[DB]]
// CHECK-NEXT:  sd.global_store %[[SB]], @"grad/b"
// CHECK-NEXT:  %[[DA:.*]] = sd.sub
// CHECK-NEXT:  %[[OA:.*]] = sd.global_load @"grad/a"
// CHECK-NEXT:  %[[SA:.*]] = sd.add %[[OA]], %[[DA]]
// CHECK-NEXT:  sd.global_store %[[SA]], @"grad/a"
// CHECK-NEXT:  sd.none
// CHECK-NEXT:  %[[S:.*]]:2 = sd.split
// CHECK-NEXT:  sd.global_load @"grad/d"
// CHECK-NEXT:  sd.add %{{.*}}, %[[S]]#0
// CHECK-NEXT:  sd.global_store %{{.*}}, @"grad/d"
// CHECK-NEXT:  sd.global_load @"grad/e"
// CHECK-NEXT:  sd.add %{{.*}}, %[[S]]#1
// CHECK-NEXT:  sd.global_store %{{.*}}, @"grad/e"
// CHECK-NEXT:  %[[DC:.*]] = sd.neg
// CHECK-NEXT:  sd.global_load @"grad/c"
// CHECK-NEXT:  sd.reduce_sum
// CHECK:       %[[OC:.*]] = sd.global_load @"grad/c"
// CHECK-NEXT:  sd.add %[[OC]], %[[DC]]
// CHECK-NEXT:  sd.global_store %{{.*}}, @"grad/c"
// CHECK-NEXT:  return
//
// Entries without a backward are left alone.
// CHECK-LABEL: func.func @eval_step
// CHECK:       sd.mul
// CHECK-NEXT:  sd.constant
// CHECK-NEXT:  sd.global_load @"grad/b"
module {
  sd.global @"grad/a" "gradient" : tensor<2x4xf32>
  sd.global @"grad/b" "gradient" : tensor<2x4xf32>
  sd.global @"grad/c" "gradient" : tensor<2x4xf32>
  sd.global @"grad/d" "gradient" : tensor<1x4xf32>
  sd.global @"grad/e" "gradient" : tensor<1x4xf32>
  func.func @accumulate(%x: tensor<2x4xf32>) -> (tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum"]} {
    %db = sd.mul %x, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %da = sd.sub %db, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %none = sd.none
    %split:2 = sd.split %da, %none {axis = 0 : i64} : (tensor<2x4xf32>, none) -> (tensor<1x4xf32>, tensor<1x4xf32>)
    %dc = sd.neg %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %peek = sd.global_load @"grad/c" : tensor<2x4xf32>
    %loss = sd.reduce_sum %peek, %none {keepdims = 0 : i64} : (tensor<2x4xf32>, none) -> tensor<f32>
    %oa = sd.global_load @"grad/a" : tensor<2x4xf32>
    %sa = sd.add %oa, %da : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    sd.global_store %sa, @"grad/a" : tensor<2x4xf32>
    %ob = sd.global_load @"grad/b" : tensor<2x4xf32>
    %sb = sd.add %ob, %db : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    sd.global_store %sb, @"grad/b" : tensor<2x4xf32>
    %oc = sd.global_load @"grad/c" : tensor<2x4xf32>
    %sc = sd.add %oc, %dc : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    sd.global_store %sc, @"grad/c" : tensor<2x4xf32>
    %od = sd.global_load @"grad/d" : tensor<1x4xf32>
    %sd = sd.add %od, %split#0 : (tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<1x4xf32>
    sd.global_store %sd, @"grad/d" : tensor<1x4xf32>
    %oe = sd.global_load @"grad/e" : tensor<1x4xf32>
    %se = sd.add %oe, %split#1 : (tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<1x4xf32>
    sd.global_store %se, @"grad/e" : tensor<1x4xf32>
    return %loss : tensor<f32>
  }
  func.func @eval_step(%x: tensor<2x4xf32>) -> (tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum"]} {
    %db = sd.mul %x, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    %t = sd.constant dense<1.0> : tensor<f32>
    %ob = sd.global_load @"grad/b" : tensor<2x4xf32>
    %sb = sd.add %ob, %db : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
    sd.global_store %sb, @"grad/b" : tensor<2x4xf32>
    return %t : tensor<f32>
  }
}
