// RUN: sd-opt %s --split-input-file --sd-fold-cast-round-trips --sd-propagate-shapes | FileCheck %s

// A bf16 product widened for f32 ops and narrowed again for the next product:
// the next product reads the bf16 value; the f32 copy stays for its other reader.
// CHECK-LABEL: func.func @round_trip
//       CHECK:   %[[W:.*]] = sd.cast %arg0 {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
//   CHECK-NOT:   sd.cast
//       CHECK:   return %[[W]], %arg0
func.func @round_trip(%x: tensor<4xbf16>) -> (tensor<4xf32>, tensor<4xbf16>) attributes {sd.entry = "infer"} {
  %w = sd.cast %x {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %n = sd.cast %w {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  return %w, %n : tensor<4xf32>, tensor<4xbf16>
}

// -----

// Narrowing first is not exact (f32 -> bf16 -> f32 rounds), nor is f32 through f16.
// CHECK-LABEL: func.func @not_exact
//       CHECK:   sd.cast %arg0 {to = 16 : i64}
//       CHECK:   sd.cast %{{.*}} {to = 1 : i64}
//       CHECK:   sd.cast %arg1 {to = 10 : i64}
//       CHECK:   sd.cast %{{.*}} {to = 16 : i64}
func.func @not_exact(%x: tensor<4xf32>, %y: tensor<4xbf16>) -> (tensor<4xf32>, tensor<4xbf16>) attributes {sd.entry = "infer"} {
  %n = sd.cast %x {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %w = sd.cast %n {to = 1 : i64} : (tensor<4xbf16>) -> tensor<4xf32>
  %h = sd.cast %y {to = 10 : i64} : (tensor<4xbf16>) -> tensor<4xf16>
  %b = sd.cast %h {to = 16 : i64} : (tensor<4xf16>) -> tensor<4xbf16>
  return %w, %b : tensor<4xf32>, tensor<4xbf16>
}

// -----

// One f32 value cast to bf16 twice (autocast's base product and lora_A): one cast.
// CHECK-LABEL: func.func @repeated
//       CHECK:   %[[C:.*]] = sd.cast %arg0 {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
//   CHECK-NOT:   sd.cast %arg0 {to = 16 : i64}
//       CHECK:   %[[H:.*]] = sd.cast %arg0 {to = 10 : i64}
//       CHECK:   return %[[C]], %[[C]], %[[H]]
func.func @repeated(%x: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xbf16>, tensor<4xf16>) attributes {sd.entry = "infer"} {
  %a = sd.cast %x {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %b = sd.cast %x {to = 16 : i64} : (tensor<4xf32>) -> tensor<4xbf16>
  %h = sd.cast %x {to = 10 : i64} : (tensor<4xf32>) -> tensor<4xf16>
  return %a, %b, %h : tensor<4xbf16>, tensor<4xbf16>, tensor<4xf16>
}
