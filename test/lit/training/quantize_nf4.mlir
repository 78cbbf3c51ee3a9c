// RUN: sd-opt %s --sd-quantize-nf4 | FileCheck %s
// RUN: sd-opt %s --sd-quantize-nf4 --sd-rematerialize-dequant | FileCheck %s --check-prefix=REMAT

// The layer's frozen weight [2, 64] (two blocks of 64) becomes 64 bytes of
// NF4 codes and 2 block absmax; the head (the layer an entry returns) stays f32.
// CHECK-DAG:   sd.global @head.weight "frozen" : tensor<3x2xf32>
// CHECK-DAG:   sd.global @a.weight.nf4 "frozen" : tensor<64xui8> = dense_resource
// CHECK-DAG:   sd.global @a.weight.nf4_absmax "frozen" : tensor<2xf32> = dense_resource
// CHECK-NOT:   sd.global @a.weight "frozen"
// Each load a dequantization: the high and low halves of each byte (a shift
// by [4, 0] broadcast over the bytes, then a mask), the table's values, times each block's absmax (here already [2, 64]).
// CHECK-LABEL: func.func @infer
// CHECK:       %[[Q:.*]] = sd.global_load @a.weight.nf4
// CHECK:       %[[S:.*]] = sd.global_load @a.weight.nf4_absmax
// CHECK:       %[[SH:.*]] = sd.constant dense<{{\[\[}}4, 0]]> : tensor<1x2xui8>
// CHECK:       %[[B:.*]] = sd.reshape %[[Q]], %{{.*}} -> tensor<64x1xui8>
// CHECK:       %[[P:.*]] = sd.bit_shift %[[B]], %[[SH]] {direction = "RIGHT"} {{.*}} -> tensor<64x2xui8>
// CHECK:       sd.bitwise_and %[[P]]
// CHECK:       sd.cast {{.*}} -> tensor<128xi32>
// CHECK:       sd.gather
// CHECK:       %[[W:.*]] = sd.mul {{.*}} {sd.dequantized = "a.weight"} {{.*}} -> tensor<2x64xf32>
// CHECK:       sd.linear %{{.*}}, %[[W]], %{{.*}} {layout = "oi", module = "a"}
// CHECK:       sd.global_load @head.weight
// Rematerialized: the two readers of the weight (the layer and a second
// product) each get their own chain, just before them.
// REMAT-LABEL: func.func @infer
// REMAT:       sd.global_load @a.weight.nf4
// REMAT:       sd.linear {{.*}} module = "a"}
// REMAT:       sd.global_load @a.weight.nf4
// REMAT:       sd.gather
// REMAT:       sd.linear {{.*}} module = "b"}
module {
  sd.global @a.weight "frozen" : tensor<2x64xf32> = dense<[[1.257302e-01, -1.321049e-01, 6.404226e-01, 1.049001e-01, -5.356694e-01, 3.615951e-01, 1.304000e+00, 9.470810e-01, -7.037352e-01, -1.265422e+00, -6.232744e-01, 4.132598e-02, -2.325031e+00, -2.187917e-01, -1.245911e+00, -7.322674e-01, -5.442590e-01, -3.163002e-01, 4.116305e-01, 1.042513e+00, -1.285347e-01, 1.366463e+00, -6.651947e-01, 3.515101e-01, 9.034702e-01, 9.401230e-02, -7.434993e-01, -9.217254e-01, -4.577258e-01, 2.201951e-01, -1.009618e+00, -2.091756e-01, -1.592250e-01, 5.408456e-01, 2.146591e-01, 3.553727e-01, -6.538286e-01, -1.296136e-01, 7.839755e-01, 1.493431e+00, -1.259066e+00, 1.513924e+00, 1.345875e+00, 7.813114e-01, 2.644556e-01, -3.139228e-01, 1.458021e+00, 1.960258e+00, 1.801635e+00, 1.315104e+00, 3.573804e-01, -1.208319e+00, -4.454133e-03, 6.564749e-01, -1.288361e+00, 3.951221e-01, 4.298637e-01, 6.960427e-01, -1.184118e+00, -6.617026e-01, -4.364353e-01, -1.169802e+00, 1.739368e+00, -4.959107e-01], [3.289696e-01, -2.585725e-01, 1.583473e+00, 1.320361e+00, 6.333526e-01, -2.203510e+00, 5.202897e-02, 6.836862e-01, 1.003962e+00, -6.179070e-01, 1.822011e+00, -1.320431e+00, -6.615281e-01, 9.350500e-01, 4.905462e-02, 2.002393e+00, 1.885192e-01, -6.331941e-01, -3.775635e-01, -1.091146e+00, -1.277680e+00, 6.304115e-01, 5.811658e-01, 1.294559e+00, -7.546058e-01, 1.689107e+00, -2.873877e-01, 1.574408e+00, -4.327858e-01, -7.354833e-01, 2.497854e-01, 1.031453e+00, 1.610096e-01, -5.855289e-01, -1.341220e+00, -1.401520e+00, 5.026829e-01, 9.897130e-01, -1.642946e-01, -1.074365e+00, 8.730422e-01, -1.280394e+00, -7.130681e-01, 6.210179e-01, -2.250141e+00, 3.863696e-01, -5.816408e-01, 1.092797e-01, -7.570153e-02, 2.021144e-01, 6.941720e-01, -7.583697e-01, 1.420982e+00, 7.260938e-01, 8.437327e-01, 1.164864e+00, 7.875882e-01, 8.440787e-01, 7.559361e-02, -1.426774e+00, -1.350451e-01, -7.695146e-01, -1.422742e+00, 2.584528e-01]]> : tensor<2x64xf32>
  sd.global @head.weight "frozen" : tensor<3x2xf32> = dense<1.0> : tensor<3x2xf32>
  func.func @infer(%x: tensor<5x64xf32> {sd.name = "x"}) -> tensor<5x3xf32>
      attributes {sd.entry = "infer", sd.output_names = ["y"]} {
    %w = sd.global_load @a.weight : tensor<2x64xf32>
    %none = sd.none
    %h = sd.linear %x, %w, %none {layout = "oi", module = "a"} : (tensor<5x64xf32>, tensor<2x64xf32>, none) -> tensor<5x2xf32>
    %h2 = sd.linear %x, %w, %none {layout = "oi", module = "b"} : (tensor<5x64xf32>, tensor<2x64xf32>, none) -> tensor<5x2xf32>
    %s = sd.add %h, %h2 : (tensor<5x2xf32>, tensor<5x2xf32>) -> tensor<5x2xf32>
    %hw = sd.global_load @head.weight : tensor<3x2xf32>
    %y = sd.linear %s, %hw, %none {layout = "oi", module = "head"} : (tensor<5x2xf32>, tensor<3x2xf32>, none) -> tensor<5x3xf32>
    return %y : tensor<5x3xf32>
  }
}
