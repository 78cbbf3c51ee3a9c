// RUN: sd-opt %s --sd-bufferize | FileCheck %s

// Compute ops become steps writing fresh buffers; reshape becomes a view;
// constants become constant-role globals; weights are global buffers.
// CHECK: sd.global @__constant_0 "constant" : tensor<2xi64> = dense<[3, 2]>
// CHECK-LABEL: func.func @infer()
//  CHECK-SAME:   sd.input_names = ["x"]
//       CHECK:   %[[X:.*]] = sd.buffer {input = "x"} : memref<2x3xf32>
//       CHECK:   %[[W:.*]] = sd.global_buffer @w : memref<3xf32>
//       CHECK:   %[[T:.*]] = sd.buffer : memref<2x3xf32>
//       CHECK:   sd.step "Mul" {} ins(%[[X]], %[[W]] : memref<2x3xf32>, memref<3xf32>) outs(%[[T]] : memref<2x3xf32>)
//       CHECK:   %[[V:.*]] = sd.view %[[T]] : memref<2x3xf32> to memref<3x2xf32>
//       CHECK:   sd.output "y", %[[V]] : memref<3x2xf32>
sd.global @w "frozen" : tensor<3xf32> = dense<2.0> : tensor<3xf32>
func.func @infer(%x: tensor<2x3xf32> {sd.name = "x"}) -> tensor<3x2xf32>
    attributes {sd.entry = "infer", sd.output_names = ["y"]} {
  %w = sd.global_load @w : tensor<3xf32>
  %t = sd.mul %x, %w : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
  %s = sd.constant dense<[3, 2]> : tensor<2xi64>
  %y = sd.reshape %t, %s : (tensor<2x3xf32>, tensor<2xi64>) -> tensor<3x2xf32>
  return %y : tensor<3x2xf32>
}
