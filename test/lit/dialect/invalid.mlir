// RUN: sd-opt %s --split-input-file --verify-diagnostics

func.func @matmul_inner_dims_differ(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) -> tensor<2x5xf32> {
  // expected-error @+1 {{MatMul inner dimensions differ: 2x3 x 4x5}}
  %c = sd.matmul %a, %b : (tensor<2x3xf32>, tensor<4x5xf32>) -> tensor<2x5xf32>
  return %c : tensor<2x5xf32>
}

// -----

func.func @result_shape_contradicts_rule(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{result 0 has shape 2x4, expected 2x3}}
  %c = sd.add %a, %b : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x4xf32>
  return %c : tensor<2x4xf32>
}

// -----

func.func @result_type_contradicts_rule(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{result 0 has element type f32, expected bool}}
  %c = sd.less %a, %b : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  return %c : tensor<2xf32>
}

// -----

func.func @bad_axis(%a: tensor<2x3xf32>) -> tensor<2x3xf32> {
  // expected-error @+1 {{axis 5 out of range for rank 2}}
  %c = sd.softmax %a {axis = 5 : i64} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  return %c : tensor<2x3xf32>
}

// -----

func.func @missing_required_operand(%a: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %n = sd.none
  // expected-error @+1 {{operand #1 must be tensor of any type values, but got 'none'}}
  %c:3 = sd.layer_normalization %a, %n, %n : (tensor<2x3xf32>, none, none) -> (tensor<2x3xf32>, tensor<2x1xf32>, tensor<2x1xf32>)
  return %c#0 : tensor<2x3xf32>
}

// -----

// expected-error @+1 {{unknown role 'mutable'}}
sd.global @w "mutable" : tensor<2xf32>

// -----

sd.global @w "frozen" : tensor<2xf32>
func.func @load_type_mismatch() -> tensor<3xf32> {
  // expected-error @+1 {{type 'tensor<3xf32>' differs from global @w type 'tensor<2xf32>'}}
  %w = sd.global_load @w : tensor<3xf32>
  return %w : tensor<3xf32>
}

// -----

sd.global @w "frozen" : tensor<2xf32>
func.func @store_to_frozen(%v: tensor<2xf32>) {
  // expected-error @+1 {{cannot write frozen global @w}}
  sd.global_store %v, @w : tensor<2xf32>
  return
}

// -----

func.func @view_changes_size(%b: memref<2x3xf32>) {
  // expected-error @+1 {{changes the element count from 6 to 4}}
  %v = sd.view %b : memref<2x3xf32> to memref<4xf32>
  return
}

// -----

func.func @unknown_pad_mode(%x: tensor<4xf32>, %p: tensor<2xi64>) -> tensor<6xf32> {
  %n = sd.none
  // expected-error @+1 {{mode 'mirror' is not one of constant, reflect, edge, wrap}}
  %y = sd.pad %x, %p, %n, %n {mode = "mirror"} : (tensor<4xf32>, tensor<2xi64>, none, none) -> tensor<6xf32>
  return %y : tensor<6xf32>
}
