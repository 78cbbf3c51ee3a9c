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

// A Cast to its own type is its input (no copy step, nothing to
// differentiate), unless it is what the function returns.
// CHECK-LABEL: func.func @identity_cast
//       CHECK:   %[[R:.*]] = sd.relu %arg0
//   CHECK-NOT:   sd.cast %[[R]]
//       CHECK:   %[[N:.*]] = sd.neg %[[R]]
//       CHECK:   %[[C:.*]] = sd.cast %[[N]] {to = 1 : i64}
//       CHECK:   return %[[C]]
func.func @identity_cast(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = sd.relu %x : (tensor<4xf32>) -> tensor<4xf32>
  %c = sd.cast %r {to = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  %n = sd.neg %c : (tensor<4xf32>) -> tensor<4xf32>
  %o = sd.cast %n {to = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
  return %o : tensor<4xf32>
}
