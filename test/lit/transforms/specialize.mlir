// RUN: sd-opt %s --sd-specialize="dims=batch=2,batch=8" | FileCheck %s
// RUN: sd-opt %s --sd-specialize="shapes=x=4x16" | FileCheck %s --check-prefix=SHAPES
// RUN: not sd-opt %s --sd-specialize="shapes=x=4x15" 2>&1 | FileCheck %s --check-prefix=BAD

// Two values of a dim_param give two buckets, each with a static signature.
// CHECK: func.func @infer_b0(%{{.*}}: tensor<2x16xf32> {{.*}}) -> tensor<?x16xf32> attributes {sd.bucket = {batch = 2 : i64}, sd.entry = "infer"
// CHECK: func.func @infer_b1(%{{.*}}: tensor<8x16xf32> {{.*}}) -> tensor<?x16xf32> attributes {sd.bucket = {batch = 8 : i64}, sd.entry = "infer"
// SHAPES: func.func @infer(%{{.*}}: tensor<4x16xf32>
// BAD: --shapes x sets dim 1 to 15 but the model fixes it at 16
func.func @infer(%x: tensor<?x16xf32> {sd.name = "x", sd.dim_params = ["batch", ""]}) -> tensor<?x16xf32>
    attributes {sd.entry = "infer", sd.output_names = ["y"]} {
  %y = sd.relu %x : (tensor<?x16xf32>) -> tensor<?x16xf32>
  return %y : tensor<?x16xf32>
}
