// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-bufferize | FileCheck %s

// A stored value whose producer is the last reader of the global is computed
// in place into the global's buffer (gradient accumulation, optimizer update);
// a stored constant is copied.
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[G:.*]] = sd.global_buffer @grad
// CHECK:       %[[D:.*]] = sd.buffer
// CHECK:       %[[G2:.*]] = sd.global_buffer @grad
// CHECK:       sd.step "Add" {} ins(%[[G]], %[[D]] : {{.*}}) outs(%[[G2]] : {{.*}})
// CHECK:       %[[Z:.*]] = sd.global_buffer @__constant_0
// CHECK:       %[[T:.*]] = sd.global_buffer @tokens
// CHECK:       sd.step "Identity" {} ins(%[[Z]] : {{.*}}) outs(%[[T]] : {{.*}})
module {
  sd.global @grad "gradient" : tensor<4xf32>
  sd.global @tokens "scalar_state" : tensor<f32>
  func.func @accumulate(%x: tensor<4xf32>) attributes {sd.entry = "accumulate", sd.bucket = {}} {
    %g = sd.global_load @grad : tensor<4xf32>
    %d = sd.exp %x : (tensor<4xf32>) -> tensor<4xf32>
    %n = sd.add %g, %d : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    sd.global_store %n, @grad : tensor<4xf32>
    %z = sd.constant dense<0.0> : tensor<f32>
    sd.global_store %z, @tokens : tensor<f32>
    return
  }
}

// -----

// Reading the old value after the store would see the new one: refused.
module {
  sd.global @w "trainable" : tensor<4xf32>
  func.func @bad(%x: tensor<4xf32>) -> tensor<4xf32> attributes {sd.entry = "bad", sd.bucket = {}} {
    %w = sd.global_load @w : tensor<4xf32>
    %n = sd.add %w, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    // expected-error@+1 {{global 'w' is read after it is stored}}
    sd.global_store %n, @w : tensor<4xf32>
    %r = sd.mul %w, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %r : tensor<4xf32>
  }
}
