// RUN: sd-opt %s --split-input-file --sd-pack-sequences --sd-autodiff --verify-diagnostics | FileCheck %s

// eval_step gets a position_ids input: it replaces the lookup of arange(seq)
// in the position table (whose [seq, C] rows now differ per batch row) and
// keeps each attention query to its own sequence; autodiff passes it on to
// attention_grad and scatters the table's gradient by it.
// CHECK-LABEL: func.func @eval_step
//  CHECK-SAME:   %[[POS:[a-z0-9]+]]: tensor<2x4xi64> {sd.name = "position_ids"}
//   CHECK-NOT:   sd.constant dense<[0, 1, 2, 3]>
//       CHECK:   sd.gather %{{.*}}, %[[POS]] : (tensor<16x8xf32>, tensor<2x4xi64>) -> tensor<2x4x8xf32>
//       CHECK:   sd.attention %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[POS]]
// CHECK-LABEL: func.func @accumulate
//  CHECK-SAME:   %[[APOS:[a-z0-9]+]]: tensor<2x4xi64> {sd.name = "position_ids"}
//       CHECK:   sd.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[APOS]]
//       CHECK:   sd.gather_grad %{{.*}}, %[[APOS]]
module {
  sd.global @wpe "trainable" : tensor<16x8xf32>
  func.func @eval_step(%ids: tensor<2x4xi64> {sd.name = "input_ids"}, %labels: tensor<2x4xi64> {sd.name = "labels"},
                       %x: tensor<2x4x8xf32> {sd.name = "x"}) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %table = sd.global_load @wpe : tensor<16x8xf32>
    %arange = sd.constant dense<[0, 1, 2, 3]> : tensor<4xi64>
    %pe = sd.gather %table, %arange : (tensor<16x8xf32>, tensor<4xi64>) -> tensor<4x8xf32>
    %h = sd.add %x, %pe : (tensor<2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x4x8xf32>
    %shape = sd.constant dense<[2, 1, 4, 8]> : tensor<4xi64>
    %q = sd.reshape %h, %shape : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x1x4x8xf32>
    %perm = sd.transpose %q {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x1x4x8xf32>) -> tensor<2x1x8x4xf32>
    %none = sd.none
    %y = sd.attention %q, %perm, %q, %none, %none {scale = 0.5 : f32}
        : (tensor<2x1x4x8xf32>, tensor<2x1x8x4xf32>, tensor<2x1x4x8xf32>, none, none) -> tensor<2x1x4x8xf32>
    %sq = sd.mul %y, %y : (tensor<2x1x4x8xf32>, tensor<2x1x4x8xf32>) -> tensor<2x1x4x8xf32>
    %loss = sd.reduce_sum %sq, %none {keepdims = 0 : i64} : (tensor<2x1x4x8xf32>, none) -> tensor<f32>
    %one = sd.constant dense<1.0> : tensor<f32>
    return %loss, %one : tensor<f32>, tensor<f32>
  }
}

// -----

// Without a position table lookup there is nothing to restart per sequence.
module {
  // expected-error @+1 {{--packing: cannot find the position-embedding lookup}}
  func.func @eval_step(%ids: tensor<2x4xi64> {sd.name = "input_ids"}, %labels: tensor<2x4xi64> {sd.name = "labels"},
                       %q: tensor<2x1x4x8xf32>, %kt: tensor<2x1x8x4xf32>) -> (tensor<2x1x4x8xf32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}} {
    %none = sd.none
    %y = sd.attention %q, %kt, %q, %none, %none
        : (tensor<2x1x4x8xf32>, tensor<2x1x8x4xf32>, tensor<2x1x4x8xf32>, none, none) -> tensor<2x1x4x8xf32>
    return %y : tensor<2x1x4x8xf32>
  }
}

// -----

// Keys shared across the batch are not one sequence per row.
module {
  func.func @eval_step(%ids: tensor<2x4xi64> {sd.name = "input_ids"}, %labels: tensor<2x4xi64> {sd.name = "labels"},
                       %q: tensor<2x1x4x8xf32>, %kt: tensor<1x1x8x4xf32>) -> (tensor<2x1x4x8xf32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}} {
    %none = sd.none
    // expected-error @+1 {{is not a self-attention over [batch, ..., seq, d] with unbroadcast keys and values}}
    %y = sd.attention %q, %kt, %q, %none, %none
        : (tensor<2x1x4x8xf32>, tensor<1x1x8x4xf32>, tensor<2x1x4x8xf32>, none, none) -> tensor<2x1x4x8xf32>
    return %y : tensor<2x1x4x8xf32>
  }
}
