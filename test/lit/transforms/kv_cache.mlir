// RUN: sd-opt %s --split-input-file --sd-kv-cache --sd-propagate-shapes --verify-diagnostics | FileCheck %s

// A prefill entry of 2 tokens and the kv_probe at the maximum length (4).
// The entry gets position_ids; the learned position lookup and the rotary
// tables follow it (the probe's [1, 4, 2] angles become a [4, 2] table); the
// causal attention becomes sd.cached_attention over a [1, 1, 4, 2] cache per
// keys and values: one kv head, seen through the repeat-kv chain
// (Unsqueeze -> Expand -> Reshape) that fed two query heads. The updated
// caches are stored back, and the probe is gone.
// CHECK-DAG:   sd.global @"kv_cache/0/key" "kv_cache" : tensor<1x1x4x2xf32>
// CHECK-DAG:   sd.global @"kv_cache/0/value" "kv_cache" : tensor<1x1x4x2xf32>
// CHECK-LABEL: func.func @prefill
//  CHECK-SAME:   %[[POS:[a-z0-9]+]]: tensor<1x2xi64> {sd.name = "position_ids"}
//   CHECK-NOT:   sd.constant dense<[0, 1]>
//       CHECK:   sd.gather %{{.*}}, %[[POS]] : (tensor<8x4xf32>, tensor<1x2xi64>) -> tensor<1x2x4xf32>
//       CHECK:   %[[COS:.*]] = sd.constant dense<{{.*}}> : tensor<4x2xf32>
//       CHECK:   sd.rotary %{{.*}}, %[[COS]], %{{.*}}, %[[POS]] : (tensor<1x1x2x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<1x2xi64>)
//       CHECK:   %[[KC:.*]] = sd.global_load @"kv_cache/0/key" : tensor<1x1x4x2xf32>
//       CHECK:   %[[VC:.*]] = sd.global_load @"kv_cache/0/value" : tensor<1x1x4x2xf32>
//       CHECK:   %[[Y:.*]], %[[KN:.*]], %[[VN:.*]] = sd.cached_attention %{{.*}}, %{{.*}}, %{{.*}}, %[[KC]], %[[VC]], %[[POS]] {scale = 5.000000e-01 : f32}
//  CHECK-SAME:     (tensor<1x2x2x2xf32>, tensor<1x1x2x2xf32>, tensor<1x1x2x2xf32>, tensor<1x1x4x2xf32>, tensor<1x1x4x2xf32>, tensor<1x2xi64>)
//       CHECK:   sd.global_store %[[KN]], @"kv_cache/0/key"
//       CHECK:   sd.global_store %[[VN]], @"kv_cache/0/value"
//   CHECK-NOT:   sd.attention
//       CHECK:   return %[[Y]]
//   CHECK-NOT:   kv_probe
module {
  sd.global @wpe "frozen" : tensor<8x4xf32>
  sd.global @emb "frozen" : tensor<8x4xf32>
  sd.global @embk "frozen" : tensor<8x2xf32>
  func.func @prefill(%ids: tensor<1x2xi64> {sd.name = "input_ids"}) -> tensor<1x2x2x2xf32>
      attributes {sd.entry = "prefill", sd.bucket = {}, sd.output_names = ["logits"]} {
    %none = sd.none
    %table = sd.global_load @emb : tensor<8x4xf32>
    %x0 = sd.gather %table, %ids : (tensor<8x4xf32>, tensor<1x2xi64>) -> tensor<1x2x4xf32>
    %wpe = sd.global_load @wpe : tensor<8x4xf32>
    %arange = sd.constant dense<[0, 1]> : tensor<2xi64>
    %pe = sd.gather %wpe, %arange : (tensor<8x4xf32>, tensor<2xi64>) -> tensor<2x4xf32>
    %x = sd.add %x0, %pe : (tensor<1x2x4xf32>, tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %qshape = sd.constant dense<[1, 2, 2, 2]> : tensor<4xi64>
    %q = sd.reshape %x, %qshape : (tensor<1x2x4xf32>, tensor<4xi64>) -> tensor<1x2x2x2xf32>
    %embk = sd.global_load @embk : tensor<8x2xf32>
    %xk = sd.gather %embk, %ids : (tensor<8x2xf32>, tensor<1x2xi64>) -> tensor<1x2x2xf32>
    %kshape = sd.constant dense<[1, 1, 2, 2]> : tensor<4xi64>
    %k0 = sd.reshape %xk, %kshape : (tensor<1x2x2xf32>, tensor<4xi64>) -> tensor<1x1x2x2xf32>
    %cos = sd.constant dense<[[[1.0, 1.0], [0.5, 0.5]]]> : tensor<1x2x2xf32>
    %sin = sd.constant dense<[[[0.0, 0.0], [0.75, 0.75]]]> : tensor<1x2x2xf32>
    %k = sd.rotary %k0, %cos, %sin, %none : (tensor<1x1x2x2xf32>, tensor<1x2x2xf32>, tensor<1x2x2xf32>, none) -> tensor<1x1x2x2xf32>
    %axis = sd.constant dense<[2]> : tensor<1xi64>
    %ku = sd.unsqueeze %k, %axis : (tensor<1x1x2x2xf32>, tensor<1xi64>) -> tensor<1x1x1x2x2xf32>
    %eshape = sd.constant dense<[1, 1, 2, 2, 2]> : tensor<5xi64>
    %ke = sd.expand %ku, %eshape : (tensor<1x1x1x2x2xf32>, tensor<5xi64>) -> tensor<1x1x2x2x2xf32>
    %kr = sd.reshape %ke, %qshape : (tensor<1x1x2x2x2xf32>, tensor<4xi64>) -> tensor<1x2x2x2xf32>
    %kt = sd.transpose %kr {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
    %vu = sd.unsqueeze %k0, %axis : (tensor<1x1x2x2xf32>, tensor<1xi64>) -> tensor<1x1x1x2x2xf32>
    %ve = sd.expand %vu, %eshape : (tensor<1x1x1x2x2xf32>, tensor<5xi64>) -> tensor<1x1x2x2x2xf32>
    %v = sd.reshape %ve, %qshape : (tensor<1x1x2x2x2xf32>, tensor<4xi64>) -> tensor<1x2x2x2xf32>
    %mask = sd.constant dense<[[false, true], [false, false]]> : tensor<2x2xi1>
    %y = sd.attention %q, %kt, %v, %mask, %none {scale = 0.5 : f32, mask_value = -3.4e38 : f32}
        : (tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<1x2x2x2xf32>, tensor<2x2xi1>, none) -> tensor<1x2x2x2xf32>
    return %y : tensor<1x2x2x2xf32>
  }
  func.func @kv_probe(%ids: tensor<1x4xi64> {sd.name = "input_ids"}) -> tensor<1x1x4x2xf32>
      attributes {sd.entry = "kv_probe", sd.bucket = {}, sd.output_names = ["logits"]} {
    %none = sd.none
    %embk = sd.global_load @embk : tensor<8x2xf32>
    %xk = sd.gather %embk, %ids : (tensor<8x2xf32>, tensor<1x4xi64>) -> tensor<1x4x2xf32>
    %kshape = sd.constant dense<[1, 1, 4, 2]> : tensor<4xi64>
    %k = sd.reshape %xk, %kshape : (tensor<1x4x2xf32>, tensor<4xi64>) -> tensor<1x1x4x2xf32>
    %cos = sd.constant dense<[[[1.0, 1.0], [0.5, 0.5], [0.25, 0.25], [0.125, 0.125]]]> : tensor<1x4x2xf32>
    %sin = sd.constant dense<[[[0.0, 0.0], [0.75, 0.75], [0.5, 0.5], [0.25, 0.25]]]> : tensor<1x4x2xf32>
    %y = sd.rotary %k, %cos, %sin, %none : (tensor<1x1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, none) -> tensor<1x1x4x2xf32>
    return %y : tensor<1x1x4x2xf32>
  }
}

// -----

// An attention without the causal mask (an encoder's) cannot attend through a cache.
module {
  func.func @decode(%ids: tensor<1x2xi64> {sd.name = "input_ids"}, %q: tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>
      attributes {sd.entry = "prefill", sd.bucket = {}} {
    %none = sd.none
    %kt = sd.transpose %q {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x1x2x2xf32>) -> tensor<1x1x2x2xf32>
    // expected-error @+1 {{is not causal (its mask is not the constant causal mask)}}
    %y = sd.attention %q, %kt, %q, %none, %none {scale = 0.5 : f32}
        : (tensor<1x1x2x2xf32>, tensor<1x1x2x2xf32>, tensor<1x1x2x2xf32>, none, none) -> tensor<1x1x2x2xf32>
    return %y : tensor<1x1x2x2xf32>
  }
  func.func @kv_probe(%ids: tensor<1x4xi64> {sd.name = "input_ids"}) -> tensor<1x4xi64>
      attributes {sd.entry = "kv_probe", sd.bucket = {}} {
    return %ids : tensor<1x4xi64>
  }
}
