// RUN: sd-opt %s --sd-autodiff --sd-training-batch-norm | FileCheck %s

// A BatchNormalization the importer made from a train-mode node: the batch's
// mean and biased variance (ReduceMeans), tagged with its running statistics.
// After autodiff, eval_step normalizes by the running weights (the batch's
// statistics erased). accumulate keeps the batch's, averaged over
// data-parallel ranks (AllReduce of [mean..., 1], then sum / ranks), and x's
// gradient through them is one expression, k * dy - k * mean(dy) - (x - mean)
// * slope, whose two per-channel means are averaged the same way, in one
// AllReduce of [mean(dy)..., mean(dy * (x - mean))..., 1] (the
// ReduceMeans get no gradient: no broadcast of theirs), reaching the
// trainable weight before them; it writes running * 0.9 + batch * 0.1 back
// before returning, the variance scaled to unbiased by the tag's count. The
// running weights become `statistics` globals; no tag
// is left.
// CHECK-DAG:   sd.global @bn.running_mean "statistics" : tensor<3xf32>
// CHECK-DAG:   sd.global @bn.running_var "statistics" : tensor<3xf32>
// CHECK-DAG:   sd.global @"grad/w" "gradient"
// CHECK-NOT:   grad/bn.running
// CHECK-NOT:   sd.running_statistics
// CHECK-NOT:   sd.cross_rank_mean
// CHECK-LABEL: func.func @eval_step
// CHECK-NOT:   sd.reduce_mean
// CHECK-DAG:   %[[M:.*]] = sd.global_load @bn.running_mean
// CHECK-DAG:   %[[V:.*]] = sd.global_load @bn.running_var
// CHECK:       sd.batch_normalization %{{.*}}, %{{.*}}, %{{.*}}, %[[M]], %[[V]] {epsilon
// CHECK-NOT:   sd.reduce_mean
// CHECK-NOT:   sd.all_reduce
// CHECK-NOT:   sd.global_store
// CHECK:       return
// CHECK-LABEL: func.func @accumulate
// CHECK:       %[[LM:.*]] = sd.reduce_mean %[[H:.*]], %{{.*}}
// CHECK:       %[[PM:.*]] = sd.concat %[[LM]], %{{.*}} {axis = 0 : i64} : (tensor<3xf32>, tensor<1xf32>) -> tensor<4xf32>
// CHECK:       %[[RM:.*]] = sd.all_reduce %[[PM]]
// CHECK-DAG:   %[[RANKS:.*]] = sd.slice %[[RM]], {{.*}} -> tensor<1xf32>
// CHECK-DAG:   %[[SUMS:.*]] = sd.slice %[[RM]], {{.*}} -> tensor<3xf32>
// CHECK:       %[[BM:.*]] = sd.div %[[SUMS]], %[[RANKS]]
// CHECK:       sd.sub %[[H]], %[[BM]]
// CHECK:       sd.reduce_mean
// CHECK:       %[[RV:.*]] = sd.all_reduce
// CHECK:       %[[VRANKS:.*]] = sd.slice %[[RV]], {{.*}} -> tensor<1xf32>
// CHECK:       %[[BV:.*]] = sd.div %{{.*}}, %[[VRANKS]]
// CHECK:       sd.batch_normalization %[[H]], %{{.*}}, %{{.*}}, %[[BM]], %[[BV]] {epsilon
// CHECK:       %[[DY:.*]] = sd.expand
// CHECK-NOT:   sd.expand
// CHECK:       sd.concat %{{.*}}, %{{.*}} {axis = 0 : i64} : (tensor<6xf32>, tensor<1xf32>) -> tensor<7xf32>
// CHECK-NEXT:  sd.all_reduce
// CHECK-NOT:   sd.all_reduce
// CHECK-NOT:   sd.expand
// CHECK:       %[[DX:.*]] = sd.sub %{{.*}}, %{{.*}} : (tensor<4x3xf32>, tensor<4x3xf32>)
// CHECK-NOT:   sd.expand
// CHECK:       sd.gemm %arg0, %[[DX]], %{{.*}} {transA = 1 : i64, transB = 0 : i64}
// CHECK:       sd.global_store %{{.*}}, @"grad/w"
// CHECK:       %[[OLDM:.*]] = sd.global_load @bn.running_mean
// CHECK-DAG:   %[[KM:.*]] = sd.constant dense<0.899999976> : tensor<f32>
// CHECK-DAG:   %[[KB:.*]] = sd.constant dense<0.100000024> : tensor<f32>
// CHECK-DAG:   %[[OLD:.*]] = sd.mul %[[OLDM]], %[[KM]]
// CHECK-DAG:   %[[NEW:.*]] = sd.mul %[[BM]], %[[KB]]
// CHECK:       %[[NM:.*]] = sd.add %[[OLD]], %[[NEW]]
// CHECK-NEXT:  sd.global_store %[[NM]], @bn.running_mean
// The running variance takes the unbiased variance of all ranks' batch
// (PyTorch's rule; the tag's count 4 per rank): var * 4R / (4R - 1).
// CHECK:       sd.global_load @bn.running_var
// CHECK:       %[[N:.*]] = sd.mul %[[VRANKS]], %{{.*}}
// CHECK:       %[[N1:.*]] = sd.sub %[[N]], %{{.*}}
// CHECK:       %[[F:.*]] = sd.div %[[N]], %[[N1]]
// CHECK:       sd.mul %[[BV]], %[[F]]
// CHECK:       sd.global_store %{{.*}}, @bn.running_var
// CHECK-NEXT:  return
module {
  sd.global @w "trainable" : tensor<3x3xf32>
  sd.global @bn.weight "trainable" : tensor<3xf32>
  sd.global @bn.bias "trainable" : tensor<3xf32>
  sd.global @bn.running_mean "frozen" : tensor<3xf32>
  sd.global @bn.running_var "frozen" : tensor<3xf32>
  func.func @eval_step(%x: tensor<4x3xf32>) -> (tensor<f32>, tensor<f32>)
      attributes {sd.entry = "eval_step", sd.bucket = {}, sd.output_names = ["loss_sum", "tokens"]} {
    %w = sd.global_load @w : tensor<3x3xf32>
    %scale = sd.global_load @bn.weight : tensor<3xf32>
    %bias = sd.global_load @bn.bias : tensor<3xf32>
    %none = sd.none
    %h = sd.gemm %x, %w, %none : (tensor<4x3xf32>, tensor<3x3xf32>, none) -> tensor<4x3xf32>
    %axes = sd.constant dense<0> : tensor<1xi64>
    %mean = sd.reduce_mean %h, %axes {keepdims = 0 : i64} : (tensor<4x3xf32>, tensor<1xi64>) -> tensor<3xf32>
    %centered = sd.sub %h, %mean : (tensor<4x3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
    %squared = sd.mul %centered, %centered : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
    %var = sd.reduce_mean %squared, %axes {keepdims = 0 : i64} : (tensor<4x3xf32>, tensor<1xi64>) -> tensor<3xf32>
    %y = sd.batch_normalization %h, %scale, %bias, %mean, %var {epsilon = 1.0E-5 : f32, sd.running_statistics = [@bn.running_mean, @bn.running_var, 0.899999976 : f32, 4 : i64]} : (tensor<4x3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<4x3xf32>
    %l = sd.reduce_sum %y, %none {keepdims = 0 : i64} : (tensor<4x3xf32>, none) -> tensor<f32>
    %t = sd.constant dense<1.0> : tensor<f32>
    return %l, %t : tensor<f32>, tensor<f32>
  }
}
