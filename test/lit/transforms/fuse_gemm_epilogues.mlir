// RUN: sd-opt %s --split-input-file --sd-fuse-gemm-epilogues --sd-propagate-shapes | FileCheck %s
// RUN: sd-opt %s --split-input-file --sd-fuse-gemm-epilogues=half=false --sd-propagate-shapes | FileCheck %s --check-prefix=NOHALF

// Inference: Linear then Gelu become one sd.linear_gelu, with no `pre` result.
// CHECK-LABEL: func.func @linear_gelu
//       CHECK:   %[[NONE:.*]] = sd.none
//       CHECK:   %[[F:.*]] = sd.linear_gelu %arg0, %arg1, %arg2, %[[NONE]] {approximate = "tanh", layout = "io", module = "fc"} : (tensor<2x3x4xf32>, tensor<4x8xf32>, tensor<8xf32>, none) -> tensor<2x3x8xf32>
//   CHECK-NOT:   sd.linear
//   CHECK-NOT:   sd.gelu
//       CHECK:   return %[[F]]
func.func @linear_gelu(%x: tensor<2x3x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<2x3x8xf32>
    attributes {sd.entry = "infer"} {
  %p = sd.linear %x, %w, %b {layout = "io", module = "fc"} : (tensor<2x3x4xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  %g = sd.gelu %p {approximate = "tanh"} : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  return %g : tensor<2x3x8xf32>
}

// -----

// Training: the backward of Linear + GELU. The forward keeps the product for
// GeluGrad; the input gradient's Gemm, GeluGrad and the bias gradient's
// ReduceSum become one sd.gemm_dgelu over the flattened product.
// CHECK-LABEL: func.func @train
//       CHECK:   %[[OUT:.*]], %[[PRE:.*]] = sd.linear_gelu %arg0, %arg1, %arg2, %{{.*}} {layout = "oi", module = "fc"} : (tensor<2x3x4xf32>, tensor<8x4xf32>, tensor<8xf32>, none) -> (tensor<2x3x8xf32>, tensor<2x3x8xf32>)
//       CHECK:   %[[P:.*]] = sd.reshape %[[PRE]], %{{.*}} : (tensor<2x3x8xf32>, tensor<2xi64>) -> tensor<6x8xf32>
//       CHECK:   %[[DP:.*]], %[[DB:.*]] = sd.gemm_dgelu %arg3, %arg4, %[[P]], %{{.*}} {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, tensor<6x8xf32>, none) -> (tensor<6x8xf32>, tensor<8xf32>)
//   CHECK-NOT:   sd.gelu_grad
//   CHECK-NOT:   sd.reduce_sum
//       CHECK:   return %[[OUT]], %[[DP]], %[[DB]]
func.func @train(%x: tensor<2x3x4xf32>, %w: tensor<8x4xf32>, %b: tensor<8xf32>, %dz: tensor<6x5xf32>,
                 %w2: tensor<8x5xf32>) -> (tensor<2x3x8xf32>, tensor<6x8xf32>, tensor<8xf32>)
    attributes {sd.entry = "train_step"} {
  %p = sd.linear %x, %w, %b {layout = "oi", module = "fc"} : (tensor<2x3x4xf32>, tensor<8x4xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
  %g = sd.gelu %p : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %n = sd.none
  %dg = sd.gemm %dz, %w2, %n {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, none) -> tensor<6x8xf32>
  %s3 = sd.constant dense<[2, 3, 8]> : tensor<3xi64>
  %dg3 = sd.reshape %dg, %s3 : (tensor<6x8xf32>, tensor<3xi64>) -> tensor<2x3x8xf32>
  %dp = sd.gelu_grad %dg3, %p : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %s2 = sd.constant dense<[6, 8]> : tensor<2xi64>
  %dp2 = sd.reshape %dp, %s2 : (tensor<2x3x8xf32>, tensor<2xi64>) -> tensor<6x8xf32>
  %axes = sd.constant dense<0> : tensor<1xi64>
  %db = sd.reduce_sum %dp2, %axes {keepdims = 0 : i64} : (tensor<6x8xf32>, tensor<1xi64>) -> tensor<8xf32>
  return %g, %dp2, %db : tensor<2x3x8xf32>, tensor<6x8xf32>, tensor<8xf32>
}

// -----

// A product read by anything but the GELU and its gradient, a Gemm whose
// result has another reader, or a GELU of another approximation than its
// gradient's stay as they are.
// CHECK-LABEL: func.func @other_readers
//       CHECK:   sd.linear
//       CHECK:   sd.gelu
//       CHECK:   sd.gemm
//       CHECK:   sd.gelu_grad
//   CHECK-NOT:   sd.linear_gelu
//   CHECK-NOT:   sd.gemm_dgelu
func.func @other_readers(%x: tensor<6x4xf32>, %w: tensor<4x8xf32>, %dz: tensor<6x5xf32>, %w2: tensor<8x5xf32>)
    -> (tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>) attributes {sd.entry = "train_step"} {
  %n = sd.none
  %p = sd.linear %x, %w, %n {layout = "io", module = "fc"} : (tensor<6x4xf32>, tensor<4x8xf32>, none) -> tensor<6x8xf32>
  %g = sd.gelu %p : (tensor<6x8xf32>) -> tensor<6x8xf32>
  %dg = sd.gemm %dz, %w2, %n {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, none) -> tensor<6x8xf32>
  %dp = sd.gelu_grad %dg, %p {approximate = "tanh"} : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g, %p, %dp, %dg : tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>, tensor<6x8xf32>
}

// -----

// sd-accumulate-into-gemm's forms: a LinearAdd (LoRA's base layer summed onto
// the adapter's product) keeps its addend as LinearGelu's, and a Gemm
// accumulating onto a C of its shape (the input gradient's second product)
// passes its C to GemmDGelu.
// CHECK-LABEL: func.func @accumulated
//       CHECK:   %[[OUT:.*]], %[[PRE:.*]] = sd.linear_gelu %arg0, %arg1, %arg2, %arg3 {layout = "io", module = "fc"} : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<6x8xf32>) -> (tensor<6x8xf32>, tensor<6x8xf32>)
//       CHECK:   %[[DP:.*]] = sd.gemm_dgelu %arg4, %arg5, %[[PRE]], %arg6 {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
//   CHECK-NOT:   sd.gelu
//       CHECK:   return %[[OUT]], %[[DP]]
func.func @accumulated(%x: tensor<6x4xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>, %t: tensor<6x8xf32>,
                       %dz: tensor<6x5xf32>, %w2: tensor<8x5xf32>, %lora: tensor<6x8xf32>)
    -> (tensor<6x8xf32>, tensor<6x8xf32>) attributes {sd.entry = "train_step"} {
  %p = sd.linear_add %x, %w, %b, %t {layout = "io", module = "fc"} : (tensor<6x4xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %g = sd.gelu %p : (tensor<6x8xf32>) -> tensor<6x8xf32>
  %dg = sd.gemm %dz, %w2, %lora {beta = 1.0 : f32, transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %dp = sd.gelu_grad %dg, %p : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g, %dp : tensor<6x8xf32>, tensor<6x8xf32>
}

// -----

// A Gemm whose C is scaled (beta 0.5) or broadcast (a bias row) is no
// accumulation GemmDGelu takes: it stays.
// CHECK-LABEL: func.func @other_c
//   CHECK-NOT:   sd.gemm_dgelu
//       CHECK:   return
func.func @other_c(%p: tensor<6x8xf32>, %dz: tensor<6x5xf32>, %w2: tensor<8x5xf32>, %c: tensor<6x8xf32>,
                   %row: tensor<8xf32>) -> (tensor<6x8xf32>, tensor<6x8xf32>) attributes {sd.entry = "train_step"} {
  %d1 = sd.gemm %dz, %w2, %c {beta = 0.5 : f32, transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %g1 = sd.gelu_grad %d1, %p : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %d2 = sd.gemm %dz, %w2, %row {transB = 1 : i64} : (tensor<6x5xf32>, tensor<8x5xf32>, tensor<8xf32>) -> tensor<6x8xf32>
  %g2 = sd.gelu_grad %d2, %p : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  return %g1, %g2 : tensor<6x8xf32>, tensor<6x8xf32>
}

// -----

// An autocast (bf16) plan: the GELU and its gradient run in f32 between
// casts of the bf16 product and gradient. They fuse into bf16 steps that
// read the GEMM's f32 accumulator (no cast left); the bias gradient's
// ReduceSum over the rounded gradient is taken in. With half=false they stay.
// CHECK-LABEL: func.func @autocast
//       CHECK:   %[[OUT:.*]], %[[PRE:.*]] = sd.linear_gelu %arg0, %arg1, %arg2, %{{.*}} {approximate = "tanh", layout = "oi", module = "fc"} : (tensor<2x3x4xbf16>, tensor<8x4xbf16>, tensor<8xbf16>, none) -> (tensor<2x3x8xbf16>, tensor<2x3x8xbf16>)
//       CHECK:   %[[P:.*]] = sd.reshape %[[PRE]], %{{.*}} : (tensor<2x3x8xbf16>, tensor<2xi64>) -> tensor<6x8xbf16>
//       CHECK:   %[[DP:.*]], %[[DB:.*]] = sd.gemm_dgelu %arg3, %arg4, %[[P]], %arg5 {approximate = "tanh", transB = 1 : i64} : (tensor<6x5xbf16>, tensor<8x5xbf16>, tensor<6x8xbf16>, tensor<6x8xbf16>) -> (tensor<6x8xbf16>, tensor<8xbf16>)
//   CHECK-NOT:   sd.cast
//   CHECK-NOT:   sd.gelu
//       CHECK:   return %[[OUT]], %[[DP]], %[[DB]]
// NOHALF-LABEL: func.func @autocast
//   NOHALF-NOT:   sd.linear_gelu
//   NOHALF-NOT:   sd.gemm_dgelu
//       NOHALF:   return
func.func @autocast(%x: tensor<2x3x4xbf16>, %w: tensor<8x4xbf16>, %b: tensor<8xbf16>, %dz: tensor<6x5xbf16>,
                    %w2: tensor<8x5xbf16>, %lora: tensor<6x8xbf16>)
    -> (tensor<2x3x8xbf16>, tensor<6x8xbf16>, tensor<8xbf16>) attributes {sd.entry = "train_step"} {
  %p = sd.linear %x, %w, %b {layout = "oi", module = "fc"} : (tensor<2x3x4xbf16>, tensor<8x4xbf16>, tensor<8xbf16>) -> tensor<2x3x8xbf16>
  %p32 = sd.cast %p {to = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x3x8xf32>
  %g32 = sd.gelu %p32 {approximate = "tanh"} : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %g = sd.cast %g32 {to = 16 : i64} : (tensor<2x3x8xf32>) -> tensor<2x3x8xbf16>
  %dg = sd.gemm %dz, %w2, %lora {beta = 1.0 : f32, transB = 1 : i64} : (tensor<6x5xbf16>, tensor<8x5xbf16>, tensor<6x8xbf16>) -> tensor<6x8xbf16>
  %s3 = sd.constant dense<[2, 3, 8]> : tensor<3xi64>
  %dg3 = sd.reshape %dg, %s3 : (tensor<6x8xbf16>, tensor<3xi64>) -> tensor<2x3x8xbf16>
  %dg32 = sd.cast %dg3 {to = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x3x8xf32>
  %dp32 = sd.gelu_grad %dg32, %p32 {approximate = "tanh"} : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %dp = sd.cast %dp32 {to = 16 : i64} : (tensor<2x3x8xf32>) -> tensor<2x3x8xbf16>
  %s2 = sd.constant dense<[6, 8]> : tensor<2xi64>
  %dp2 = sd.reshape %dp, %s2 : (tensor<2x3x8xbf16>, tensor<2xi64>) -> tensor<6x8xbf16>
  %axes = sd.constant dense<0> : tensor<1xi64>
  %db = sd.reduce_sum %dp2, %axes {keepdims = 0 : i64} : (tensor<6x8xbf16>, tensor<1xi64>) -> tensor<8xbf16>
  return %g, %dp2, %db : tensor<2x3x8xbf16>, tensor<6x8xbf16>, tensor<8xbf16>
}

// -----

// A bf16 GELU whose f32 result is read as it is (not rounded back), or whose
// gradient's widened input has another reader, stays.
// CHECK-LABEL: func.func @autocast_other_readers
//   CHECK-NOT:   sd.linear_gelu
//   CHECK-NOT:   sd.gemm_dgelu
//       CHECK:   return
func.func @autocast_other_readers(%x: tensor<6x4xbf16>, %w: tensor<4x8xbf16>, %dz: tensor<6x5xbf16>,
                                  %w2: tensor<8x5xbf16>, %p: tensor<6x8xbf16>)
    -> (tensor<6x8xf32>, tensor<6x8xbf16>, tensor<6x8xf32>) attributes {sd.entry = "train_step"} {
  %n = sd.none
  %y = sd.linear %x, %w, %n {layout = "io", module = "fc"} : (tensor<6x4xbf16>, tensor<4x8xbf16>, none) -> tensor<6x8xbf16>
  %y32 = sd.cast %y {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %g32 = sd.gelu %y32 : (tensor<6x8xf32>) -> tensor<6x8xf32>
  %dg = sd.gemm %dz, %w2, %n {transB = 1 : i64} : (tensor<6x5xbf16>, tensor<8x5xbf16>, none) -> tensor<6x8xbf16>
  %dg32 = sd.cast %dg {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %p32 = sd.cast %p {to = 1 : i64} : (tensor<6x8xbf16>) -> tensor<6x8xf32>
  %dp32 = sd.gelu_grad %dg32, %p32 : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %dp = sd.cast %dp32 {to = 16 : i64} : (tensor<6x8xf32>) -> tensor<6x8xbf16>
  return %g32, %dp, %dg32 : tensor<6x8xf32>, tensor<6x8xbf16>, tensor<6x8xf32>
}

// -----

// An exporter that flattens the layer's input (Hugging Face's GPT-2 Conv1D)
// reshapes the product back before the GELU: the fused step computes on the
// flat rows and its results are reshaped for the GELU's readers; in a half
// plan GeluGrad's widened product reads the reshaped `pre`.
// CHECK-LABEL: func.func @reshaped
//       CHECK:   %[[OUT:.*]], %[[PRE:.*]] = sd.linear_gelu %arg0, %arg1, %arg2, %{{.*}} {approximate = "tanh", layout = "io", module = "c_fc"} : (tensor<6x4xbf16>, tensor<4x8xbf16>, tensor<8xbf16>, none) -> (tensor<6x8xbf16>, tensor<6x8xbf16>)
//   CHECK-DAG:   %[[Y:.*]] = sd.reshape %[[OUT]], %{{.*}} : (tensor<6x8xbf16>, tensor<3xi64>) -> tensor<2x3x8xbf16>
//   CHECK-DAG:   %[[P:.*]] = sd.reshape %[[PRE]], %{{.*}} : (tensor<6x8xbf16>, tensor<3xi64>) -> tensor<2x3x8xbf16>
//       CHECK:   %[[W:.*]] = sd.cast %[[P]] {to = 1 : i64}
//       CHECK:   sd.gelu_grad %{{.*}}, %[[W]]
//   CHECK-NOT:   sd.gelu %
//       CHECK:   return %[[Y]]
func.func @reshaped(%x: tensor<6x4xbf16>, %w: tensor<4x8xbf16>, %b: tensor<8xbf16>, %dy: tensor<2x3x8xf32>)
    -> (tensor<2x3x8xbf16>, tensor<2x3x8xf32>) attributes {sd.entry = "train_step"} {
  %p = sd.linear %x, %w, %b {layout = "io", module = "c_fc"} : (tensor<6x4xbf16>, tensor<4x8xbf16>, tensor<8xbf16>) -> tensor<6x8xbf16>
  %s3 = sd.constant dense<[2, 3, 8]> : tensor<3xi64>
  %p3 = sd.reshape %p, %s3 : (tensor<6x8xbf16>, tensor<3xi64>) -> tensor<2x3x8xbf16>
  %p32 = sd.cast %p3 {to = 1 : i64} : (tensor<2x3x8xbf16>) -> tensor<2x3x8xf32>
  %g32 = sd.gelu %p32 {approximate = "tanh"} : (tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  %g = sd.cast %g32 {to = 16 : i64} : (tensor<2x3x8xf32>) -> tensor<2x3x8xbf16>
  %dp = sd.gelu_grad %dy, %p32 {approximate = "tanh"} : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
  return %g, %dp : tensor<2x3x8xbf16>, tensor<2x3x8xf32>
}
