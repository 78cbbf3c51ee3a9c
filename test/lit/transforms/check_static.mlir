// RUN: sd-opt %s --sd-check-static --verify-diagnostics --split-input-file

func.func @dynamic_dim_is_an_error(%x: tensor<2x?xf32>) -> tensor<2x?xf32> attributes {sd.entry = "infer"} {
  // expected-error @+1 {{result 0 has dynamic shape 2x? after specialization}}
  %y = sd.relu %x : (tensor<2x?xf32>) -> tensor<2x?xf32>
  return %y : tensor<2x?xf32>
}

// -----

func.func @surviving_shape_op_is_an_error(%x: tensor<2x3xf32>) -> tensor<2xi64> attributes {sd.entry = "infer"} {
  // expected-error @+1 {{Shape: shape op survives specialization}}
  %s = sd.shape %x : (tensor<2x3xf32>) -> tensor<2xi64>
  return %s : tensor<2xi64>
}
