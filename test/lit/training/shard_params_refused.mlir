// RUN: not sd-opt %s --sd-optimizer --sd-data-parallel=shard=params --sd-shard-params 2>&1 | FileCheck %s
// A trainable scalar has no rows to split: refused by name, with the mode that fits.
// CHECK: error: --shard params splits weights by rows, and trainable scalar 's' has none (use --shard grads)
module {
  sd.global @s "trainable" : tensor<f32>
  sd.global @"grad/s" "gradient" : tensor<f32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<f32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %s = sd.global_load @s : tensor<f32>
    %g = sd.global_load @"grad/s" : tensor<f32>
    %d = sd.mul %x, %s : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %n = sd.add %g, %d : (tensor<f32>, tensor<f32>) -> tensor<f32>
    sd.global_store %n, @"grad/s" : tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %t, %t : tensor<f32>, tensor<f32>
  }
}
