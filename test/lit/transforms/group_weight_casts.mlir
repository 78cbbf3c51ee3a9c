// RUN: sd-opt %s --sd-group-weight-casts | FileCheck %s

// The bf16 casts of small loaded weights (a and b; a cast twice) become one
// grouped_cast at the entry's start, each use reading its result; f16 casts
// group apart. Kept: a weight of more than 65536 elements, a cast after a
// store to its global (the value at the start is not the one it reads), a
// saturating cast, a cast of a value that is no global load.
// CHECK-LABEL: func.func @step
// CHECK-NEXT:  %[[A:.*]] = sd.global_load @a : tensor<8x4xf32>
// CHECK-NEXT:  %[[B:.*]] = sd.global_load @b : tensor<4x8xf32>
// CHECK-NEXT:  %[[G:.*]]:2 = sd.grouped_cast %[[A]], %[[B]] {to = 16 : i64} : (tensor<8x4xf32>, tensor<4x8xf32>) -> (tensor<8x4xbf16>, tensor<4x8xbf16>)
// CHECK-NEXT:  %[[C:.*]] = sd.global_load @c : tensor<3xf32>
// CHECK-NEXT:  %[[D:.*]] = sd.global_load @d : tensor<5xf32>
// CHECK-NEXT:  %[[H:.*]]:2 = sd.grouped_cast %[[C]], %[[D]] {to = 10 : i64}
// CHECK:       sd.matmul %{{.*}}, %[[G]]#0
// CHECK:       sd.matmul %{{.*}}, %[[G]]#1
// CHECK:       sd.add %[[G]]#0, %[[G]]#0
// CHECK:       sd.cast %{{.*}} {to = 16 : i64} : (tensor<300x300xf32>)
// CHECK:       sd.global_store
// CHECK:       sd.cast %{{.*}} {to = 16 : i64} : (tensor<2x2xf32>)
// CHECK:       sd.cast %{{.*}} {saturate = 1 : i64, to = 16 : i64}
// CHECK:       sd.cast %arg1 {to = 16 : i64}
// CHECK:       return %[[H]]#0, %[[H]]#1
module {
  sd.global @a "trainable" : tensor<8x4xf32>
  sd.global @b "trainable" : tensor<4x8xf32>
  sd.global @c "trainable" : tensor<3xf32>
  sd.global @d "trainable" : tensor<5xf32>
  sd.global @big "trainable" : tensor<300x300xf32>
  sd.global @e "trainable" : tensor<2x2xf32>
  sd.global @f "trainable" : tensor<2x2xf32>
  func.func @step(%x: tensor<2x8xbf16>, %y: tensor<2x2xf32>) -> (tensor<3xf16>, tensor<5xf16>)
      attributes {sd.entry = "train_step", sd.bucket = {}} {
    %a = sd.global_load @a : tensor<8x4xf32>
    %a16 = sd.cast %a {to = 16 : i64} : (tensor<8x4xf32>) -> tensor<8x4xbf16>
    %xa = sd.matmul %x, %a16 : (tensor<2x8xbf16>, tensor<8x4xbf16>) -> tensor<2x4xbf16>
    %b = sd.global_load @b : tensor<4x8xf32>
    %b16 = sd.cast %b {to = 16 : i64} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
    %xab = sd.matmul %xa, %b16 : (tensor<2x4xbf16>, tensor<4x8xbf16>) -> tensor<2x8xbf16>
    %a2 = sd.global_load @a : tensor<8x4xf32>
    %a216 = sd.cast %a2 {to = 16 : i64} : (tensor<8x4xf32>) -> tensor<8x4xbf16>
    %aa = sd.add %a16, %a216 : (tensor<8x4xbf16>, tensor<8x4xbf16>) -> tensor<8x4xbf16>
    %big = sd.global_load @big : tensor<300x300xf32>
    %big16 = sd.cast %big {to = 16 : i64} : (tensor<300x300xf32>) -> tensor<300x300xbf16>
    sd.global_store %y, @e : tensor<2x2xf32>
    %e = sd.global_load @e : tensor<2x2xf32>
    %e16 = sd.cast %e {to = 16 : i64} : (tensor<2x2xf32>) -> tensor<2x2xbf16>
    %f = sd.global_load @f : tensor<2x2xf32>
    %f16 = sd.cast %f {to = 16 : i64, saturate = 1 : i64} : (tensor<2x2xf32>) -> tensor<2x2xbf16>
    %y16 = sd.cast %y {to = 16 : i64} : (tensor<2x2xf32>) -> tensor<2x2xbf16>
    %c = sd.global_load @c : tensor<3xf32>
    %c16 = sd.cast %c {to = 10 : i64} : (tensor<3xf32>) -> tensor<3xf16>
    %d = sd.global_load @d : tensor<5xf32>
    %d16 = sd.cast %d {to = 10 : i64} : (tensor<5xf32>) -> tensor<5xf16>
    return %c16, %d16 : tensor<3xf16>, tensor<5xf16>
  }
}
