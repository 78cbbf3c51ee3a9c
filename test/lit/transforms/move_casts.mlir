// RUN: sd-opt %s --split-input-file --sd-move-casts --sd-fold-cast-round-trips --sd-propagate-shapes | FileCheck %s

// Attention's inputs as autocast leaves them: an f32 projection split into
// q, k and v, each transposed in f32 and then narrowed. The narrowing moves
// to the projection; the split and transposes move bf16.
// CHECK-LABEL: func.func @split_transpose_narrow
//       CHECK:   %[[N:.*]] = sd.cast %arg0 {to = 16 : i64} : (tensor<2x4x12xf32>) -> tensor<2x4x12xbf16>
//       CHECK:   %[[S:.*]]:3 = sd.split %[[N]], %{{.*}} {{.*}} -> (tensor<2x4x4xbf16>, tensor<2x4x4xbf16>, tensor<2x4x4xbf16>)
//       CHECK:   sd.transpose %[[S]]#0 {{.*}} -> tensor<4x2x4xbf16>
//       CHECK:   sd.transpose %[[S]]#1 {{.*}} -> tensor<4x2x4xbf16>
//       CHECK:   sd.transpose %[[S]]#2 {{.*}} -> tensor<4x4x2xbf16>
//   CHECK-NOT:   sd.cast
func.func @split_transpose_narrow(%x: tensor<2x4x12xf32>) -> (tensor<4x2x4xbf16>, tensor<4x2x4xbf16>, tensor<4x4x2xbf16>) attributes {sd.entry = "infer"} {
  %sizes = sd.constant dense<[4, 4, 4]> : tensor<3xi64>
  %q, %k, %v = sd.split %x, %sizes {axis = 2 : i64} : (tensor<2x4x12xf32>, tensor<3xi64>) -> (tensor<2x4x4xf32>, tensor<2x4x4xf32>, tensor<2x4x4xf32>)
  %qt = sd.transpose %q {perm = array<i64: 1, 0, 2>} : (tensor<2x4x4xf32>) -> tensor<4x2x4xf32>
  %kt = sd.transpose %k {perm = array<i64: 1, 0, 2>} : (tensor<2x4x4xf32>) -> tensor<4x2x4xf32>
  %vt = sd.transpose %v {perm = array<i64: 1, 2, 0>} : (tensor<2x4x4xf32>) -> tensor<4x4x2xf32>
  %qh = sd.cast %qt {to = 16 : i64} : (tensor<4x2x4xf32>) -> tensor<4x2x4xbf16>
  %kh = sd.cast %kt {to = 16 : i64} : (tensor<4x2x4xf32>) -> tensor<4x2x4xbf16>
  %vh = sd.cast %vt {to = 16 : i64} : (tensor<4x4x2xf32>) -> tensor<4x4x2xbf16>
  return %qh, %kh, %vh : tensor<4x2x4xbf16>, tensor<4x2x4xbf16>, tensor<4x4x2xbf16>
}

// -----

// Its gradients: bf16 widened, transposed and concatenated in f32, then
// narrowed for the next product. The widening moves below the concat and
// meets the narrowing (a round trip, folded): everything stays bf16; the
// f32 reader gets one widening of the concatenated bf16.
// CHECK-LABEL: func.func @widen_transpose_concat
//       CHECK:   %[[A:.*]] = sd.transpose %arg0 {{.*}} -> tensor<2x4xbf16>
//       CHECK:   %[[B:.*]] = sd.transpose %arg1 {{.*}} -> tensor<2x4xbf16>
//       CHECK:   %[[C:.*]] = sd.concat %[[A]], %[[B]] {{.*}} -> tensor<2x8xbf16>
//       CHECK:   %[[W:.*]] = sd.cast %[[C]] {to = 1 : i64} : (tensor<2x8xbf16>) -> tensor<2x8xf32>
//       CHECK:   return %[[C]], %[[W]]
func.func @widen_transpose_concat(%a: tensor<4x2xbf16>, %b: tensor<4x2xbf16>) -> (tensor<2x8xbf16>, tensor<2x8xf32>) attributes {sd.entry = "infer"} {
  %aw = sd.cast %a {to = 1 : i64} : (tensor<4x2xbf16>) -> tensor<4x2xf32>
  %bw = sd.cast %b {to = 1 : i64} : (tensor<4x2xbf16>) -> tensor<4x2xf32>
  %at = sd.transpose %aw {perm = array<i64: 1, 0>} : (tensor<4x2xf32>) -> tensor<2x4xf32>
  %bt = sd.transpose %bw {perm = array<i64: 1, 0>} : (tensor<4x2xf32>) -> tensor<2x4xf32>
  %c = sd.concat %at, %bt {axis = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  %n = sd.cast %c {to = 16 : i64} : (tensor<2x8xf32>) -> tensor<2x8xbf16>
  return %n, %c : tensor<2x8xbf16>, tensor<2x8xf32>
}

// -----

// Left alone: a moved value with another f32 reader, a slice of a wider value
// (narrowing all of it would be more work), a widening a second op reads.
// CHECK-LABEL: func.func @left_alone
//       CHECK:   %[[T:.*]] = sd.transpose %arg0 {{.*}} -> tensor<4x2xf32>
//       CHECK:   sd.cast %[[T]] {to = 16 : i64}
//       CHECK:   %[[S:.*]] = sd.slice %arg1
//       CHECK:   sd.cast %[[S]] {to = 16 : i64}
//       CHECK:   %[[W:.*]] = sd.cast %arg2 {to = 1 : i64}
//       CHECK:   sd.transpose %[[W]]
func.func @left_alone(%x: tensor<2x4xf32>, %y: tensor<8x4xf32>, %h: tensor<2x4xbf16>) -> (tensor<4x2xbf16>, tensor<4x2xf32>, tensor<2x4xbf16>, tensor<4x2xf32>, tensor<2x4xf32>) attributes {sd.entry = "infer"} {
  %t = sd.transpose %x {perm = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
  %th = sd.cast %t {to = 16 : i64} : (tensor<4x2xf32>) -> tensor<4x2xbf16>
  %starts = sd.constant dense<[0]> : tensor<1xi64>
  %ends = sd.constant dense<[2]> : tensor<1xi64>
  %none = sd.none
  %s = sd.slice %y, %starts, %ends, %none, %none : (tensor<8x4xf32>, tensor<1xi64>, tensor<1xi64>, none, none) -> tensor<2x4xf32>
  %sh = sd.cast %s {to = 16 : i64} : (tensor<2x4xf32>) -> tensor<2x4xbf16>
  %w = sd.cast %h {to = 1 : i64} : (tensor<2x4xbf16>) -> tensor<2x4xf32>
  %wt = sd.transpose %w {perm = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
  return %th, %t, %sh, %wt, %w : tensor<4x2xbf16>, tensor<4x2xf32>, tensor<2x4xbf16>, tensor<4x2xf32>, tensor<2x4xf32>
}
