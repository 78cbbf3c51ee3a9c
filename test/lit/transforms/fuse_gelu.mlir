// RUN: sd-opt %s --split-input-file --sd-fuse-gelu --sd-propagate-shapes | FileCheck %s

// PyTorch's export of F.gelu: Div by sqrt(2), Erf, Add 1, Mul x, Mul 0.5.
// CHECK-LABEL: func.func @pytorch_erf_gelu
//       CHECK:   %[[G:.*]] = sd.gelu %arg0
//   CHECK-NOT:   sd.erf
//   CHECK-NOT:   sd.div
//       CHECK:   return %[[G]]
func.func @pytorch_erf_gelu(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %s2 = sd.constant dense<1.41421354> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %d = sd.div %x, %s2 : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %e = sd.erf %d : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %a = sd.add %e, %one : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %m = sd.mul %x, %a : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %m, %half : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// -----

// The other association: (x * 0.5) * (1 + erf(x * 1/sqrt(2))).
// CHECK-LABEL: func.func @half_first_gelu
//       CHECK:   sd.gelu %arg0
//   CHECK-NOT:   sd.erf
func.func @half_first_gelu(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r2 = sd.constant dense<0.707106769> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %d = sd.mul %x, %r2 : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %e = sd.erf %d : (tensor<4xf32>) -> tensor<4xf32>
  %a = sd.add %one, %e : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>
  %h = sd.mul %x, %half : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %y = sd.mul %h, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// A different constant is not GELU.
// CHECK-LABEL: func.func @negative_wrong_constant_unchanged
//       CHECK:   sd.erf
//   CHECK-NOT:   sd.gelu
func.func @negative_wrong_constant_unchanged(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = sd.constant dense<2.0> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %d = sd.div %x, %c : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %e = sd.erf %d : (tensor<4xf32>) -> tensor<4xf32>
  %a = sd.add %e, %one : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %m = sd.mul %x, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %y = sd.mul %m, %half : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// The erf result used elsewhere too: fusing would duplicate work.
// CHECK-LABEL: func.func @negative_shared_erf_unchanged
//   CHECK-NOT:   sd.gelu
func.func @negative_shared_erf_unchanged(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %s2 = sd.constant dense<1.41421354> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %d = sd.div %x, %s2 : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %e = sd.erf %d : (tensor<4xf32>) -> tensor<4xf32>
  %a = sd.add %e, %one : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %m = sd.mul %x, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %y = sd.mul %m, %half : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  return %y, %e : tensor<4xf32>, tensor<4xf32>
}

// -----

// GPT-2's gelu_new as the exporters write it: 0.5 * x * (1 + tanh(sqrt(2/pi) *
// (x + 0.044715 * x^3))): one sd.gelu with the tanh approximation.
// CHECK-LABEL: func.func @gpt2_gelu_new
//       CHECK:   %[[G:.*]] = sd.gelu %arg0 {approximate = "tanh"}
//   CHECK-NOT:   sd.tanh
//   CHECK-NOT:   sd.pow
//       CHECK:   return %[[G]]
func.func @gpt2_gelu_new(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %three = sd.constant dense<3.0> : tensor<f32>
  %k = sd.constant dense<0.044715> : tensor<f32>
  %c = sd.constant dense<0.797884583> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %h = sd.mul %half, %x : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %p = sd.pow %x, %three : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %kp = sd.mul %k, %p : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %s = sd.add %x, %kp : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %cs = sd.mul %c, %s : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %t = sd.tanh %cs : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %a = sd.add %one, %t : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %h, %a : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// -----

// PyTorch's own F.gelu(approximate="tanh") as its exporter writes it: the
// cube as x * (x * x), the halving last.
// CHECK-LABEL: func.func @torch_gelu_tanh
//       CHECK:   %[[G:.*]] = sd.gelu %arg0 {approximate = "tanh"}
//   CHECK-NOT:   sd.tanh
//       CHECK:   return %[[G]]
func.func @torch_gelu_tanh(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %k = sd.constant dense<0.044715> : tensor<f32>
  %c = sd.constant dense<0.797884583> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %sq = sd.mul %x, %x : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %cube = sd.mul %x, %sq : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %kp = sd.mul %k, %cube : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %s = sd.add %x, %kp : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %cs = sd.mul %c, %s : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %t = sd.tanh %cs : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %a = sd.add %one, %t : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %xa = sd.mul %x, %a : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %half, %xa : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}

// -----

// A different cubic coefficient is another function: nothing fuses.
// CHECK-LABEL: func.func @not_gelu_new
//   CHECK-NOT:   sd.gelu
func.func @not_gelu_new(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %three = sd.constant dense<3.0> : tensor<f32>
  %k = sd.constant dense<0.1> : tensor<f32>
  %c = sd.constant dense<0.797884583> : tensor<f32>
  %one = sd.constant dense<1.0> : tensor<f32>
  %half = sd.constant dense<0.5> : tensor<f32>
  %h = sd.mul %half, %x : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %p = sd.pow %x, %three : (tensor<2x8xf32>, tensor<f32>) -> tensor<2x8xf32>
  %kp = sd.mul %k, %p : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %s = sd.add %x, %kp : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %cs = sd.mul %c, %s : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %t = sd.tanh %cs : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %a = sd.add %one, %t : (tensor<f32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = sd.mul %h, %a : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}
