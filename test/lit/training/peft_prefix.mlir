// RUN: sd-opt %s --sd-peft-prompt="virtual-tokens=2 prefix=true" --sd-specialize="shapes=input_ids=2x3" --sd-propagate-shapes --sd-prefix-attention | FileCheck %s

// Prefix tuning: the rows run on the virtual ids 8, 9 before their 3 tokens
// (the lookup reads a table row for them, clamped), and each attention
// layer's keys and values at those ids become the trained ones: row 2i
// (keys) and 2i+1 (values) of a virtual token's [2 L Hkv d] embedding,
// selected by id (so the cached generation entries get the same). Hkv = 1
// from k's projection (4 outputs, heads of 4); these keys are not repeated
// over the 2 query heads, so neither are the trained ones. The logits drop
// the virtual positions (marked: generation entries keep them).
// CHECK:       sd.peft = {first_virtual_id = 8 : i64, num_attention_heads = 1 : i64, num_layers = 1 : i64, num_virtual_tokens = 2 : i64, peft_type = "PREFIX_TUNING", prefix_projection = false, token_dim = 4 : i64}
// CHECK:       sd.global @prompt_embeddings "trainable" : tensor<2x8xf32> = dense_resource
// CHECK-LABEL: func.func @infer
// CHECK:       %[[IDS:.*]] = sd.concat %{{.*}}, %arg0 {axis = 1 : i64, sd.virtual_prefix = 1 : i64} {{.*}} -> tensor<2x5xi64>
// CHECK:       %[[OWN:.*]] = sd.min %[[IDS]]
// CHECK:       %[[ISV:.*]] = sd.greater_or_equal %[[IDS]]
// CHECK:       %[[SLOT:.*]] = sd.max
// CHECK:       %[[P:.*]] = sd.global_load @prompt_embeddings
// CHECK:       %[[LAYERS:.*]] = sd.reshape %[[P]], {{.*}} -> tensor<2x2x1x4xf32>
// CHECK:       sd.gather %{{.*}}, %[[OWN]] {sd.virtual_lookup}
// CHECK:       %[[KEYS:.*]] = sd.gather %[[LAYERS]], %{{.*}} {axis = 1 : i64} {{.*}} -> tensor<2x1x4xf32>
// CHECK:       sd.gather %[[KEYS]], %[[SLOT]] {axis = 0 : i64} {{.*}} -> tensor<2x5x1x4xf32>
// CHECK:       %[[KT:.*]] = sd.transpose %{{.*}} {perm = array<i64: 0, 2, 3, 1>} {{.*}} -> tensor<2x1x4x5xf32>
// CHECK:       %[[VALUES:.*]] = sd.gather %[[LAYERS]], %{{.*}} {axis = 1 : i64}
// CHECK:       %[[V:.*]] = sd.transpose %{{.*}} {perm = array<i64: 0, 2, 1, 3>} {{.*}} -> tensor<2x1x5x4xf32>
// CHECK:       %[[MK:.*]] = sd.reshape %[[ISV]], {{.*}} -> tensor<2x1x1x5xi1>
// CHECK:       %[[K2:.*]] = sd.where %[[MK]], %[[KT]], %{{.*}}
// CHECK:       %[[MV:.*]] = sd.reshape %[[ISV]], {{.*}} -> tensor<2x1x5x1xi1>
// CHECK:       %[[V2:.*]] = sd.where %[[MV]], %[[V]], %{{.*}}
// CHECK:       sd.attention %{{.*}}, %[[K2]], %[[V2]]
// CHECK:       %[[OUT:.*]] = sd.slice {{.*}} {sd.virtual_prefix = 0 : i64} {{.*}} -> tensor<2x3x8xf32>
// CHECK:       return %[[OUT]]
module {
  sd.global @emb "trainable" : tensor<8x8xf32> = dense<0.5> : tensor<8x8xf32>
  sd.global @q.weight "trainable" : tensor<8x8xf32> = dense<0.25> : tensor<8x8xf32>
  sd.global @k.weight "trainable" : tensor<4x8xf32> = dense<0.125> : tensor<4x8xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %e = sd.global_load @emb : tensor<8x8xf32>
    %qw = sd.global_load @q.weight : tensor<8x8xf32>
    %kw = sd.global_load @k.weight : tensor<4x8xf32>
    %none = sd.none
    %h = sd.gather %e, %ids : (tensor<8x8xf32>, tensor<?x?xi64>) -> tensor<?x?x8xf32>
    %q = sd.linear %h, %qw, %none {layout = "oi", module = "q"} : (tensor<?x?x8xf32>, tensor<8x8xf32>, none) -> tensor<?x?x8xf32>
    %k = sd.linear %h, %kw, %none {layout = "oi", module = "k"} : (tensor<?x?x8xf32>, tensor<4x8xf32>, none) -> tensor<?x?x4xf32>
    %qs = sd.constant dense<[0, 0, 2, 4]> : tensor<4xi64>
    %q4 = sd.reshape %q, %qs : (tensor<?x?x8xf32>, tensor<4xi64>) -> tensor<?x?x2x4xf32>
    %qt = sd.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : (tensor<?x?x2x4xf32>) -> tensor<?x2x?x4xf32>
    %ks = sd.constant dense<[0, 0, 1, 4]> : tensor<4xi64>
    %k4 = sd.reshape %k, %ks : (tensor<?x?x4xf32>, tensor<4xi64>) -> tensor<?x?x1x4xf32>
    %kt = sd.transpose %k4 {perm = array<i64: 0, 2, 3, 1>} : (tensor<?x?x1x4xf32>) -> tensor<?x1x4x?xf32>
    %vt = sd.transpose %k4 {perm = array<i64: 0, 2, 1, 3>} : (tensor<?x?x1x4xf32>) -> tensor<?x1x?x4xf32>
    %y = sd.attention %qt, %kt, %vt, %none, %none {scale = 0.5 : f32} : (tensor<?x2x?x4xf32>, tensor<?x1x4x?xf32>, tensor<?x1x?x4xf32>, none, none) -> tensor<?x2x?x4xf32>
    %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<?x2x?x4xf32>) -> tensor<?x?x2x4xf32>
    %ys = sd.constant dense<[0, 0, 8]> : tensor<3xi64>
    %y3 = sd.reshape %yt, %ys : (tensor<?x?x2x4xf32>, tensor<3xi64>) -> tensor<?x?x8xf32>
    %l = sd.linear %y3, %e, %none {layout = "oi", module = "head"} : (tensor<?x?x8xf32>, tensor<8x8xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}
