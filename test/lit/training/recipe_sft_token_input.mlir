// RUN: sd-opt %s --split-input-file --sd-recipe-sft --verify-diagnostics | FileCheck %s

// A token input not called input_ids (nanoGPT's idx) is found by its use as
// embedding indices beside another int64 [batch, seq] input, and recorded.
// CHECK:       module attributes {sd.token_input = "idx"}
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME:  %{{.*}}: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "labels"}
module {
  sd.global @emb "trainable" : tensor<8x4xf32>
  func.func @infer(%mask: tensor<?x?xi64> {sd.name = "attention_mask", sd.dim_params = ["batch", "seq"]},
                   %ids: tensor<?x?xi64> {sd.name = "idx", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %e = sd.global_load @emb : tensor<8x4xf32>
    %h = sd.gather %e, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %none = sd.none
    %l = sd.linear %h, %e, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}

// -----

// Two inputs index embeddings: the error names both and the flag.
module {
  sd.global @tok "trainable" : tensor<8x4xf32>
  sd.global @seg "trainable" : tensor<2x4xf32>
  // expected-error @below {{cannot tell the token input among the int64 [batch, seq] inputs 'ids', 'segs'; name it with --token-input NAME}}
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "ids"}, %segs: tensor<?x?xi64> {sd.name = "segs"}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %t = sd.global_load @tok : tensor<8x4xf32>
    %s = sd.global_load @seg : tensor<2x4xf32>
    %a = sd.gather %t, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %b = sd.gather %s, %segs : (tensor<2x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %h = sd.add %a, %b : (tensor<?x?x4xf32>, tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    %none = sd.none
    %l = sd.linear %h, %t, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}
