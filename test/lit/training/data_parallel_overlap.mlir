// RUN: sd-opt %s --sd-optimizer --sd-accumulate-where-produced --sd-data-parallel=bucket-mb=0 | FileCheck %s

// One bucket per gradient. grad/w is final early and work follows, so its
// reduction starts there (async); grad/b is final only at the backward's
// end, with nothing left to overlap, so it is reduced there, blocking (a
// nonblocking reduction waited for at once is the slow path). The wait
// covers grad/w only. The gradient globals are laid out in the order the
// backward finishes them: b's after w's, although b was declared first.
// CHECK:       sd.global @"grad/w"
// CHECK-NEXT:  sd.global @"grad/b"
// CHECK-LABEL: func.func @train_step
// CHECK:       sd.global_store %{{.*}}, @"grad/w"
// CHECK-NEXT:  %[[W:.*]] = sd.global_load @"grad/w"
// CHECK-NEXT:  sd.all_reduce %[[W]] {async = 1 : i64}
// CHECK:       sd.mul
// CHECK:       sd.global_store %{{.*}}, @"grad/b"
// CHECK-NEXT:  %[[B:.*]] = sd.global_load @"grad/b"
// CHECK-NEXT:  %[[RB:.*]] = sd.all_reduce %[[B]] :
// CHECK-NEXT:  sd.global_store %[[RB]], @"grad/b"
// CHECK:       %[[W0:.*]] = sd.global_load @"grad/w"
// CHECK-NEXT:  sd.wait_collectives %[[W0]] :
// CHECK:       sd.grad_scale
module {
  sd.global @b "trainable" : tensor<4xf32>
  sd.global @w "trainable" : tensor<4x4xf32>
  sd.global @"grad/b" "gradient" : tensor<4xf32>
  sd.global @"grad/w" "gradient" : tensor<4x4xf32>
  sd.global @tokens_seen "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<4x4xf32>, %y: tensor<4xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "accumulate", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %dw = sd.mul %x, %x : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %rest = sd.mul %dw, %x : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %db = sd.add %y, %y : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %gw = sd.global_load @"grad/w" : tensor<4x4xf32>
    %sw = sd.add %gw, %dw : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    sd.global_store %sw, @"grad/w" : tensor<4x4xf32>
    %gb = sd.global_load @"grad/b" : tensor<4xf32>
    %sb = sd.add %gb, %db : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    sd.global_store %sb, @"grad/b" : tensor<4xf32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %t, %t : tensor<f32>, tensor<f32>
  }
}
