// RUN: sd-opt %s --sd-autocast | FileCheck %s
// RUN: sd-opt %s "--sd-autocast=precision=fp16 loss-scale-window=7" | FileCheck %s --check-prefix=FP16

// fp16: f16 casts (to = 10), and the module carries the loss scale's first
// value and growth window for sd-autodiff and sd-optimizer.
// FP16:       module attributes {sd.loss_scale_init = 6.553600e+04 : f64, sd.loss_scale_window = 7 : i64}
// FP16-LABEL: func.func @linear
// FP16:       sd.cast %arg0 {to = 10 : i64} : (tensor<2x4xf32>) -> tensor<2x4xf16>
// FP16:       sd.linear {{.*}} -> tensor<2x3xf16>
// FP16:       sd.cast %{{.*}} {to = 1 : i64} : (tensor<2x3xf16>) -> tensor<2x3xf32>

// A linear layer: its f32 operands are cast to bf16 (to = 16), it computes in
// bf16, and its result is cast back to f32 (to = 1) for the op after it.
// CHECK-LABEL: func.func @linear
//       CHECK:   %[[X:.*]] = sd.cast %arg0 {to = 16 : i64} : (tensor<2x4xf32>) -> tensor<2x4xbf16>
//       CHECK:   %[[W:.*]] = sd.cast %arg1 {to = 16 : i64} : (tensor<4x3xf32>) -> tensor<4x3xbf16>
//       CHECK:   %[[B:.*]] = sd.cast %arg2 {to = 16 : i64} : (tensor<3xf32>) -> tensor<3xbf16>
//       CHECK:   %[[Y:.*]] = sd.linear %[[X]], %[[W]], %[[B]] {{.*}} -> tensor<2x3xbf16>
//       CHECK:   %[[F:.*]] = sd.cast %[[Y]] {to = 1 : i64} : (tensor<2x3xbf16>) -> tensor<2x3xf32>
//       CHECK:   sd.relu %[[F]]
func.func @linear(%x: tensor<2x4xf32>, %w: tensor<4x3xf32>, %b: tensor<3xf32>) -> tensor<2x3xf32> {
  %y = sd.linear %x, %w, %b {layout = "io", module = "fc"} : (tensor<2x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %r = sd.relu %y : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}

// Elementwise ops, norms and integer operands are left alone.
// CHECK-LABEL: func.func @others
//   CHECK-NOT:   sd.cast
func.func @others(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = sd.relu %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}
