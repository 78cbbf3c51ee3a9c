// RUN: sd-opt %s --sd-propagate-shapes | FileCheck %s

// Shape of a static tensor folds to a constant, the shape arithmetic folds
// through it, and Reshape gets a static result.
// CHECK-LABEL: func.func @shape_arithmetic_folds
//   CHECK-NOT:   sd.shape
//   CHECK-NOT:   sd.concat
//       CHECK:   %[[S:.*]] = sd.constant dense<[2, -1]> : tensor<2xi64>
//       CHECK:   sd.reshape %{{.*}}, %[[S]] : (tensor<2x3x4xf32>, tensor<2xi64>) -> tensor<2x12xf32>
//       CHECK:   return {{.*}} : tensor<2x12xf32>
func.func @shape_arithmetic_folds(%x: tensor<2x3x4xf32>) -> tensor<?x?xf32> {
  %s = sd.shape %x : (tensor<2x3x4xf32>) -> tensor<3xi64>
  %i = sd.constant dense<0> : tensor<1xi64>
  %d0 = sd.gather %s, %i : (tensor<3xi64>, tensor<1xi64>) -> tensor<1xi64>
  %m = sd.constant dense<-1> : tensor<1xi64>
  %shape = sd.concat %d0, %m {axis = 0 : i64} : (tensor<1xi64>, tensor<1xi64>) -> tensor<2xi64>
  %y = sd.reshape %x, %shape : (tensor<2x3x4xf32>, tensor<2xi64>) -> tensor<?x?xf32>
  return %y : tensor<?x?xf32>
}

// Dynamic results are refined from static operands.
// CHECK-LABEL: func.func @refines_dynamic_results
//       CHECK:   sd.matmul {{.*}} -> tensor<2x5xf32>
//       CHECK:   sd.relu {{.*}} -> tensor<2x5xf32>
func.func @refines_dynamic_results(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>) -> tensor<?x?xf32> {
  %c = sd.matmul %a, %b : (tensor<2x3xf32>, tensor<3x5xf32>) -> tensor<?x?xf32>
  %r = sd.relu %c : (tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
