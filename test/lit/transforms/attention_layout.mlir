// RUN: sd-opt %s --split-input-file --sd-attention-layout | FileCheck %s

// Llama's attention as sd-fuse-attention and sd-fuse-rotary leave it: q and
// k transposed head-major and rotated, k and v repeated over the 2 query
// heads of each key/value head, keys transposed once more, the output
// transposed back. Attention reads the projections' token-major values
// (layout bshd), the rotary embeddings run on them (seq_axis 1), and no
// transpose, repeat or reshape is left.
// CHECK-LABEL: func.func @llama
//   CHECK-DAG:   %[[Q:.*]] = sd.rotary %arg0, %arg3, %arg4, %{{.*}} {seq_axis = 1 : i64} : (tensor<2x8x4x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x8x4x16xf32>
//   CHECK-DAG:   %[[K:.*]] = sd.rotary %arg1, %arg3, %arg4, %{{.*}} {seq_axis = 1 : i64} : (tensor<2x8x2x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x8x2x16xf32>
//       CHECK:   %[[Y:.*]] = sd.attention %[[Q]], %[[K]], %arg2, %arg5, %{{.*}} {layout = "bshd", mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<1x1x8x8xi1>, none) -> tensor<2x8x4x16xf32>
//   CHECK-NOT:   sd.transpose
//   CHECK-NOT:   sd.expand
//       CHECK:   return %[[Y]]
func.func @llama(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x16xf32>,
                 %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>, %mask: tensor<1x1x8x8xi1>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %qr = sd.rotary %qh, %cos, %sin, %none : (tensor<2x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x2x16xf32>) -> tensor<2x2x8x16xf32>
  %kr = sd.rotary %kh, %cos, %sin, %none : (tensor<2x2x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x2x8x16xf32>
  %axis = sd.constant dense<2> : tensor<1xi64>
  %ku = sd.unsqueeze %kr, %axis : (tensor<2x2x8x16xf32>, tensor<1xi64>) -> tensor<2x2x1x8x16xf32>
  %rep = sd.constant dense<[2, 2, 2, 8, 16]> : tensor<5xi64>
  %ke = sd.expand %ku, %rep : (tensor<2x2x1x8x16xf32>, tensor<5xi64>) -> tensor<2x2x2x8x16xf32>
  %heads = sd.constant dense<[2, 4, 8, 16]> : tensor<4xi64>
  %kf = sd.reshape %ke, %heads : (tensor<2x2x2x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %kf {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x2x16xf32>) -> tensor<2x2x8x16xf32>
  %vu = sd.unsqueeze %vh, %axis : (tensor<2x2x8x16xf32>, tensor<1xi64>) -> tensor<2x2x1x8x16xf32>
  %ve = sd.expand %vu, %rep : (tensor<2x2x1x8x16xf32>, tensor<5xi64>) -> tensor<2x2x2x8x16xf32>
  %vf = sd.reshape %ve, %heads : (tensor<2x2x2x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qr, %kt, %vf, %mask, %none {mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, tensor<1x1x8x8xi1>, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// GPT: keys transposed straight from [B, S, H, d] into kt, no rotary.
// CHECK-LABEL: func.func @gpt
//       CHECK:   %[[Y:.*]] = sd.attention %arg0, %arg1, %arg2, %{{.*}}, %{{.*}} {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<1x8x4x16xf32>, tensor<1x8x4x16xf32>, tensor<1x8x4x16xf32>, none, none) -> tensor<1x8x4x16xf32>
//   CHECK-NOT:   sd.transpose
//       CHECK:   return %[[Y]]
func.func @gpt(%q: tensor<1x8x4x16xf32>, %k: tensor<1x8x4x16xf32>, %v: tensor<1x8x4x16xf32>) -> tensor<1x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x4x16xf32>) -> tensor<1x4x8x16xf32>
  %kt = sd.transpose %k {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x8x4x16xf32>) -> tensor<1x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x4x16xf32>) -> tensor<1x4x8x16xf32>
  %y = sd.attention %qh, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<1x4x8x16xf32>, tensor<1x4x16x8xf32>, tensor<1x4x8x16xf32>, none, none) -> tensor<1x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x4x8x16xf32>) -> tensor<1x8x4x16xf32>
  return %yt : tensor<1x8x4x16xf32>
}

// -----

// GPT-2 as torch.onnx.export's dynamo exporter writes it: the keys' last two
// axes swapped with the heads merged into the batch (Reshape to [B*H, S, d],
// Transpose(0, 2, 1), Reshape to [B, H, d, S]): the same kt, taken as well.
// CHECK-LABEL: func.func @gpt_merged_heads
//       CHECK:   %[[Y:.*]] = sd.attention %arg0, %arg1, %arg2, %{{.*}}, %{{.*}} {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, none, none) -> tensor<2x8x4x16xf32>
//   CHECK-NOT:   sd.transpose
//   CHECK-NOT:   sd.reshape
//       CHECK:   return %[[Y]]
func.func @gpt_merged_heads(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x4x16xf32>, %v: tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %merge = sd.constant dense<[8, 8, 16]> : tensor<3xi64>
  %km = sd.reshape %kh, %merge : (tensor<2x4x8x16xf32>, tensor<3xi64>) -> tensor<8x8x16xf32>
  %kmt = sd.transpose %km {perm = array<i64: 0, 2, 1>} : (tensor<8x8x16xf32>) -> tensor<8x16x8xf32>
  %split = sd.constant dense<[2, 4, 16, 8]> : tensor<4xi64>
  %kt = sd.reshape %kmt, %split : (tensor<8x16x8xf32>, tensor<4xi64>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qh, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Llama as the dynamo exporter writes it: the repeated keys reshaped from
// repeat_kv's Expand [B, Hkv, g, S, d] straight into [B*H, S, d] for the
// transposition, and the output reshaped to the shape it has (Phi-3).
// Attention shares the key/value heads; nothing is left of the repeats.
// CHECK-LABEL: func.func @llama_merged_heads
//   CHECK-DAG:   %[[Q:.*]] = sd.rotary %arg0, %arg3, %arg4, %{{.*}} {seq_axis = 1 : i64}
//   CHECK-DAG:   %[[K:.*]] = sd.rotary %arg1, %arg3, %arg4, %{{.*}} {seq_axis = 1 : i64}
//       CHECK:   %[[Y:.*]] = sd.attention %[[Q]], %[[K]], %arg2, %arg5, %{{.*}} {layout = "bshd", mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<1x1x8x8xi1>, none) -> tensor<2x8x4x16xf32>
//   CHECK-NOT:   sd.transpose
//   CHECK-NOT:   sd.expand
//   CHECK-NOT:   sd.reshape
//       CHECK:   return %[[Y]]
func.func @llama_merged_heads(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x16xf32>,
                 %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>, %mask: tensor<1x1x8x8xi1>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %qr = sd.rotary %qh, %cos, %sin, %none : (tensor<2x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x2x16xf32>) -> tensor<2x2x8x16xf32>
  %kr = sd.rotary %kh, %cos, %sin, %none : (tensor<2x2x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x2x8x16xf32>
  %axis = sd.constant dense<2> : tensor<1xi64>
  %ku = sd.unsqueeze %kr, %axis : (tensor<2x2x8x16xf32>, tensor<1xi64>) -> tensor<2x2x1x8x16xf32>
  %rep = sd.constant dense<[2, 2, 2, 8, 16]> : tensor<5xi64>
  %ke = sd.expand %ku, %rep : (tensor<2x2x1x8x16xf32>, tensor<5xi64>) -> tensor<2x2x2x8x16xf32>
  %merge = sd.constant dense<[8, 8, 16]> : tensor<3xi64>
  %km = sd.reshape %ke, %merge : (tensor<2x2x2x8x16xf32>, tensor<3xi64>) -> tensor<8x8x16xf32>
  %kmt = sd.transpose %km {perm = array<i64: 0, 2, 1>} : (tensor<8x8x16xf32>) -> tensor<8x16x8xf32>
  %split = sd.constant dense<[2, 4, 16, 8]> : tensor<4xi64>
  %kt = sd.reshape %kmt, %split : (tensor<8x16x8xf32>, tensor<4xi64>) -> tensor<2x4x16x8xf32>
  %heads = sd.constant dense<[2, 4, 8, 16]> : tensor<4xi64>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x2x16xf32>) -> tensor<2x2x8x16xf32>
  %vu = sd.unsqueeze %vh, %axis : (tensor<2x2x8x16xf32>, tensor<1xi64>) -> tensor<2x2x1x8x16xf32>
  %ve = sd.expand %vu, %rep : (tensor<2x2x1x8x16xf32>, tensor<5xi64>) -> tensor<2x2x2x8x16xf32>
  %vf = sd.reshape %ve, %heads : (tensor<2x2x2x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qr, %kt, %vf, %mask, %none {mask_value = -3.40282347E+38 : f32, scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, tensor<1x1x8x8xi1>, none) -> tensor<2x4x8x16xf32>
  %ys = sd.reshape %y, %heads : (tensor<2x4x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %ys {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// GPT-NeoX (Pythia): q|k|v packed per head, split head-major, and a rotary
// embedding on the first 4 of each head's 16 features (the rest passed
// through by a Concat). Split, Slice and Concat on the last axis commute with
// the transpose: they are rebuilt on the token-major projection, the rotary
// with seq_axis 1, and no transpose is left.
// CHECK-LABEL: func.func @neox_partial_rotary
//       CHECK:   %[[S:.*]]:3 = sd.split %arg0, %{{.*}} {axis = 3 : i64, num_outputs = 3 : i64} : (tensor<2x8x4x48xf32>, none) -> (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>)
//   CHECK-DAG:   sd.rotary %{{.*}}, %arg1, %arg2, %{{.*}} {seq_axis = 1 : i64} : (tensor<2x8x4x4xf32>
//   CHECK-DAG:   %[[Q:.*]] = sd.concat %{{.*}}, %{{.*}} {axis = -1 : i64} : (tensor<2x8x4x4xf32>, tensor<2x8x4x12xf32>) -> tensor<2x8x4x16xf32>
//       CHECK:   %[[Y:.*]] = sd.attention %[[Q]], %{{.*}}, %[[S]]#2, %{{.*}}, %{{.*}} {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, none, none) -> tensor<2x8x4x16xf32>
//   CHECK-NOT:   sd.transpose
//       CHECK:   return %[[Y]]
func.func @neox_partial_rotary(%qkv: tensor<2x8x4x48xf32>, %cos: tensor<1x8x4xf32>, %sin: tensor<1x8x4xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %h = sd.transpose %qkv {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x48xf32>) -> tensor<2x4x8x48xf32>
  %s:3 = sd.split %h, %none {axis = 3 : i64, num_outputs = 3 : i64} : (tensor<2x4x8x48xf32>, none) -> (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>)
  %c0 = sd.constant dense<0> : tensor<1xi64>
  %c4 = sd.constant dense<4> : tensor<1xi64>
  %cmax = sd.constant dense<9223372036854775807> : tensor<1xi64>
  %c3 = sd.constant dense<3> : tensor<1xi64>
  %qr0 = sd.slice %s#0, %c0, %c4, %c3, %none : (tensor<2x4x8x16xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x4x8x4xf32>
  %qp = sd.slice %s#0, %c4, %cmax, %c3, %none : (tensor<2x4x8x16xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x4x8x12xf32>
  %qr = sd.rotary %qr0, %cos, %sin, %none : (tensor<2x4x8x4xf32>, tensor<1x8x4xf32>, tensor<1x8x4xf32>, none) -> tensor<2x4x8x4xf32>
  %q = sd.concat %qr, %qp {axis = -1 : i64} : (tensor<2x4x8x4xf32>, tensor<2x4x8x12xf32>) -> tensor<2x4x8x16xf32>
  %kr0 = sd.slice %s#1, %c0, %c4, %c3, %none : (tensor<2x4x8x16xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x4x8x4xf32>
  %kp = sd.slice %s#1, %c4, %cmax, %c3, %none : (tensor<2x4x8x16xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x4x8x12xf32>
  %kr = sd.rotary %kr0, %cos, %sin, %none : (tensor<2x4x8x4xf32>, tensor<1x8x4xf32>, tensor<1x8x4xf32>, none) -> tensor<2x4x8x4xf32>
  %k = sd.concat %kr, %kp {axis = -1 : i64} : (tensor<2x4x8x4xf32>, tensor<2x4x8x12xf32>) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %k {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %y = sd.attention %q, %kt, %s#2, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Kept: the packed split's key part is also returned, so the split (and
// the transpose before it) would still run head-major; rebuilding it
// token-major would split twice.
// CHECK-LABEL: func.func @split_read_elsewhere
//   CHECK-NOT:   layout
//       CHECK:   return
func.func @split_read_elsewhere(%qkv: tensor<2x8x4x48xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8x16xf32>) {
  %none = sd.none
  %h = sd.transpose %qkv {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x48xf32>) -> tensor<2x4x8x48xf32>
  %s:3 = sd.split %h, %none {axis = 3 : i64, num_outputs = 3 : i64} : (tensor<2x4x8x48xf32>, none) -> (tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>, tensor<2x4x8x16xf32>)
  %kt = sd.transpose %s#1 {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %y = sd.attention %s#0, %kt, %s#2, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt, %s#1 : tensor<2x8x4x16xf32>, tensor<2x4x8x16xf32>
}

// -----

// Exports with a KV cache (Optimum, onnxruntime-genai) in a plan without a
// past: the keys and values join an empty past (the Concat is the new ones),
// and genai's rotary embedding picks its angles by position ids (the same
// positions [B, S] in either layout).
// CHECK-LABEL: func.func @empty_past_positions
//       CHECK:   %[[K:.*]] = sd.rotary %arg1, %arg3, %arg4, %arg5 {seq_axis = 1 : i64} : (tensor<2x8x4x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<2x8xi64>) -> tensor<2x8x4x16xf32>
//       CHECK:   %[[Y:.*]] = sd.attention %{{.*}}, %[[K]], %arg2, %{{.*}}, %{{.*}} {layout = "bshd", scale = 2.500000e-01 : f32}
//   CHECK-NOT:   sd.transpose
//   CHECK-NOT:   sd.concat
//       CHECK:   return %[[Y]]
func.func @empty_past_positions(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x4x16xf32>, %v: tensor<2x8x4x16xf32>,
                                %cos: tensor<32x16xf32>, %sin: tensor<32x16xf32>, %pos: tensor<2x8xi64>,
                                %past_k: tensor<2x4x0x16xf32>, %past_v: tensor<2x4x0x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %qr = sd.rotary %qh, %cos, %sin, %pos : (tensor<2x4x8x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<2x8xi64>) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %kr = sd.rotary %kh, %cos, %sin, %pos : (tensor<2x4x8x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<2x8xi64>) -> tensor<2x4x8x16xf32>
  %kall = sd.concat %past_k, %kr {axis = -2 : i64} : (tensor<2x4x0x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %kall {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %vall = sd.concat %past_v, %vh {axis = 2 : i64} : (tensor<2x4x0x16xf32>, tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qr, %kt, %vall, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Gemma 3: q_norm and k_norm (RMSNorm over each head's features, weight [d])
// on the head-major q and k, then the rotary embedding: both run on the
// token-major values.
// CHECK-LABEL: func.func @gemma3_qk_norm
//       CHECK:   %[[QN:.*]] = sd.rms_normalization %arg0, %arg3 {axis = -1 : i64, epsilon = 9.99999997E-7 : f32} : (tensor<2x8x4x16xf32>, tensor<16xf32>) -> tensor<2x8x4x16xf32>
//       CHECK:   sd.rotary %[[QN]], %arg4, %arg5, %{{.*}} {seq_axis = 1 : i64}
//       CHECK:   sd.attention {{.*}} {layout = "bshd"
//   CHECK-NOT:   sd.transpose
func.func @gemma3_qk_norm(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x4x16xf32>, %v: tensor<2x8x4x16xf32>,
                          %w: tensor<16xf32>, %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %qn = sd.rms_normalization %qh, %w {axis = -1 : i64, epsilon = 1.0e-6 : f32} : (tensor<2x4x8x16xf32>, tensor<16xf32>) -> tensor<2x4x8x16xf32>
  %qr = sd.rotary %qn, %cos, %sin, %none : (tensor<2x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %kn = sd.rms_normalization %kh, %w {axis = -1 : i64, epsilon = 1.0e-6 : f32} : (tensor<2x4x8x16xf32>, tensor<16xf32>) -> tensor<2x4x8x16xf32>
  %kr = sd.rotary %kn, %cos, %sin, %none : (tensor<2x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %kr {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qr, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Kept: a norm over the last two axes (weight [S, d]) mixes a head's tokens.
// CHECK-LABEL: func.func @norm_over_tokens
//   CHECK-NOT:   layout
//       CHECK:   return
func.func @norm_over_tokens(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x4x16xf32>, %v: tensor<2x8x4x16xf32>,
                            %w: tensor<8x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %qn = sd.rms_normalization %qh, %w {axis = 2 : i64, epsilon = 1.0e-6 : f32} : (tensor<2x4x8x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %k {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qn, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Multi-query attention (StarCoder): one key/value head, [B, 1, S, d], which
// is laid out as [B, S, 1, d] already: a Reshape gives attention the
// token-major keys and values, and the repeats go.
// CHECK-LABEL: func.func @multi_query
//   CHECK-DAG:   %[[K:.*]] = sd.reshape %arg1, %{{.*}} : (tensor<2x1x8x16xf32>, tensor<4xi64>) -> tensor<2x8x1x16xf32>
//   CHECK-DAG:   %[[V:.*]] = sd.reshape %arg2, %{{.*}} : (tensor<2x1x8x16xf32>, tensor<4xi64>) -> tensor<2x8x1x16xf32>
//       CHECK:   %[[Y:.*]] = sd.attention %arg0, %[[K]], %[[V]], %{{.*}}, %{{.*}} {layout = "bshd", scale = 2.500000e-01 : f32} : (tensor<2x8x4x16xf32>, tensor<2x8x1x16xf32>, tensor<2x8x1x16xf32>, none, none) -> tensor<2x8x4x16xf32>
//   CHECK-NOT:   sd.expand
//   CHECK-NOT:   sd.transpose
//       CHECK:   return %[[Y]]
func.func @multi_query(%q: tensor<2x8x4x16xf32>, %k: tensor<2x1x8x16xf32>, %v: tensor<2x1x8x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %axis = sd.constant dense<2> : tensor<1xi64>
  %rep = sd.constant dense<[2, 1, 4, 8, 16]> : tensor<5xi64>
  %heads = sd.constant dense<[2, 4, 8, 16]> : tensor<4xi64>
  %ku = sd.unsqueeze %k, %axis : (tensor<2x1x8x16xf32>, tensor<1xi64>) -> tensor<2x1x1x8x16xf32>
  %ke = sd.expand %ku, %rep : (tensor<2x1x1x8x16xf32>, tensor<5xi64>) -> tensor<2x1x4x8x16xf32>
  %kf = sd.reshape %ke, %heads : (tensor<2x1x4x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %kf {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %vu = sd.unsqueeze %v, %axis : (tensor<2x1x8x16xf32>, tensor<1xi64>) -> tensor<2x1x1x8x16xf32>
  %ve = sd.expand %vu, %rep : (tensor<2x1x1x8x16xf32>, tensor<5xi64>) -> tensor<2x1x4x8x16xf32>
  %vf = sd.reshape %ve, %heads : (tensor<2x1x4x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qh, %kt, %vf, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// One key/value head that a rotary embedding follows (Mistral with one KV
// head): the chain down to the transpose is rebuilt, the rotary runs on the
// token-major keys, and no transpose is left (a view of the head-major rotary
// output would keep the transpose before it).
// CHECK-LABEL: func.func @one_kv_head_rotary
//       CHECK:   %[[K:.*]] = sd.rotary %arg1, %arg3, %arg4, %{{.*}} {seq_axis = 1 : i64} : (tensor<2x8x1x16xf32>
//       CHECK:   sd.attention %{{.*}}, %[[K]], %{{.*}}, %{{.*}}, %{{.*}} {layout = "bshd"
//   CHECK-NOT:   sd.transpose
func.func @one_kv_head_rotary(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x1x16xf32>, %v: tensor<2x8x1x16xf32>,
                              %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %qr = sd.rotary %qh, %cos, %sin, %none : (tensor<2x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x1x16xf32>) -> tensor<2x1x8x16xf32>
  %kr = sd.rotary %kh, %cos, %sin, %none : (tensor<2x1x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x1x8x16xf32>
  %axis = sd.constant dense<2> : tensor<1xi64>
  %rep = sd.constant dense<[2, 1, 4, 8, 16]> : tensor<5xi64>
  %heads = sd.constant dense<[2, 4, 8, 16]> : tensor<4xi64>
  %ku = sd.unsqueeze %kr, %axis : (tensor<2x1x8x16xf32>, tensor<1xi64>) -> tensor<2x1x1x8x16xf32>
  %ke = sd.expand %ku, %rep : (tensor<2x1x1x8x16xf32>, tensor<5xi64>) -> tensor<2x1x4x8x16xf32>
  %kf = sd.reshape %ke, %heads : (tensor<2x1x4x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %kt = sd.transpose %kf {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x8x16xf32>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x1x16xf32>) -> tensor<2x1x8x16xf32>
  %vu = sd.unsqueeze %vh, %axis : (tensor<2x1x8x16xf32>, tensor<1xi64>) -> tensor<2x1x1x8x16xf32>
  %ve = sd.expand %vu, %rep : (tensor<2x1x1x8x16xf32>, tensor<5xi64>) -> tensor<2x1x4x8x16xf32>
  %vf = sd.reshape %ve, %heads : (tensor<2x1x4x8x16xf32>, tensor<4xi64>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qr, %kt, %vf, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Kept: the keys merged over heads and positions ([B, H*S, d]) before the
// 3-D transpose: reshaped back to [B, H, d, S] that is another tensor than k^T.
// CHECK-LABEL: func.func @merged_other_axes
//   CHECK-NOT:   layout
//       CHECK:   return
func.func @merged_other_axes(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x4x16xf32>, %v: tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %kh = sd.transpose %k {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %merge = sd.constant dense<[2, 32, 16]> : tensor<3xi64>
  %km = sd.reshape %kh, %merge : (tensor<2x4x8x16xf32>, tensor<3xi64>) -> tensor<2x32x16xf32>
  %kmt = sd.transpose %km {perm = array<i64: 0, 2, 1>} : (tensor<2x32x16xf32>) -> tensor<2x16x32xf32>
  %split = sd.constant dense<[2, 4, 16, 8]> : tensor<4xi64>
  %kt = sd.reshape %kmt, %split : (tensor<2x16x32xf32>, tensor<4xi64>) -> tensor<2x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x8x4x16xf32>) -> tensor<2x4x8x16xf32>
  %y = sd.attention %qh, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<2x4x8x16xf32>, tensor<2x4x16x8xf32>, tensor<2x4x8x16xf32>, none, none) -> tensor<2x4x8x16xf32>
  %yt = sd.transpose %y {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x4x8x16xf32>) -> tensor<2x8x4x16xf32>
  return %yt : tensor<2x8x4x16xf32>
}

// -----

// Kept: an output read head-major (no transpose back), and a rotated query
// someone else reads too (rotating it twice would cost more than it saves).
// CHECK-LABEL: func.func @kept
//   CHECK-NOT:   layout
//       CHECK:   return
func.func @kept(%q: tensor<1x8x4x16xf32>, %k: tensor<1x8x4x16xf32>, %v: tensor<1x8x4x16xf32>,
                %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>) -> (tensor<1x4x8x16xf32>, tensor<1x8x4x16xf32>, tensor<1x4x8x16xf32>) {
  %none = sd.none
  %qh = sd.transpose %q {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x4x16xf32>) -> tensor<1x4x8x16xf32>
  %kt = sd.transpose %k {perm = array<i64: 0, 2, 3, 1>} : (tensor<1x8x4x16xf32>) -> tensor<1x4x16x8xf32>
  %vh = sd.transpose %v {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x8x4x16xf32>) -> tensor<1x4x8x16xf32>
  %y = sd.attention %qh, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<1x4x8x16xf32>, tensor<1x4x16x8xf32>, tensor<1x4x8x16xf32>, none, none) -> tensor<1x4x8x16xf32>
  %qr = sd.rotary %qh, %cos, %sin, %none : (tensor<1x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<1x4x8x16xf32>
  %y2 = sd.attention %qr, %kt, %vh, %none, %none {scale = 2.500000e-01 : f32} : (tensor<1x4x8x16xf32>, tensor<1x4x16x8xf32>, tensor<1x4x8x16xf32>, none, none) -> tensor<1x4x8x16xf32>
  %y2t = sd.transpose %y2 {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x4x8x16xf32>) -> tensor<1x8x4x16xf32>
  return %y, %y2t, %qr : tensor<1x4x8x16xf32>, tensor<1x8x4x16xf32>, tensor<1x4x8x16xf32>
}
