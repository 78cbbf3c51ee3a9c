// RUN: sd-opt %s --sd-autocast | FileCheck %s

// A frozen weight is cast once, at compile time: its bf16 copy becomes a
// frozen global of its own (rounded to nearest even: 3.00390625 -> 0x4040),
// loaded where the f32 one was, and the f32 global goes, as nothing else
// reads it. A trainable weight changes at run time, so it keeps its Cast.
// CHECK-NOT:   sd.global @w "frozen"
// CHECK:       sd.global @v "trainable" : tensor<3xf32>
// CHECK:       sd.global @w.bf16 "frozen" : tensor<4x3xbf16> = dense_resource<w.bf16>
// CHECK-LABEL: func.func @frozen
// CHECK:       %[[V:.*]] = sd.global_load @v : tensor<3xf32>
// CHECK:       %[[X:.*]] = sd.cast %arg0 {to = 16 : i64}
// CHECK:       %[[W:.*]] = sd.global_load @w.bf16 : tensor<4x3xbf16>
// CHECK:       %[[B:.*]] = sd.cast %[[V]] {to = 16 : i64}
// CHECK:       sd.linear %[[X]], %[[W]], %[[B]]
// CHECK:       w.bf16: "0x02000000803F004040408040A040C040E04000411041C03F20404040"
sd.global @w "frozen" : tensor<4x3xf32> = dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.5, 2.5, 3.00390625]]> : tensor<4x3xf32>
sd.global @v "trainable" : tensor<3xf32> = dense<[0.5, 0.25, 0.125]> : tensor<3xf32>
func.func @frozen(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
  %w = sd.global_load @w : tensor<4x3xf32>
  %v = sd.global_load @v : tensor<3xf32>
  %y = sd.linear %x, %w, %v {layout = "io", module = "fc"} : (tensor<2x4xf32>, tensor<4x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}
