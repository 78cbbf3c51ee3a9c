// RUN: sd-opt %s --sd-specialize="shapes=ids=2x5 dims=past=3" | FileCheck %s
// RUN: not sd-opt %s --sd-specialize="shapes=ids=2x5" 2>&1 | FileCheck %s --check-prefix=UNKNOWN

// Optimum's with-past exports name the mask's length as a sum of dims: it
// takes the value of the sum once every term is known (from --dim or from an
// input already specialized).
// CHECK: func.func @infer(%{{.*}}: tensor<2x5xi64> {{.*}}, %{{.*}}: tensor<2x8xi64> {{.*}}, %{{.*}}: tensor<2x3xf32>
// UNKNOWN: input 'mask' dim 1 ('past + seq') is dynamic
func.func @infer(%ids: tensor<?x?xi64> {sd.name = "ids", sd.dim_params = ["batch", "seq"]},
                 %mask: tensor<?x?xi64> {sd.name = "mask", sd.dim_params = ["batch", "past + seq"]},
                 %past: tensor<?x?xf32> {sd.name = "past", sd.dim_params = ["batch", "past"]}) -> tensor<?x?xf32>
    attributes {sd.entry = "infer", sd.output_names = ["y"]} {
  %y = sd.relu %past : (tensor<?x?xf32>) -> tensor<?x?xf32>
  return %y : tensor<?x?xf32>
}
