// RUN: sd-opt %s --sd-bufferize | FileCheck %s

// A Transpose that moves only axes of size 1 keeps every element where it
// was (a decode step's query [B, 1, H, d] as [B, H, 1, d]): a view, no step.
// One that moves a longer axis past another is a step.
// CHECK-LABEL: func.func @infer()
//       CHECK:   %[[X:.*]] = sd.buffer {input = "x"} : memref<2x1x4x8xf32>
//       CHECK:   %[[V:.*]] = sd.view %[[X]] : memref<2x1x4x8xf32> to memref<2x4x1x8xf32>
//       CHECK:   sd.step "Transpose" {perm = array<i64: 0, 2, 3, 1>} ins(%[[V]] : memref<2x4x1x8xf32>)
//       CHECK:   sd.output "y", %[[V]] : memref<2x4x1x8xf32>
func.func @infer(%x: tensor<2x1x4x8xf32> {sd.name = "x"}) -> (tensor<2x4x1x8xf32>, tensor<2x1x8x4xf32>)
    attributes {sd.entry = "infer", sd.output_names = ["y", "z"]} {
  %y = sd.transpose %x {perm = array<i64: 0, 2, 1, 3>} : (tensor<2x1x4x8xf32>) -> tensor<2x4x1x8xf32>
  %z = sd.transpose %y {perm = array<i64: 0, 2, 3, 1>} : (tensor<2x4x1x8xf32>) -> tensor<2x1x8x4xf32>
  return %y, %z : tensor<2x4x1x8xf32>, tensor<2x1x8x4xf32>
}
