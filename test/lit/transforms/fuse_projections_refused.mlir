// RUN: sd-opt %s --sd-fuse-projections | FileCheck %s

// Not fused: a weight with another use (here a second product on another
// input), trainable weights (full fine-tuning updates them in place), and
// splat weights (no data to concatenate).
//   CHECK-NOT:   fused
//       CHECK:   sd.global @gate.weight
//       CHECK:   sd.global @up.weight
//       CHECK:   sd.global @c.weight
//       CHECK:   sd.global @d.weight
//   CHECK-NOT:   sd.split
module {
  sd.global @gate.weight "frozen" : tensor<2x4xf32> = dense<1.0> : tensor<2x4xf32>
  sd.global @up.weight "frozen" : tensor<2x4xf32> = dense<2.0> : tensor<2x4xf32>
  sd.global @a.weight "trainable" : tensor<2x4xf32> = dense<3.0> : tensor<2x4xf32>
  sd.global @b.weight "trainable" : tensor<2x4xf32> = dense<4.0> : tensor<2x4xf32>
  sd.global @c.weight "frozen" : tensor<2x4xf32> = dense<5.0> : tensor<2x4xf32>
  sd.global @d.weight "frozen" : tensor<2x4xf32> = dense<6.0> : tensor<2x4xf32>
  func.func @infer(%x: tensor<3x4xf32>, %z: tensor<3x4xf32>, %s: tensor<3x4xf32>) -> (tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>) attributes {sd.entry = "infer"} {
    %wg = sd.global_load @gate.weight : tensor<2x4xf32>
    %wu = sd.global_load @up.weight : tensor<2x4xf32>
    %wa = sd.global_load @a.weight : tensor<2x4xf32>
    %wb = sd.global_load @b.weight : tensor<2x4xf32>
    %none = sd.none
    %g = sd.linear %x, %wg, %none {layout = "oi", module = "gate"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %u = sd.linear %x, %wu, %none {layout = "oi", module = "up"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %g2 = sd.linear %z, %wg, %none {layout = "oi", module = "gate"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %a = sd.linear %z, %wa, %none {layout = "oi", module = "a"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %b = sd.linear %x, %wb, %none {layout = "oi", module = "b"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %wc = sd.global_load @c.weight : tensor<2x4xf32>
    %wd = sd.global_load @d.weight : tensor<2x4xf32>
    %c = sd.linear %s, %wc, %none {layout = "oi", module = "c"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    %d = sd.linear %s, %wd, %none {layout = "oi", module = "d"} : (tensor<3x4xf32>, tensor<2x4xf32>, none) -> tensor<3x2xf32>
    return %g, %u, %g2, %a, %b, %c, %d : tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xf32>
  }
}
