// RUN: sd-opt %s --split-input-file --sd-half-elementwise | FileCheck %s

// A bf16 Llama's gated MLP after autocast: SwiGLU on widened bf16 values,
// its result only narrowed back for the next product. It runs on the bf16
// values (its kernels compute in f32 and round as Cast does: the same bits).
// CHECK-LABEL: func.func @swiglu
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[Y:.*]] = sd.swiglu %arg0, %arg1 : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
//       CHECK:   return %[[Y]]
func.func @swiglu(%g: tensor<4x8xbf16>, %u: tensor<4x8xbf16>) -> tensor<4x8xbf16> {
  %gw = sd.cast %g {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %uw = sd.cast %u {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %y = sd.swiglu %gw, %uw : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %yh = sd.cast %y {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  return %yh : tensor<4x8xbf16>
}

// -----

// The gradient too; the widened gate stays for its other reader.
// CHECK-LABEL: func.func @swiglu_grad
//       CHECK:   %[[GW:.*]] = sd.cast %arg1
//       CHECK:   %[[DG:.*]], %[[DU:.*]] = sd.swiglu_grad %arg0, %arg1, %arg2 : (tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<4x8xbf16>) -> (tensor<4x8xbf16>, tensor<4x8xbf16>)
//       CHECK:   return %[[DG]], %[[DU]], %[[GW]]
func.func @swiglu_grad(%dy: tensor<4x8xbf16>, %g: tensor<4x8xbf16>, %u: tensor<4x8xbf16>) -> (tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<4x8xf32>) {
  %dw = sd.cast %dy {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %gw = sd.cast %g {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %uw = sd.cast %u {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %dg, %du = sd.swiglu_grad %dw, %gw, %uw : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
  %dgh = sd.cast %dg {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %duh = sd.cast %du {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  return %dgh, %duh, %gw : tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<4x8xf32>
}

// -----

// Kept in f32: an operand that is not a widened half (LoRA's sum, in f32), a
// result an f32 op reads, or halves of two types.
// CHECK-LABEL: func.func @kept
//   CHECK-COUNT-3:   sd.swiglu %{{.*}} -> tensor<4x8xf32>
func.func @kept(%g: tensor<4x8xbf16>, %u: tensor<4x8xf32>, %h: tensor<4x8xf16>) -> (tensor<4x8xbf16>, tensor<4x8xf32>, tensor<4x8xbf16>) {
  %gw = sd.cast %g {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %y1 = sd.swiglu %gw, %u : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y1h = sd.cast %y1 {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %uw = sd.cast %g {to = 1 : i64} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %y2 = sd.swiglu %gw, %uw : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %hw = sd.cast %h {to = 1 : i64} : (tensor<4x8xf16>) -> tensor<4x8xf32>
  %y3 = sd.swiglu %gw, %hw : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y3h = sd.cast %y3 {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  return %y1h, %y2, %y3h : tensor<4x8xbf16>, tensor<4x8xf32>, tensor<4x8xbf16>
}

// -----

// The cross-entropy on bf16 logits that autocast widened for it: the loss
// reads them and stays f32 (f32_loss); its gradient takes them (and the f32
// loss gradient) and gives the bf16 gradient the LM head's products read.
// CHECK-LABEL: func.func @cross_entropy
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[L:.*]] = sd.softmax_cross_entropy_loss %arg0, %arg1, %{{.*}} {f32_loss = 1 : i64, reduction = "sum"} : (tensor<6x32xbf16>, tensor<6xi64>, none) -> tensor<f32>
//       CHECK:   %[[G:.*]] = sd.softmax_cross_entropy_loss_grad %arg2, %arg0, %arg1 {reduction = "sum"} : (tensor<f32>, tensor<6x32xbf16>, tensor<6xi64>) -> tensor<6x32xbf16>
//       CHECK:   return %[[L]], %[[G]]
func.func @cross_entropy(%logits: tensor<6x32xbf16>, %labels: tensor<6xi64>, %dl: tensor<f32>) -> (tensor<f32>, tensor<6x32xbf16>) {
  %w = sd.cast %logits {to = 1 : i64} : (tensor<6x32xbf16>) -> tensor<6x32xf32>
  %none = sd.none
  %loss = sd.softmax_cross_entropy_loss %w, %labels, %none {reduction = "sum"} : (tensor<6x32xf32>, tensor<6xi64>, none) -> tensor<f32>
  %g = sd.softmax_cross_entropy_loss_grad %dl, %w, %labels {reduction = "sum"} : (tensor<f32>, tensor<6x32xf32>, tensor<6xi64>) -> tensor<6x32xf32>
  %gh = sd.cast %g {to = 16 : i64} : (tensor<6x32xf32>) -> tensor<6x32xbf16>
  return %loss, %gh : tensor<f32>, tensor<6x32xbf16>
}

// -----

// Rotary on a widened bf16 q, narrowed after: it runs on the bf16 values
// with its f32 cos/sin tables.
// CHECK-LABEL: func.func @rotary
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[Y:.*]] = sd.rotary %arg0, %arg1, %arg2, %{{.*}} : (tensor<2x4x8x16xbf16>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xbf16>
//       CHECK:   return %[[Y]]
func.func @rotary(%q: tensor<2x4x8x16xbf16>, %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>) -> tensor<2x4x8x16xbf16> {
  %w = sd.cast %q {to = 1 : i64} : (tensor<2x4x8x16xbf16>) -> tensor<2x4x8x16xf32>
  %none = sd.none
  %y = sd.rotary %w, %cos, %sin, %none : (tensor<2x4x8x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x4x8x16xf32>
  %yh = sd.cast %y {to = 16 : i64} : (tensor<2x4x8x16xf32>) -> tensor<2x4x8x16xbf16>
  return %yh : tensor<2x4x8x16xbf16>
}

// -----

// An f32 input whose result is only narrowed (LoRA's f32 sum rotated; the
// f32 residual stream normalized for the next bf16 product): the op rounds
// its result itself (out_type 16: bf16). The norms' gradients read the
// widened bf16 dy as it is; their dx stays f32.
// CHECK-LABEL: func.func @rounded_results
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[R:.*]] = sd.rotary %arg0, %arg1, %arg2, %{{.*}} {out_type = 16 : i64, seq_axis = 1 : i64} : (tensor<2x8x4x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x8x4x16xbf16>
//       CHECK:   %[[N:.*]] = sd.rms_normalization %arg3, %arg4 {axis = -1 : i64, epsilon = 9.99999997E-7 : f32, out_type = 16 : i64} : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xbf16>
//       CHECK:   %[[L:.*]] = sd.layer_normalization %arg3, %arg4, %arg4 {axis = -1 : i64, out_type = 16 : i64} : (tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<16x32xbf16>
//       CHECK:   %[[DX:.*]], %{{.*}} = sd.rms_normalization_grad %arg5, %arg3, %arg4 {axis = -1 : i64} : (tensor<16x32xbf16>, tensor<16x32xf32>, tensor<32xf32>) -> (tensor<16x32xf32>, tensor<32xf32>)
//       CHECK:   %[[DL:.*]], %{{.*}}, %{{.*}} = sd.layer_normalization_grad %arg5, %arg3, %arg4 {axis = -1 : i64} : (tensor<16x32xbf16>, tensor<16x32xf32>, tensor<32xf32>) -> (tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>)
//       CHECK:   return %[[R]], %[[N]], %[[L]], %[[DX]], %[[DL]]
func.func @rounded_results(%q: tensor<2x8x4x16xf32>, %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>,
                           %x: tensor<16x32xf32>, %w: tensor<32xf32>, %dy: tensor<16x32xbf16>)
    -> (tensor<2x8x4x16xbf16>, tensor<16x32xbf16>, tensor<16x32xbf16>, tensor<16x32xf32>, tensor<16x32xf32>) {
  %none = sd.none
  %r = sd.rotary %q, %cos, %sin, %none {seq_axis = 1 : i64} : (tensor<2x8x4x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x8x4x16xf32>
  %rh = sd.cast %r {to = 16 : i64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xbf16>
  %n = sd.rms_normalization %x, %w {axis = -1 : i64, epsilon = 9.99999997E-7 : f32} : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
  %nh = sd.cast %n {to = 16 : i64} : (tensor<16x32xf32>) -> tensor<16x32xbf16>
  %l = sd.layer_normalization %x, %w, %w {axis = -1 : i64} : (tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
  %lh = sd.cast %l {to = 16 : i64} : (tensor<16x32xf32>) -> tensor<16x32xbf16>
  %dyw = sd.cast %dy {to = 1 : i64} : (tensor<16x32xbf16>) -> tensor<16x32xf32>
  %dx, %dw = sd.rms_normalization_grad %dyw, %x, %w {axis = -1 : i64} : (tensor<16x32xf32>, tensor<16x32xf32>, tensor<32xf32>) -> (tensor<16x32xf32>, tensor<32xf32>)
  %dl, %dlw, %dlb = sd.layer_normalization_grad %dyw, %x, %w {axis = -1 : i64} : (tensor<16x32xf32>, tensor<16x32xf32>, tensor<32xf32>) -> (tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>)
  return %rh, %nh, %lh, %dx, %dl : tensor<2x8x4x16xbf16>, tensor<16x32xbf16>, tensor<16x32xbf16>, tensor<16x32xf32>, tensor<16x32xf32>
}

// -----

// Kept: a normalized value an f32 op reads too.
// CHECK-LABEL: func.func @norm_kept
//   CHECK-NOT:   out_type
//       CHECK:   return
func.func @norm_kept(%x: tensor<16x32xf32>, %w: tensor<32xf32>) -> (tensor<16x32xbf16>, tensor<16x32xf32>) {
  %n = sd.rms_normalization %x, %w {axis = -1 : i64} : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
  %nh = sd.cast %n {to = 16 : i64} : (tensor<16x32xf32>) -> tensor<16x32xbf16>
  %e = sd.exp %n : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %nh, %e : tensor<16x32xbf16>, tensor<16x32xf32>
}

// -----

// Rotary's gradient on attention's widened bf16 dq, its f32 result read by
// f32 steps (LoRA's gradient sums): it reads the bf16 values and keeps the
// f32 result (out_type 1).
// CHECK-LABEL: func.func @rotary_f32_result
//   CHECK-NOT:   sd.cast
//       CHECK:   %[[Y:.*]] = sd.rotary %arg0, %arg1, %arg2, %{{.*}} {out_type = 1 : i64, seq_axis = 1 : i64, transposed = 1 : i64} : (tensor<2x8x4x16xbf16>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x8x4x16xf32>
//       CHECK:   sd.exp %[[Y]]
func.func @rotary_f32_result(%dq: tensor<2x8x4x16xbf16>, %cos: tensor<1x8x16xf32>, %sin: tensor<1x8x16xf32>) -> tensor<2x8x4x16xf32> {
  %none = sd.none
  %w = sd.cast %dq {to = 1 : i64} : (tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xf32>
  %r = sd.rotary %w, %cos, %sin, %none {seq_axis = 1 : i64, transposed = 1 : i64} : (tensor<2x8x4x16xf32>, tensor<1x8x16xf32>, tensor<1x8x16xf32>, none) -> tensor<2x8x4x16xf32>
  %e = sd.exp %r : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return %e : tensor<2x8x4x16xf32>
}
