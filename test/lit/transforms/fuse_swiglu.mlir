// RUN: sd-opt %s --split-input-file --sd-fuse-swiglu --sd-propagate-shapes | FileCheck %s

// LlamaMLP as torch.onnx.export writes it: act_fn(gate_proj(x)) * up_proj(x)
// with SiLU as Sigmoid and Mul.
// CHECK-LABEL: func.func @llama_mlp
//       CHECK:   %[[Y:.*]] = sd.swiglu %arg0, %arg1 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
//   CHECK-NOT:   sd.sigmoid
//   CHECK-NOT:   sd.mul
//       CHECK:   return %[[Y]]
func.func @llama_mlp(%gate: tensor<2x8xf32>, %up: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %s = sd.sigmoid %gate : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %silu = sd.mul %gate, %s : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %silu, %up : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// -----

// ONNX Swish (alpha 1), up on the left, dynamic dims.
// CHECK-LABEL: func.func @swish
//       CHECK:   sd.swiglu %arg0, %arg1 : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32>
//   CHECK-NOT:   sd.swish
func.func @swish(%gate: tensor<?x8xf32>, %up: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %silu = sd.swish %gate : (tensor<?x8xf32>) -> tensor<?x8xf32>
  %y = sd.mul %up, %silu : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32>
  return %y : tensor<?x8xf32>
}

// -----

// Left alone: the sigmoid is used again (fusing would compute it twice), and
// a gate broadcast against up is not the gated MLP.
// CHECK-LABEL: func.func @not_swiglu
//   CHECK-NOT:   sd.swiglu
//       CHECK:   return
func.func @not_swiglu(%gate: tensor<2x8xf32>, %up: tensor<2x8xf32>, %row: tensor<8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>) {
  %s = sd.sigmoid %gate : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %silu = sd.mul %gate, %s : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %silu, %up : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %s2 = sd.sigmoid %row : (tensor<8xf32>) -> tensor<8xf32>
  %silu2 = sd.mul %row, %s2 : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %z = sd.mul %silu2, %up : (tensor<8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y, %s, %z : tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>
}
