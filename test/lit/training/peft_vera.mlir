// RUN: sd-opt %s --sd-peft-vera="target-modules=a,b r=2 projection-key=7" | FileCheck %s
// RUN: sd-opt %s --sd-peft-vera="target-modules=a,b r=2 dropout=0.25" | FileCheck %s --check-prefix=DROP

// vera_dropout: the adapter reads seeded_dropout(x), one stream per layer.
// DROP-LABEL: func.func @eval_step
// DROP:       %[[XD:.*]] = sd.seeded_dropout %arg0, %{{.*}} {ratio = 2.500000e-01 : f32, stream = 0 : i64}
// DROP:       sd.linear %[[XD]], %{{.*}} {layout = "oi", module = "a.vera_A"}
// DROP:       sd.seeded_dropout %{{.*}} {ratio = 2.500000e-01 : f32, stream = 1 : i64}

// VeRA: one frozen pair of projections for every adapted layer, A [r, max
// in] and B [max out, r], each layer reading its slices; trained λ_d [r]
// (0.1) and λ_b [out] (zeros): y = x Wᵀ + λ_b ⊙ ((λ_d ⊙ (x A[:, :in]ᵀ)) B[:out]ᵀ).
// The projections' bits are PyTorch's: torch.Generator().manual_seed(7),
// then torch.empty(2, 4).uniform_(±sqrt(6/4)) and torch.empty(3, 2).uniform_(±sqrt(6/2)).
// CHECK:       peft_type = "VERA", projection_prng_key = 7 : i64, r = 2 : i64
// CHECK-DAG:   sd.global @vera_A "frozen" : tensor<2x4xf32>
// CHECK-DAG:   sd.global @vera_B "frozen" : tensor<3x2xf32>
// CHECK-DAG:   sd.global @a.vera_lambda_d "trainable" : tensor<2xf32> = dense_resource
// CHECK-DAG:   sd.global @a.vera_lambda_b "trainable" : tensor<3xf32>{{$}}
// CHECK-DAG:   sd.global @b.vera_lambda_b "trainable" : tensor<2xf32>{{$}}
// CHECK-LABEL: func.func @eval_step
// CHECK:       %[[Y:.*]] = sd.linear %arg0, %{{.*}} {layout = "oi", module = "a"}
// CHECK:       %[[A:.*]] = sd.slice %{{.*}} -> tensor<2x4xf32>
// CHECK:       %[[B:.*]] = sd.slice %{{.*}} -> tensor<3x2xf32>
// CHECK:       %[[LD:.*]] = sd.global_load @a.vera_lambda_d
// CHECK:       %[[DOWN:.*]] = sd.linear %arg0, %[[A]], %{{.*}} {layout = "oi", module = "a.vera_A"}
// CHECK:       %[[SD:.*]] = sd.mul %[[DOWN]], %[[LD]]
// CHECK:       %[[LB:.*]] = sd.global_load @a.vera_lambda_b
// CHECK:       %[[UP:.*]] = sd.linear %[[SD]], %[[B]], %{{.*}} {layout = "oi", module = "a.vera_B"}
// CHECK:       %[[SB:.*]] = sd.mul %[[UP]], %[[LB]]
// CHECK:       %[[OUT:.*]] = sd.add %[[Y]], %[[SB]]
// CHECK:       sd.linear %[[OUT]], %{{.*}} {layout = "oi", module = "b"}
// CHECK:       sd.slice %{{.*}} -> tensor<2x3xf32>
// CHECK:       sd.slice %{{.*}} -> tensor<2x2xf32>
// CHECK:       vera_A: "0x04000000DC30AF3D0EDF3CBF6FACC73E1EC3C43EB99327BF80F73BBE69AD37BF19B5A23E"
// CHECK:       vera_B: "0x04000000C2E0EEBE10C19B3F32629D3FEEAD343E86083DBF2E3882BF"
// CHECK:       a.vera_lambda_d: "0x04000000CDCCCC3DCDCCCC3D"
module {
  sd.global @a.weight "trainable" : tensor<3x4xf32>
  sd.global @b.weight "trainable" : tensor<2x3xf32>
  func.func @eval_step(%x: tensor<5x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @a.weight : tensor<3x4xf32>
    %wb = sd.global_load @b.weight : tensor<2x3xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "oi", module = "a"} : (tensor<5x4xf32>, tensor<3x4xf32>, none) -> tensor<5x3xf32>
    %z = sd.linear %y, %wb, %none {layout = "oi", module = "b"} : (tensor<5x3xf32>, tensor<2x3xf32>, none) -> tensor<5x2xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %z, %axes {keepdims = 0 : i64} : (tensor<5x2xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
