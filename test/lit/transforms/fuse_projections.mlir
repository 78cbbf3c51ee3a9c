// RUN: sd-opt %s --sd-fuse-projections | FileCheck %s

// q/k/v on one input, [in, out] weights with data: one linear over the
// weights side by side per row ([4, 2+2+1]), split back; the three globals go.
//   CHECK-NOT:   sd.global @q.weight
//       CHECK:   sd.global @"fused:q+k+v.weight" "frozen" : tensor<4x5xf32> = dense_resource<fused:q+k+v.weight>
//   CHECK-NOT:   sd.global @v.weight
//       CHECK:   func.func @infer
//       CHECK:     %[[W:.*]] = sd.global_load @"fused:q+k+v.weight"
//       CHECK:     %[[Y:.*]] = sd.linear %arg0, %[[W]], %{{.*}} {layout = "io", module = "q+k+v"} : (tensor<3x4xf32>, tensor<4x5xf32>, none) -> tensor<3x5xf32>
//       CHECK:     %[[S:.*]]:3 = sd.split %[[Y]], %{{.*}} {axis = 1 : i64}
//       CHECK:     return %[[S]]#0, %[[S]]#1, %[[S]]#2
//       CHECK:   func.func @decode
//       CHECK:     sd.global_load @"fused:q+k+v.weight"
// Rows of [q | k | v]: 0 1 2 3 4 three times, then 0 1 2 3 5.
// CHECK: fused:q+k+v.weight: "0x04000000000000000000803F000000400000404000008040000000000000803F000000400000404000008040000000000000803F000000400000404000008040000000000000803F00000040000040400000A040"
module {
  sd.global @q.weight "frozen" : tensor<4x2xf32> = dense<[[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]> : tensor<4x2xf32>
  sd.global @k.weight "frozen" : tensor<4x2xf32> = dense<[[2.0, 3.0], [2.0, 3.0], [2.0, 3.0], [2.0, 3.0]]> : tensor<4x2xf32>
  sd.global @v.weight "frozen" : tensor<4x1xf32> = dense<[[4.0], [4.0], [4.0], [5.0]]> : tensor<4x1xf32>
  func.func @infer(%x: tensor<3x4xf32>) -> (tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x1xf32>) attributes {sd.entry = "infer"} {
    %wq = sd.global_load @q.weight : tensor<4x2xf32>
    %wk = sd.global_load @k.weight : tensor<4x2xf32>
    %wv = sd.global_load @v.weight : tensor<4x1xf32>
    %none = sd.none
    %q = sd.linear %x, %wq, %none {layout = "io", module = "q"} : (tensor<3x4xf32>, tensor<4x2xf32>, none) -> tensor<3x2xf32>
    %k = sd.linear %x, %wk, %none {layout = "io", module = "k"} : (tensor<3x4xf32>, tensor<4x2xf32>, none) -> tensor<3x2xf32>
    %v = sd.linear %x, %wv, %none {layout = "io", module = "v"} : (tensor<3x4xf32>, tensor<4x1xf32>, none) -> tensor<3x1xf32>
    return %q, %k, %v : tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x1xf32>
  }
  func.func @decode(%x: tensor<1x4xf32>) -> (tensor<1x2xf32>, tensor<1x2xf32>, tensor<1x1xf32>) attributes {sd.entry = "decode"} {
    %wq = sd.global_load @q.weight : tensor<4x2xf32>
    %wk = sd.global_load @k.weight : tensor<4x2xf32>
    %wv = sd.global_load @v.weight : tensor<4x1xf32>
    %none = sd.none
    %q = sd.linear %x, %wq, %none {layout = "io", module = "q"} : (tensor<1x4xf32>, tensor<4x2xf32>, none) -> tensor<1x2xf32>
    %k = sd.linear %x, %wk, %none {layout = "io", module = "k"} : (tensor<1x4xf32>, tensor<4x2xf32>, none) -> tensor<1x2xf32>
    %v = sd.linear %x, %wv, %none {layout = "io", module = "v"} : (tensor<1x4xf32>, tensor<4x1xf32>, none) -> tensor<1x1xf32>
    return %q, %k, %v : tensor<1x2xf32>, tensor<1x2xf32>, tensor<1x1xf32>
  }
}
