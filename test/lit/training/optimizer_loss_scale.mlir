// RUN: sd-opt %s --sd-optimizer | FileCheck %s

// fp16 (a loss_scale global, sd-autocast's window attribute): GradScale
// divides by tokens x scale; a non-finite norm (norm - norm is NaN) keeps the
// step counter (Where old, new) and is AdamW's skip operand, which keeps
// parameters and moments (no select on whole tensors); the gradient is
// zeroed either way; the scale halves on a skip and doubles when the growth
// tracker reaches the window (3).
// CHECK-DAG:   sd.global @loss_scale_growth_tracker "scalar_state" : tensor<f32>
// CHECK-LABEL: func.func @apply
// CHECK:       %[[T:.*]] = sd.global_load @tokens_seen
// CHECK:       %[[L:.*]] = sd.global_load @loss_scale
// CHECK:       %[[TL:.*]] = sd.mul %[[T]], %[[L]]
// CHECK:       %[[S:.*]], %[[N:.*]] = sd.grad_scale %[[TL]]
// CHECK:       %[[OLD:.*]] = sd.global_load @optimizer_step
// CHECK:       %[[NEW:.*]] = sd.add %[[OLD]]
// CHECK:       %[[D:.*]] = sd.sub %[[N]], %[[N]]
// CHECK:       %[[SKIP:.*]] = sd.is_nan %[[D]]
// CHECK:       %[[STEP:.*]] = sd.where %[[SKIP]], %[[OLD]], %[[NEW]]
// CHECK:       sd.global_store %[[STEP]], @optimizer_step
// CHECK:       sd.constant dense<3.000000e+00>
// CHECK:       sd.constant dense<5.000000e-01>
// CHECK:       sd.global_store %{{.*}}, @loss_scale :
// CHECK:       sd.global_store %{{.*}}, @loss_scale_growth_tracker
// CHECK:       %[[W0:.*]] = sd.global_load @w :
// CHECK:       %[[M0:.*]] = sd.global_load @"adamw.exp_avg/w"
// CHECK:       %[[V0:.*]] = sd.global_load @"adamw.exp_avg_sq/w"
// CHECK:       %[[P:.*]], %[[M:.*]], %[[V:.*]], %[[G:.*]] = sd.adamw %[[W0]], %{{.*}}, %[[M0]], %[[V0]], %{{.*}}, %{{.*}}, %{{.*}}, %[[S]], %[[SKIP]]
// CHECK-NEXT:  sd.global_store %[[P]], @w
// CHECK-NEXT:  sd.global_store %[[M]], @"adamw.exp_avg/w"
// CHECK-NEXT:  sd.global_store %[[V]], @"adamw.exp_avg_sq/w"
// CHECK-NEXT:  sd.global_store %[[G]], @"grad/w"
// CHECK-NOT:   sd.where
module attributes {sd.loss_scale_init = 6.553600e+04 : f64, sd.loss_scale_window = 3 : i64} {
  sd.global @loss_scale "scalar_state" : tensor<f32> = dense<6.553600e+04> : tensor<f32>
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
