// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-osft="target-modules=fc preserved-ratio=0.5" --sd-osft-strategy="strategy=factored" --sd-autodiff --sd-optimizer --sd-osft-project | FileCheck %s
// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-osft="target-modules=fc preserved-ratio=0.5" --sd-osft-strategy="strategy=dense" | FileCheck %s --check-prefix=DENSE
// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-osft="target-modules=fc preserved-ratio=0.5" --sd-osft-strategy="strategy=factored" --sd-autodiff --sd-optimizer --sd-data-parallel=shard=params --sd-shard-params --sd-osft-project | FileCheck %s --check-prefix=SHARD

// --shard params: U_high shares U_low's rows (its products are partial sums),
// but the V side needs every row of V_high, gathered first; one all-reduce
// completes every coefficient, laid out by the whole factors' rows.
// SHARD-LABEL: func.func @train_step
// SHARD:       sd.all_reduce %{{.*}} : (tensor<f32>) -> tensor<f32>
// SHARD:       %[[UH:.*]] = sd.global_load @fc.osf_U_high
// SHARD:       %[[VH:.*]] = sd.global_load @fc.osf_V_high
// SHARD-NEXT:  %[[VHALL:.*]] = sd.all_gather_rows %[[VH]]
// SHARD-NEXT:  %[[C:.*]] = sd.osft_coefficients %{{.*}}, %[[UH]], %{{.*}}, %[[VHALL]] {high_rows = array<i64: 6, 2>, row_sharded = 1 : i64, sides = array<i64: 0, 1>, x_rows = array<i64: 6, 2>}
// SHARD-NEXT:  %[[R:.*]] = sd.all_reduce %[[C]] : (tensor<8xf32>) -> tensor<8xf32>
// SHARD-NEXT:  sd.osft_deflate %[[R]], %{{.*}}, %[[UH]], %{{.*}}, %[[VHALL]] {high_rows

// The [6, 4] weight splits into rank-2 halves: the high factors frozen, the
// low ones trainable under PEFT's OSF names; the dense weight leaves the
// plan. The layer becomes sd.osft_linear; its backward is one fused op that
// differentiates the input and the low factors only.
// CHECK-NOT: sd.global @fc.weight
// CHECK-DAG: sd.global @fc.osf_U_high "frozen" : tensor<6x2xf32> = dense_resource
// CHECK-DAG: sd.global @fc.osf_S_high "frozen" : tensor<2xf32> = dense_resource
// CHECK-DAG: sd.global @fc.osf_V_high "frozen" : tensor<2x4xf32> = dense_resource
// CHECK-DAG: sd.global @fc.osf_svd_params.U_low "trainable" : tensor<6x2xf32> = dense_resource
// CHECK-DAG: sd.global @fc.osf_svd_params.S_low "trainable" : tensor<2xf32> = dense_resource
// CHECK-DAG: sd.global @fc.osf_svd_params.V_low "trainable" : tensor<2x4xf32> = dense_resource
// CHECK-LABEL: func.func @eval_step
// CHECK:       sd.osft_linear {{.*}} {module = "fc"}
// CHECK-LABEL: func.func @accumulate
// CHECK:       sd.osft_linear_grad {{.*}} {input_grad = 0 : i64}
// The optimizer step: the gradients of U_low and V_low lose their high
// components before clipping and AdamW (one coefficient buffer, one deflate
// step, stored back in place), and the updated factors are projected again.
// CHECK-LABEL: func.func @train_step
// CHECK:       %[[C:.*]] = sd.osft_coefficients {{.*}} {sides = array<i64: 0, 1>} {{.*}} -> tensor<8xf32>
// CHECK:       %[[D:.*]]:2 = sd.osft_deflate %[[C]], {{.*}} {sides = array<i64: 0, 1>}
// CHECK:       sd.global_store %[[D]]#0, @"grad/fc.osf_svd_params.U_low"
// CHECK:       sd.global_store %[[D]]#1, @"grad/fc.osf_svd_params.V_low"
// CHECK:       sd.grad_scale
// CHECK:       sd.adamw
// CHECK:       %[[P:.*]] = sd.osft_coefficients
// CHECK:       %[[Q:.*]]:2 = sd.osft_deflate %[[P]]
// CHECK:       sd.global_store %[[Q]]#0, @fc.osf_svd_params.U_low
// CHECK:       sd.global_store %[[Q]]#1, @fc.osf_svd_params.V_low
// CHECK-NEXT:  return
// DENSE-LABEL: func.func @eval_step
// DENSE:       %[[W:.*]] = sd.osft_compose
// DENSE:       sd.linear %{{.*}}, %[[W]], %{{.*}} {layout = "oi", module = "fc"}
module {
  sd.global @fc.weight "trainable" : tensor<6x4xf32> = dense<[[1.0, 0.5, -0.2, 0.0], [0.3, -1.0, 0.8, 0.1], [0.0, 0.2, 0.4, -0.6], [0.9, 0.0, -0.3, 0.2], [-0.5, 0.7, 0.1, 0.3], [0.2, -0.4, 0.6, 1.1]]> : tensor<6x4xf32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @eval_step(%x: tensor<3x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @fc.weight : tensor<6x4xf32>
    %none = sd.none
    %y = sd.linear %x, %w, %none {layout = "oi", module = "fc"} : (tensor<3x4xf32>, tensor<6x4xf32>, none) -> tensor<3x6xf32>
    %axes = sd.constant dense<[0, 1]> : tensor<2xi64>
    %l = sd.reduce_sum %y, %axes {keepdims = 0 : i64} : (tensor<3x6xf32>, tensor<2xi64>) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}

// -----

// A ratio that keeps no direction of this weight is an error naming the module.
module {
  sd.global @fc.weight "frozen" : tensor<2x1xf32> = dense<[[1.0], [2.0]]> : tensor<2x1xf32>
  func.func @infer(%x: tensor<1x1xf32>) -> tensor<1x2xf32> attributes {sd.entry = "infer"} {
    %w = sd.global_load @fc.weight : tensor<2x1xf32>
    %none = sd.none
    // expected-error@+1 {{OSFT on module 'fc': the preserved rank is 0 of min(out, in) = 1, which keeps no direction}}
    %y = sd.linear %x, %w, %none {layout = "oi", module = "fc"} : (tensor<1x1xf32>, tensor<2x1xf32>, none) -> tensor<1x2xf32>
    return %y : tensor<1x2xf32>
  }
}
