// RUN: sd-opt %s | sd-opt | FileCheck %s

// CHECK: sd.global @w "trainable" : tensor<2x2xf32> = dense<1.000000e+00> : tensor<2x2xf32>
sd.global @w "trainable" : tensor<2x2xf32> = dense<1.0> : tensor<2x2xf32>
// CHECK-LABEL: func.func @ops
func.func @ops(%x: tensor<2x2xf32>) -> tensor<2x2xf32> {
  // CHECK: sd.global_load @w : tensor<2x2xf32>
  %w = sd.global_load @w : tensor<2x2xf32>
  // CHECK: sd.constant dense<[0, 1]> : tensor<2xi64>
  %c = sd.constant dense<[0, 1]> : tensor<2xi64>
  // CHECK: sd.linear {{.*}} {layout = "io", module = "m"} : (tensor<2x2xf32>, tensor<2x2xf32>, none) -> tensor<2x2xf32>
  %n = sd.none
  %y = sd.linear %x, %w, %n {layout = "io", module = "m"} : (tensor<2x2xf32>, tensor<2x2xf32>, none) -> tensor<2x2xf32>
  // CHECK: sd.global_store %{{.*}}, @w : tensor<2x2xf32>
  sd.global_store %y, @w : tensor<2x2xf32>
  return %y : tensor<2x2xf32>
}
