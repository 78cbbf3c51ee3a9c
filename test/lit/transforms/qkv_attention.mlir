// RUN: sd-opt %s --split-input-file --sd-qkv-attention | FileCheck %s

// GPT-2's attention in layout bshd: c_attn's [B, T, 3 H d] split into q, k
// and v, each viewed as [B, T, H, d]. QkvAttention reads the projection's
// output, viewed as [B, T, 3 H, d], as it is: no Split, and the shape
// constants only the Split and its views read are gone.
// CHECK-LABEL: func.func @gpt2
//   CHECK-NOT:   sd.split
//       CHECK:   %[[SHAPE:.*]] = sd.constant dense<[2, 4, 6, 8]> : tensor<4xi64>
//       CHECK:   %[[QKV:.*]] = sd.reshape %arg0, %[[SHAPE]] : (tensor<2x4x48xf32>, tensor<4xi64>) -> tensor<2x4x6x8xf32>
//       CHECK:   %[[Y:.*]] = sd.qkv_attention %[[QKV]], %arg1, %{{.*}} {kv_heads = 2 : i64, scale = 5.000000e-01 : f32} : (tensor<2x4x6x8xf32>, tensor<1x1x4x4xi1>, none) -> tensor<2x4x2x8xf32>
//   CHECK-NOT:   sd.reshape
//   CHECK-NOT:   sd.constant
//       CHECK:   return %[[Y]]
func.func @gpt2(%x: tensor<2x4x48xf32>, %mask: tensor<1x1x4x4xi1>) -> tensor<2x4x2x8xf32> {
  %sizes = sd.constant dense<[16, 16, 16]> : tensor<3xi64>
  %q, %k, %v = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x48xf32>, tensor<3xi64>) -> (tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>)
  %shape = sd.constant dense<[2, 4, 2, 8]> : tensor<4xi64>
  %qh = sd.reshape %q, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %kh = sd.reshape %k, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %vh = sd.reshape %v, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %none = sd.none
  %y = sd.attention %qh, %kh, %vh, %mask, %none {layout = "bshd", scale = 0.5 : f32} : (tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<1x1x4x4xi1>, none) -> tensor<2x4x2x8xf32>
  return %y : tensor<2x4x2x8xf32>
}

// -----

// Multi-query (StarCoder): 4 query heads, one key/value head, split by heads
// of a [B, T, 6, d] view already: that view is read as it is.
// CHECK-LABEL: func.func @multi_query
//   CHECK-NOT:   sd.split
//       CHECK:   %[[Y:.*]] = sd.qkv_attention %arg0, %{{.*}}, %{{.*}} {kv_heads = 1 : i64} : (tensor<2x4x6x8xf32>, none, none) -> tensor<2x4x4x8xf32>
//       CHECK:   return %[[Y]]
func.func @multi_query(%x: tensor<2x4x6x8xf32>) -> tensor<2x4x4x8xf32> {
  %sizes = sd.constant dense<[4, 1, 1]> : tensor<3xi64>
  %q, %k, %v = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x6x8xf32>, tensor<3xi64>) -> (tensor<2x4x4x8xf32>, tensor<2x4x1x8xf32>, tensor<2x4x1x8xf32>)
  %none = sd.none
  %y = sd.attention %q, %k, %v, %none, %none {layout = "bshd"} : (tensor<2x4x4x8xf32>, tensor<2x4x1x8xf32>, tensor<2x4x1x8xf32>, none, none) -> tensor<2x4x4x8xf32>
  return %y : tensor<2x4x4x8xf32>
}

// -----

// StarCoder as exported: c_attn's [B, T, H d + 2 d] split into q and one key
// and one value head; each key/value part viewed head-major [B, 1, T, d] and
// then, by sd-attention-layout, token-major [B, T, 1, d]: views of views.
// CHECK-LABEL: func.func @views_of_views
//   CHECK-NOT:   sd.split
//       CHECK:   sd.reshape %arg0, %{{.*}} : (tensor<2x4x48xf32>, tensor<4xi64>) -> tensor<2x4x6x8xf32>
//       CHECK:   sd.qkv_attention {{.*}} {kv_heads = 1 : i64}
//   CHECK-NOT:   sd.reshape
func.func @views_of_views(%x: tensor<2x4x48xf32>) -> tensor<2x4x4x8xf32> {
  %sizes = sd.constant dense<[32, 8, 8]> : tensor<3xi64>
  %q, %k, %v = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x48xf32>, tensor<3xi64>) -> (tensor<2x4x32xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>)
  %qs = sd.constant dense<[2, 4, 4, 8]> : tensor<4xi64>
  %hm = sd.constant dense<[2, 1, 4, 8]> : tensor<4xi64>
  %tm = sd.constant dense<[2, 4, 1, 8]> : tensor<4xi64>
  %qh = sd.reshape %q, %qs : (tensor<2x4x32xf32>, tensor<4xi64>) -> tensor<2x4x4x8xf32>
  %k1 = sd.reshape %k, %hm : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x1x4x8xf32>
  %kh = sd.reshape %k1, %tm : (tensor<2x1x4x8xf32>, tensor<4xi64>) -> tensor<2x4x1x8xf32>
  %v1 = sd.reshape %v, %hm : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x1x4x8xf32>
  %vh = sd.reshape %v1, %tm : (tensor<2x1x4x8xf32>, tensor<4xi64>) -> tensor<2x4x1x8xf32>
  %none = sd.none
  %y = sd.attention %qh, %kh, %vh, %none, %none {layout = "bshd"} : (tensor<2x4x4x8xf32>, tensor<2x4x1x8xf32>, tensor<2x4x1x8xf32>, none, none) -> tensor<2x4x4x8xf32>
  return %y : tensor<2x4x4x8xf32>
}

// -----

// Phi-3's qkv_proj: q, k and v sliced out of it, q and k rotated (each
// through a Slice keeping every feature, and each rotary with its own copy
// of the tables). One Rotary over the whole qkv rotates the 2 + 1 q and k
// heads (rotated_heads) and passes the value head through.
// CHECK-LABEL: func.func @rotated
//   CHECK-NOT:   sd.slice
//       CHECK:   %[[QKV:.*]] = sd.reshape %arg0, %{{.*}} : (tensor<2x4x32xf32>, tensor<4xi64>) -> tensor<2x4x4x8xf32>
//       CHECK:   %[[R:.*]] = sd.rotary %[[QKV]], %arg1, %arg2, %{{.*}} {rotated_heads = 3 : i64, seq_axis = 1 : i64} : (tensor<2x4x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>, none) -> tensor<2x4x4x8xf32>
//       CHECK:   sd.qkv_attention %[[R]], {{.*}} {kv_heads = 1 : i64}
//   CHECK-NOT:   sd.rotary
func.func @rotated(%x: tensor<2x4x32xf32>, %cos: tensor<1x4x8xf32>, %sin: tensor<1x4x8xf32>) -> tensor<2x4x2x8xf32> {
  %axis = sd.constant dense<2> : tensor<1xi64>
  %one = sd.constant dense<1> : tensor<1xi64>
  %s0 = sd.constant dense<0> : tensor<1xi64>
  %s16 = sd.constant dense<16> : tensor<1xi64>
  %s24 = sd.constant dense<24> : tensor<1xi64>
  %end = sd.constant dense<9223372036854775807> : tensor<1xi64>
  %q = sd.slice %x, %s0, %s16, %axis, %one : (tensor<2x4x32xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x4x16xf32>
  %k = sd.slice %x, %s16, %s24, %axis, %one : (tensor<2x4x32xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x4x8xf32>
  %v = sd.slice %x, %s24, %end, %axis, %one : (tensor<2x4x32xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x4x8xf32>
  %qs = sd.constant dense<[2, 4, 2, 8]> : tensor<4xi64>
  %ks = sd.constant dense<[2, 4, 1, 8]> : tensor<4xi64>
  %qh = sd.reshape %q, %qs : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %kh = sd.reshape %k, %ks : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x4x1x8xf32>
  %vh = sd.reshape %v, %ks : (tensor<2x4x8xf32>, tensor<4xi64>) -> tensor<2x4x1x8xf32>
  %a3 = sd.constant dense<3> : tensor<1xi64>
  %s8 = sd.constant dense<8> : tensor<1xi64>
  %qw = sd.slice %qh, %s0, %s8, %a3, %one : (tensor<2x4x2x8xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x4x2x8xf32>
  %kw = sd.slice %kh, %s0, %s8, %a3, %one : (tensor<2x4x1x8xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x4x1x8xf32>
  %none = sd.none
  %none2 = sd.none
  %qr = sd.rotary %qw, %cos, %sin, %none {seq_axis = 1 : i64} : (tensor<2x4x2x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>, none) -> tensor<2x4x2x8xf32>
  %kr = sd.rotary %kw, %cos, %sin, %none2 {seq_axis = 1 : i64} : (tensor<2x4x1x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>, none) -> tensor<2x4x1x8xf32>
  %y = sd.attention %qr, %kr, %vh, %none, %none {layout = "bshd"} : (tensor<2x4x2x8xf32>, tensor<2x4x1x8xf32>, tensor<2x4x1x8xf32>, none, none) -> tensor<2x4x2x8xf32>
  return %y : tensor<2x4x2x8xf32>
}

// -----

// Kept: q and k rotated by different tables.
// CHECK-LABEL: func.func @other_tables
//   CHECK-NOT:   sd.qkv_attention
func.func @other_tables(%x: tensor<2x4x48xf32>, %cos: tensor<1x4x8xf32>, %sin: tensor<1x4x8xf32>, %cos2: tensor<1x4x8xf32>) -> tensor<2x4x2x8xf32> {
  %sizes = sd.constant dense<[16, 16, 16]> : tensor<3xi64>
  %q, %k, %v = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x48xf32>, tensor<3xi64>) -> (tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>)
  %shape = sd.constant dense<[2, 4, 2, 8]> : tensor<4xi64>
  %qh = sd.reshape %q, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %kh = sd.reshape %k, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %vh = sd.reshape %v, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %none = sd.none
  %qr = sd.rotary %qh, %cos, %sin, %none {seq_axis = 1 : i64} : (tensor<2x4x2x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>, none) -> tensor<2x4x2x8xf32>
  %kr = sd.rotary %kh, %cos2, %sin, %none {seq_axis = 1 : i64} : (tensor<2x4x2x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>, none) -> tensor<2x4x2x8xf32>
  %y = sd.attention %qr, %kr, %vh, %none, %none {layout = "bshd"} : (tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, none, none) -> tensor<2x4x2x8xf32>
  return %y : tensor<2x4x2x8xf32>
}

// -----

// Kept: the parts in another order (k, q, v), a part something else reads
// (a KV cache's present keys), the default layout (keys transposed).
// CHECK-LABEL: func.func @kept
//   CHECK-NOT:   sd.qkv_attention
//       CHECK:   return
func.func @kept(%x: tensor<2x4x48xf32>, %t: tensor<2x2x4x8xf32>, %kt: tensor<2x2x8x4xf32>) -> (tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x16xf32>, tensor<2x2x4x8xf32>) {
  %sizes = sd.constant dense<[16, 16, 16]> : tensor<3xi64>
  %shape = sd.constant dense<[2, 4, 2, 8]> : tensor<4xi64>
  %none = sd.none
  %q, %k, %v = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x48xf32>, tensor<3xi64>) -> (tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>)
  %qh = sd.reshape %q, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %kh = sd.reshape %k, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %vh = sd.reshape %v, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %y = sd.attention %kh, %qh, %vh, %none, %none {layout = "bshd"} : (tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, none, none) -> tensor<2x4x2x8xf32>
  %q2, %k2, %v2 = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x48xf32>, tensor<3xi64>) -> (tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>)
  %qh2 = sd.reshape %q2, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %kh2 = sd.reshape %k2, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %vh2 = sd.reshape %v2, %shape : (tensor<2x4x16xf32>, tensor<4xi64>) -> tensor<2x4x2x8xf32>
  %y2 = sd.attention %qh2, %kh2, %vh2, %none, %none {layout = "bshd"} : (tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, none, none) -> tensor<2x4x2x8xf32>
  %y3 = sd.attention %t, %kt, %t, %none, %none : (tensor<2x2x4x8xf32>, tensor<2x2x8x4xf32>, tensor<2x2x4x8xf32>, none, none) -> tensor<2x2x4x8xf32>
  return %y, %y2, %k2, %y3 : tensor<2x4x2x8xf32>, tensor<2x4x2x8xf32>, tensor<2x4x16xf32>, tensor<2x2x4x8xf32>
}
