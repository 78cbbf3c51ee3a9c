// RUN: sd-opt %s --split-input-file --sd-fuse-attention | FileCheck %s

// PyTorch's SDPA as exported (Optimum, TorchScript): the scale split as
// sqrt(scale) on q and on k^T, an additive causal mask of -inf, and the
// Where(IsNaN(p), 0, p) guard after the softmax. The mask leaves every row a
// key, so the guard changes nothing and the chain fuses, scale 0.5 * 0.5.
// CHECK-LABEL: func.func @sdpa
//       CHECK:   %[[Y:.*]] = sd.attention %arg0, %arg1, %arg2, %{{.*}}, %{{.*}} {mask_value = 0xFF800000 : f32, scale = 2.500000e-01 : f32}
//   CHECK-NOT:   sd.is_nan
//   CHECK-NOT:   sd.softmax
//       CHECK:   return %[[Y]]
func.func @sdpa(%q: tensor<1x2x2x4xf32>, %kt: tensor<1x2x4x2xf32>, %v: tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32> {
  %s = sd.constant dense<0.5> : tensor<f32>
  %qs = sd.mul %q, %s : (tensor<1x2x2x4xf32>, tensor<f32>) -> tensor<1x2x2x4xf32>
  %ks = sd.mul %kt, %s : (tensor<1x2x4x2xf32>, tensor<f32>) -> tensor<1x2x4x2xf32>
  %scores = sd.matmul %qs, %ks : (tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x2x2xf32>
  %mask = sd.constant dense<[[[[0.0, 0xFF800000], [0.0, 0.0]]]]> : tensor<1x1x2x2xf32>
  %masked = sd.add %scores, %mask : (tensor<1x2x2x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x2x2xf32>
  %p = sd.softmax %masked {axis = -1 : i64} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %nan = sd.is_nan %p : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
  %zero = sd.constant dense<0.0> : tensor<1xf32>
  %guarded = sd.where %nan, %zero, %p : (tensor<1x2x2x2xi1>, tensor<1xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %y = sd.matmul %guarded, %v : (tensor<1x2x2x2xf32>, tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %y : tensor<1x2x2x4xf32>
}

// -----

// A row whose keys are all masked: the guard turns its NaNs into zeros,
// which the fused kernel does with zero_masked_rows.
// CHECK-LABEL: func.func @all_masked_row
//       CHECK:   sd.attention {{.*}} {mask_value = 0xFF800000 : f32, scale = 1.000000e+00 : f32, zero_masked_rows = 1 : i64}
//   CHECK-NOT:   sd.is_nan
func.func @all_masked_row(%q: tensor<1x2x2x4xf32>, %kt: tensor<1x2x4x2xf32>, %v: tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32> {
  %scores = sd.matmul %q, %kt : (tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x2x2xf32>
  %mask = sd.constant dense<[[[[0xFF800000, 0xFF800000], [0.0, 0.0]]]]> : tensor<1x1x2x2xf32>
  %masked = sd.add %scores, %mask : (tensor<1x2x2x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x2x2xf32>
  %p = sd.softmax %masked {axis = -1 : i64} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %nan = sd.is_nan %p : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
  %zero = sd.constant dense<0.0> : tensor<1xf32>
  %guarded = sd.where %nan, %zero, %p : (tensor<1x2x2x2xi1>, tensor<1xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %y = sd.matmul %guarded, %v : (tensor<1x2x2x2xf32>, tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %y : tensor<1x2x2x4xf32>
}

// -----

// ONNX Attention (opset 23) as imported: the scale on k before its transpose,
// and the masked-row guard Where(rowMax == -inf, 0, p), whose condition folded
// to all false once the causal bias was a constant.
// CHECK-LABEL: func.func @onnx_attention
//       CHECK:   %[[KT:.*]] = sd.transpose %arg1 {perm = array<i64: 0, 1, 3, 2>}
//       CHECK:   sd.attention %arg0, %[[KT]], %arg2, %{{.*}}, %{{.*}} {mask_value = 0xFF800000 : f32, scale = 2.500000e-01 : f32}
//   CHECK-NOT:   sd.where
func.func @onnx_attention(%q: tensor<1x2x2x4xf32>, %k: tensor<1x2x2x4xf32>, %v: tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32> {
  %s = sd.constant dense<0.5> : tensor<f32>
  %qs = sd.mul %q, %s : (tensor<1x2x2x4xf32>, tensor<f32>) -> tensor<1x2x2x4xf32>
  %ks = sd.mul %k, %s : (tensor<1x2x2x4xf32>, tensor<f32>) -> tensor<1x2x2x4xf32>
  %kt = sd.transpose %ks {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x2x2x4xf32>) -> tensor<1x2x4x2xf32>
  %scores = sd.matmul %qs, %kt : (tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x2x2xf32>
  %mask = sd.constant dense<[[[[0.0, 0xFF800000], [0.0, 0.0]]]]> : tensor<1x1x2x2xf32>
  %masked = sd.add %scores, %mask : (tensor<1x2x2x2xf32>, tensor<1x1x2x2xf32>) -> tensor<1x2x2x2xf32>
  %p = sd.softmax %masked {axis = -1 : i64} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %none = sd.constant dense<false> : tensor<1x1x2x1xi1>
  %zero = sd.constant dense<0.0> : tensor<f32>
  %guarded = sd.where %none, %zero, %p : (tensor<1x1x2x1xi1>, tensor<f32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %y = sd.matmul %guarded, %v : (tensor<1x2x2x2xf32>, tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %y : tensor<1x2x2x4xf32>
}

// -----

// A mask known only at run time (Optimum's, from the attention_mask input:
// padding may hide every key of a row), selected with Where(keep, s, -inf)
// and guarded: fused with zero_masked_rows, the mask negated once.
// CHECK-LABEL: func.func @runtime_mask
//       CHECK:   %[[M:.*]] = sd.not %arg3
//       CHECK:   sd.attention %arg0, %arg1, %arg2, %[[M]], %{{.*}} {mask_value = 0xFF800000 : f32, scale = 1.000000e+00 : f32, zero_masked_rows = 1 : i64}
//   CHECK-NOT:   sd.is_nan
func.func @runtime_mask(%q: tensor<1x2x2x4xf32>, %kt: tensor<1x2x4x2xf32>, %v: tensor<1x2x2x4xf32>, %keep: tensor<1x1x2x2xi1>) -> tensor<1x2x2x4xf32> {
  %scores = sd.matmul %q, %kt : (tensor<1x2x2x4xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x2x2xf32>
  %fill = sd.constant dense<0xFF800000> : tensor<f32>
  %masked = sd.where %keep, %scores, %fill : (tensor<1x1x2x2xi1>, tensor<1x2x2x2xf32>, tensor<f32>) -> tensor<1x2x2x2xf32>
  %p = sd.softmax %masked {axis = -1 : i64} : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %nan = sd.is_nan %p : (tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xi1>
  %zero = sd.constant dense<0.0> : tensor<1xf32>
  %guarded = sd.where %nan, %zero, %p : (tensor<1x2x2x2xi1>, tensor<1xf32>, tensor<1x2x2x2xf32>) -> tensor<1x2x2x2xf32>
  %y = sd.matmul %guarded, %v : (tensor<1x2x2x2xf32>, tensor<1x2x2x4xf32>) -> tensor<1x2x2x4xf32>
  return %y : tensor<1x2x2x4xf32>
}
