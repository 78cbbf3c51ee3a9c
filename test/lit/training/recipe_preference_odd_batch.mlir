// RUN: sd-opt %s --verify-diagnostics --sd-recipe-preference="method=orpo"

// A batch the export fixed at an odd number of rows cannot hold pairs, and
// --shapes cannot change it: the recipe says so before specialization fails.
module {
  sd.global @w "trainable" : tensor<8x4xf32>
  // expected-error @+1 {{--recipe orpo: the model fixes its batch at 1 rows, but a preference plan's rows are (chosen, rejected) pairs}}
  func.func @infer(%ids: tensor<1x3xi64> {sd.name = "input_ids"}) -> tensor<1x3x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %w = sd.global_load @w : tensor<8x4xf32>
    %h = sd.gather %w, %ids : (tensor<8x4xf32>, tensor<1x3xi64>) -> tensor<1x3x4xf32>
    %none = sd.none
    %l = sd.linear %h, %w, %none {layout = "oi", module = "head"} : (tensor<1x3x4xf32>, tensor<8x4xf32>, none) -> tensor<1x3x8xf32>
    return %l : tensor<1x3x8xf32>
  }
}
