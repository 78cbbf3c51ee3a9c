// RUN: sd-opt %s --sd-optimizer | FileCheck %s

// apply: one GradScale over all gradients, the step counter advanced, one
// fused AdamW per parameter writing parameter, moments and zeroed gradient;
// weight decay only on the rank-2 weight. train_step = accumulate + apply.
// CHECK-DAG: sd.global @"adamw.exp_avg/w" "optimizer_state" : tensor<4x4xf32>
// CHECK-DAG: sd.global @"adamw.exp_avg_sq/b" "optimizer_state" : tensor<4xf32>
// CHECK-DAG: sd.global @optimizer_step "scalar_state" : tensor<f32>
// CHECK-LABEL: func.func @train_step
// CHECK-SAME:  tensor<f32> {sd.name = "lr"}
// CHECK:       sd.global_store %{{.*}}, @"grad/w"
// CHECK:       %[[S:.*]], %[[N:.*]] = sd.grad_scale
// CHECK:       sd.adamw {{.*}} {beta1 = 9.000000e-01 : f64, beta2 = 0.99{{[0-9]*}} : f64, decay = 1 : i64
// CHECK:       sd.adamw {{.*}} decay = 0 : i64
// CHECK:       return %{{.*}}, %{{.*}}, %[[N]]
// CHECK-LABEL: func.func @apply
// CHECK-SAME:  sd.entry = "apply"
module {
  sd.global @w "trainable" : tensor<4x4xf32>
  sd.global @b "trainable" : tensor<4xf32>
  sd.global @"grad/w" "gradient" : tensor<4x4xf32>
  sd.global @"grad/b" "gradient" : tensor<4xf32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<2x4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %g = sd.global_load @"grad/w" : tensor<4x4xf32>
    %n = sd.add %g, %g : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    sd.global_store %n, @"grad/w" : tensor<4x4xf32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %t, %t : tensor<f32>, tensor<f32>
  }
}
