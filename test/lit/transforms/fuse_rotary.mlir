// RUN: sd-opt %s --split-input-file --sd-fuse-rotary --sd-propagate-shapes | FileCheck %s

// Hugging Face's apply_rotary_pos_emb as torch.onnx.export writes it once
// shapes are static: q * cos + Concat(-q[..., 2:], q[..., :2]) * sin, with
// cos/sin constants [1, 1, S, D]. They become [1, S, D] operands.
// CHECK-LABEL: func.func @llama_rotary
//   CHECK-DAG:   %[[C:.*]] = sd.constant dense<{{.*}}> : tensor<1x3x4xf32>
//   CHECK-DAG:   %[[S:.*]] = sd.constant dense<{{.*}}> : tensor<1x3x4xf32>
//       CHECK:   %[[Y:.*]] = sd.rotary %arg0, %[[C]], %[[S]], %{{.*}} : (tensor<2x2x3x4xf32>, tensor<1x3x4xf32>, tensor<1x3x4xf32>, none) -> tensor<2x2x3x4xf32>
//   CHECK-NOT:   sd.concat
//   CHECK-NOT:   sd.neg
//       CHECK:   return %[[Y]]
func.func @llama_rotary(%q: tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32> {
  %cos = sd.constant dense<[[[[1.0, 0.5, 1.0, 0.5], [0.0, 0.25, 0.0, 0.25], [-1.0, 0.125, -1.0, 0.125]]]]> : tensor<1x1x3x4xf32>
  %sin = sd.constant dense<[[[[0.0, 0.5, 0.0, 0.5], [1.0, 0.25, 1.0, 0.25], [0.0, 0.125, 0.0, 0.125]]]]> : tensor<1x1x3x4xf32>
  %axis = sd.constant dense<3> : tensor<1xi64>
  %zero = sd.constant dense<0> : tensor<1xi64>
  %half = sd.constant dense<2> : tensor<1xi64>
  %big = sd.constant dense<9223372036854775807> : tensor<1xi64>
  %one = sd.constant dense<1> : tensor<1xi64>
  %direct = sd.mul %q, %cos : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %lo = sd.slice %q, %zero, %half, %axis, %one : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x2x3x2xf32>
  %hi = sd.slice %q, %half, %big, %axis, %one : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x2x3x2xf32>
  %nhi = sd.neg %hi : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2xf32>
  %rot = sd.concat %nhi, %lo {axis = -1 : i64} : (tensor<2x2x3x2xf32>, tensor<2x2x3x2xf32>) -> tensor<2x2x3x4xf32>
  %rs = sd.mul %sin, %rot : (tensor<1x1x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  %y = sd.add %rs, %direct : (tensor<2x2x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  return %y : tensor<2x2x3x4xf32>
}

// -----

// cos/sin computed from a position_ids input ([B, 1, S, D], one table per
// batch item) are operands too: they become [B, S, D].
// CHECK-LABEL: func.func @computed_angles
//       CHECK:   %[[C:.*]] = sd.reshape %arg1
//       CHECK:   %[[S:.*]] = sd.reshape %arg2
//       CHECK:   sd.rotary %arg0, %[[C]], %[[S]], %{{.*}} : (tensor<2x2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, none)
func.func @computed_angles(%q: tensor<2x2x3x4xf32>, %cos: tensor<2x1x3x4xf32>, %sin: tensor<2x1x3x4xf32>) -> tensor<2x2x3x4xf32> {
  %axis = sd.constant dense<-1> : tensor<1xi64>
  %zero = sd.constant dense<0> : tensor<1xi64>
  %half = sd.constant dense<2> : tensor<1xi64>
  %end = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %direct = sd.mul %cos, %q : (tensor<2x1x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  %lo = sd.slice %q, %zero, %half, %axis, %none : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x2x3x2xf32>
  %hi = sd.slice %q, %half, %end, %axis, %none : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x2x3x2xf32>
  %nhi = sd.neg %hi : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2xf32>
  %rot = sd.concat %nhi, %lo {axis = 3 : i64} : (tensor<2x2x3x2xf32>, tensor<2x2x3x2xf32>) -> tensor<2x2x3x4xf32>
  %rs = sd.mul %rot, %sin : (tensor<2x2x3x4xf32>, tensor<2x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %y = sd.add %direct, %rs : (tensor<2x2x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  return %y : tensor<2x2x3x4xf32>
}

// -----

// The interleaved form (GPT-J, Cohere) as the dynamo exporter writes it:
// q * cos + Reshape(Concat(Unsqueeze(-q[..., 1::2]), Unsqueeze(q[..., ::2]))) * sin.
// CHECK-LABEL: func.func @interleaved_rotary
//       CHECK:   %[[Y:.*]] = sd.rotary %arg0, %{{.*}}, %{{.*}}, %{{.*}} {interleaved = 1 : i64} : (tensor<2x2x3x4xf32>, tensor<1x3x4xf32>, tensor<1x3x4xf32>, none) -> tensor<2x2x3x4xf32>
//   CHECK-NOT:   sd.concat
//       CHECK:   return %[[Y]]
func.func @interleaved_rotary(%q: tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32> {
  %cos = sd.constant dense<[[[[1.0, 1.0, 0.5, 0.5], [0.0, 0.0, 0.25, 0.25], [-1.0, -1.0, 0.125, 0.125]]]]> : tensor<1x1x3x4xf32>
  %sin = sd.constant dense<[[[[0.0, 0.0, 0.5, 0.5], [1.0, 1.0, 0.25, 0.25], [0.0, 0.0, 0.125, 0.125]]]]> : tensor<1x1x3x4xf32>
  %axis = sd.constant dense<3> : tensor<1xi64>
  %last = sd.constant dense<-1> : tensor<1xi64>
  %zero = sd.constant dense<0> : tensor<1xi64>
  %one = sd.constant dense<1> : tensor<1xi64>
  %two = sd.constant dense<2> : tensor<1xi64>
  %big = sd.constant dense<9223372036854775807> : tensor<1xi64>
  %shape = sd.constant dense<[2, 2, 3, 4]> : tensor<4xi64>
  %direct = sd.mul %q, %cos : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %even = sd.slice %q, %zero, %big, %axis, %two : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x2x3x2xf32>
  %odd = sd.slice %q, %one, %big, %axis, %two : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x2x3x2xf32>
  %nodd = sd.neg %odd : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2xf32>
  %a = sd.unsqueeze %nodd, %last : (tensor<2x2x3x2xf32>, tensor<1xi64>) -> tensor<2x2x3x2x1xf32>
  %b = sd.unsqueeze %even, %last : (tensor<2x2x3x2xf32>, tensor<1xi64>) -> tensor<2x2x3x2x1xf32>
  %stacked = sd.concat %a, %b {axis = -1 : i64} : (tensor<2x2x3x2x1xf32>, tensor<2x2x3x2x1xf32>) -> tensor<2x2x3x2x2xf32>
  %rot = sd.reshape %stacked, %shape : (tensor<2x2x3x2x2xf32>, tensor<4xi64>) -> tensor<2x2x3x4xf32>
  %rs = sd.mul %rot, %sin : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %y = sd.add %direct, %rs : (tensor<2x2x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  return %y : tensor<2x2x3x4xf32>
}

// -----

// Not interleaved: the stacked halves are in the wrong order (q[..., ::2]
// negated), so the rotation would go the other way. It stays as it is.
// CHECK-LABEL: func.func @interleaved_wrong_sign
//   CHECK-NOT:   sd.rotary
//       CHECK:   return
func.func @interleaved_wrong_sign(%q: tensor<2x2x3x4xf32>, %cos: tensor<1x1x3x4xf32>, %sin: tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32> {
  %axis = sd.constant dense<3> : tensor<1xi64>
  %last = sd.constant dense<-1> : tensor<1xi64>
  %zero = sd.constant dense<0> : tensor<1xi64>
  %one = sd.constant dense<1> : tensor<1xi64>
  %two = sd.constant dense<2> : tensor<1xi64>
  %big = sd.constant dense<9223372036854775807> : tensor<1xi64>
  %shape = sd.constant dense<[2, 2, 3, 4]> : tensor<4xi64>
  %direct = sd.mul %q, %cos : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %even = sd.slice %q, %zero, %big, %axis, %two : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x2x3x2xf32>
  %odd = sd.slice %q, %one, %big, %axis, %two : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<2x2x3x2xf32>
  %neven = sd.neg %even : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2xf32>
  %a = sd.unsqueeze %neven, %last : (tensor<2x2x3x2xf32>, tensor<1xi64>) -> tensor<2x2x3x2x1xf32>
  %b = sd.unsqueeze %odd, %last : (tensor<2x2x3x2xf32>, tensor<1xi64>) -> tensor<2x2x3x2x1xf32>
  %stacked = sd.concat %a, %b {axis = -1 : i64} : (tensor<2x2x3x2x1xf32>, tensor<2x2x3x2x1xf32>) -> tensor<2x2x3x2x2xf32>
  %rot = sd.reshape %stacked, %shape : (tensor<2x2x3x2x2xf32>, tensor<4xi64>) -> tensor<2x2x3x4xf32>
  %rs = sd.mul %rot, %sin : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %y = sd.add %direct, %rs : (tensor<2x2x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  return %y : tensor<2x2x3x4xf32>
}

// -----

// Not a rotation: the halves are swapped without the negation's partner
// (Concat(-q[..., 2:], q[..., 1:3])), and cos varying per head would not
// fit one table either. Both stay as they are.
// CHECK-LABEL: func.func @not_rotary
//   CHECK-NOT:   sd.rotary
//       CHECK:   sd.concat
//       CHECK:   return
func.func @not_rotary(%q: tensor<2x2x3x4xf32>, %cos: tensor<1x1x3x4xf32>, %sin: tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32> {
  %axis = sd.constant dense<3> : tensor<1xi64>
  %lo0 = sd.constant dense<1> : tensor<1xi64>
  %lo1 = sd.constant dense<3> : tensor<1xi64>
  %half = sd.constant dense<2> : tensor<1xi64>
  %end = sd.constant dense<4> : tensor<1xi64>
  %none = sd.none
  %direct = sd.mul %q, %cos : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %lo = sd.slice %q, %lo0, %lo1, %axis, %none : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x2x3x2xf32>
  %hi = sd.slice %q, %half, %end, %axis, %none : (tensor<2x2x3x4xf32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>, none) -> tensor<2x2x3x2xf32>
  %nhi = sd.neg %hi : (tensor<2x2x3x2xf32>) -> tensor<2x2x3x2xf32>
  %rot = sd.concat %nhi, %lo {axis = 3 : i64} : (tensor<2x2x3x2xf32>, tensor<2x2x3x2xf32>) -> tensor<2x2x3x4xf32>
  %rs = sd.mul %rot, %sin : (tensor<2x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<2x2x3x4xf32>
  %y = sd.add %direct, %rs : (tensor<2x2x3x4xf32>, tensor<2x2x3x4xf32>) -> tensor<2x2x3x4xf32>
  return %y : tensor<2x2x3x4xf32>
}
