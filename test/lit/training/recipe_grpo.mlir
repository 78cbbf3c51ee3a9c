// RUN: sd-opt %s --sd-recipe-grpo="num-generations=2 beta=0.04" | FileCheck %s
// RUN: sd-opt %s --sd-recipe-grpo="num-generations=2" --sd-specialize="shapes=input_ids=4x3" --sd-propagate-shapes --sd-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: sd-opt %s --sd-recipe-grpo="num-generations=2 sampling-log-probs=true" | FileCheck %s --check-prefix=OLD
// RUN: not sd-opt %s --sd-recipe-grpo="num-generations=1" 2>&1 | FileCheck %s --check-prefix=ONE
// RUN: not sd-opt %s --sd-recipe-grpo="scale-rewards=batch" 2>&1 | FileCheck %s --check-prefix=BATCH

// GRPO: rows in groups of num-generations completions, a new f32 `rewards`
// [batch] input; with beta > 0 the reference copy for the KL term.
// CHECK:       sd.global @"reference/head.weight" "scalar_state"
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME:  %{{.*}}: tensor<?xf32> {sd.dim_params = ["batch"], sd.name = "rewards"}
// The forward once more on the reference copy, for the KL term.
// CHECK:       sd.global_load @"reference/head.weight"
// The sampling policy's log-probabilities: a detached copy of the op that
// makes the policy's, so the importance weight is exp(0) with the
// log-probability's gradient; clipped to [1 - 0.2, 1 + 0.2].
// CHECK:       %[[LOGP:.*]] = sd.neg %[[NLL:.*]] :
// CHECK:       %[[SAMPLED:.*]] = sd.neg %[[NLL]] {sd.detached}
// CHECK:       %[[RATIO:.*]] = sd.sub %[[LOGP]], %[[SAMPLED]]
// CHECK:       %[[W:.*]] = sd.exp %[[RATIO]]
// CHECK:       sd.constant dense<8.000000e-01>
// CHECK:       sd.constant dense<1.200000e+00>
// CHECK:       sd.clip %[[W]]
// Advantages: the rewards in groups of 2, less the group mean, over its std + 1e-4.
// CHECK:       sd.constant dense<[-1, 2]>
// CHECK:       sd.sqrt
// CHECK:       sd.min
// The KL term, exp(ref - p) - (ref - p) - 1, times the weight.
// CHECK:       sd.exp
// CHECK:       sd.mul %{{.*}}, %[[W]]
// CHECK:       return
// The training entry keeps the detached copy, and the head gets its gradient.
// GRAD-LABEL:  func.func @accumulate
// GRAD-SAME:   %{{.*}}: tensor<4xf32> {sd.dim_params = ["batch"], sd.name = "rewards"}
// GRAD:        sd.neg {{.*}} {sd.detached}
// GRAD:        sd.global_store %{{.*}}, @"grad/head.weight"
// Groups an earlier policy sampled: its log-probabilities are an input, nothing is detached.
// OLD-LABEL:   func.func @eval_step
// OLD-SAME:    %{{.*}}: tensor<?x?xf32> {sd.dim_params = ["batch", "seq"], sd.name = "old_log_probs"}
// OLD-NOT:     sd.detached
// OLD:         %[[LOGP:.*]] = sd.neg
// OLD:         sd.sub %[[LOGP]], %arg
// OLD:         sd.clip
// ONE: --recipe grpo: --num-generations must be in [2, 4096]
// BATCH: --scale-rewards takes 'group' or 'none', got 'batch'
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
