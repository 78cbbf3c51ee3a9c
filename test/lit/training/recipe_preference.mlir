// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-recipe-preference="beta=0.5" | FileCheck %s
// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-recipe-preference="loss-type=ipo" | FileCheck %s --check-prefix=IPO
// RUN: sd-opt %s --split-input-file --sd-recipe-preference="method=simpo simpo-gamma=0.5 cpo-alpha=0" 2>/dev/null | FileCheck %s --check-prefix=SIMPO
// RUN: sd-opt %s --split-input-file --sd-recipe-preference="method=orpo" 2>/dev/null | FileCheck %s --check-prefix=ORPO

// The reference model reads a scalar-state copy of each trainable parameter
// (initial value included); frozen ones are shared.
// CHECK:       sd.global @head.weight "trainable" : tensor<8x4xf32> = dense<1.000000e+00>
// CHECK:       sd.global @"reference/head.weight" "scalar_state" : tensor<8x4xf32> = dense<1.000000e+00>
// CHECK-NOT:   sd.global @"reference/emb"
// eval_step: the forward, then again from the first op a trainable parameter
// reaches (the embedding lookup is shared), each row's summed log-probability
// of its shifted labels under both, and the pairs' loss over interleaved rows.
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME:  %[[IDS:.*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "input_ids"}
// CHECK-SAME:  %[[LABELS:.*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "labels"}
// CHECK-SAME:  sd.output_names = ["loss_sum", "tokens"]
// CHECK:       %[[H:.*]] = sd.gather
// CHECK:       %[[W:.*]] = sd.global_load @head.weight
// CHECK:       %[[LOGITS:.*]] = sd.linear %[[H]], %[[W]]
// CHECK-NOT:   sd.gather
// CHECK:       %[[RW:.*]] = sd.global_load @"reference/head.weight"
// CHECK-NOT:   sd.global_load @head.weight
// CHECK:       %[[REF:.*]] = sd.linear %[[H]], %[[RW]]
// CHECK:       sd.softmax_cross_entropy_loss {{.*}} {ignore_index = -100 : i64, reduction = "none"}
// CHECK:       sd.softmax_cross_entropy_loss {{.*}} {ignore_index = -100 : i64, reduction = "none"}
// CHECK:       %[[RATIO:.*]] = sd.sub
// CHECK:       sd.constant dense<[-1, 2]>
// -log sigmoid(beta * (chosen - rejected)) as softplus(-beta * margin),
// summed over the pairs whose chosen row counts a label.
// CHECK:       sd.softplus
// CHECK:       sd.greater
// CHECK:       %[[PAIRS:.*]] = sd.reduce_sum
// CHECK:       %[[LOSS:.*]] = sd.reduce_sum
// CHECK:       return %[[LOSS]], %[[PAIRS]]
// With loss-type=ipo: per-token log-ratios (lengths at least 1), squared
// distance from 1 / (2 beta) = 5.
// IPO-LABEL:   func.func @eval_step
// IPO:         sd.max
// IPO:         sd.div
// IPO:         sd.div
// IPO:         sd.constant dense<5.000000e+00>
// IPO:         sd.mul
// IPO-NOT:     sd.softplus
// SimPO and ORPO have no reference model: one forward, per-token mean
// log-probabilities (a filler row's held at -1), SimPO's margin less gamma.
// SIMPO-NOT:   reference/
// SIMPO-LABEL: func.func @eval_step
// SIMPO:       sd.where
// SIMPO:       sd.constant dense<5.000000e-01>
// SIMPO:       sd.softplus
// cpo-alpha=0: no cross-entropy term.
// SIMPO-NOT:   sd.add
// SIMPO:       return
// With method=orpo: log(1 - p) of both rows for the log odds ratio, then the chosen rows'
// mean cross-entropy added, once per pair.
// ORPO-NOT:    reference/
// ORPO-LABEL:  func.func @eval_step
// ORPO:        sd.exp
// ORPO:        sd.log
// ORPO:        sd.softplus
// ORPO:        sd.add
// ORPO:        return
module {
  sd.global @emb "frozen" : tensor<8x4xf32>
  sd.global @head.weight "trainable" : tensor<8x4xf32> = dense<1.0> : tensor<8x4xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %e = sd.global_load @emb : tensor<8x4xf32>
    %h = sd.gather %e, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %w = sd.global_load @head.weight : tensor<8x4xf32>
    %none = sd.none
    %l = sd.linear %h, %w, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}

// -----

// A forward that writes state cannot be repeated for the reference.
module {
  sd.global @w "trainable" : tensor<8x4xf32>
  sd.global @stat "statistics" : tensor<8x4xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %w = sd.global_load @w : tensor<8x4xf32>
    // expected-error @+1 {{--recipe dpo: }}
    sd.global_store %w, @stat : tensor<8x4xf32>
    %h = sd.gather %w, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %none = sd.none
    %l = sd.linear %h, %w, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}

