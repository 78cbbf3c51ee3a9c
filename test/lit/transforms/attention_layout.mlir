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
