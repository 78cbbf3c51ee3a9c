// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-bottleneck="config=double_seq_bn reduction-factor=2" | FileCheck %s --check-prefix=HOULSBY
// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-bottleneck="config=seq_bn reduction-factor=2" | FileCheck %s --check-prefix=PFEIFFER
// RUN: sd-opt %s --split-input-file --verify-diagnostics --sd-peft-bottleneck="config=par_bn" | FileCheck %s --check-prefix=PARALLEL

// A pre-LN layer: attention (a matmul of probabilities and values here),
// its output projection attn.o added to the stream x, then a feed-forward
// block whose mlp.down is added to that sum. The adapters sit at those two
// residual sums, named as AdapterHub names its parameters (the layer is the
// module name up to its last number).
// HOULSBY:       modules = ["layers.0.attn.o", "layers.0.mlp.down"], non_linearity = "swish", peft_type = "BOTTLENECK",
// HOULSBY-SAME:  places = ["layers.0.attention_adapters", "layers.0.output_adapters"]
// HOULSBY-DAG:   sd.global @layers.0.attention_adapters.adapters.bottleneck.adapter_down.0.weight "trainable" : tensor<2x4xf32>
// HOULSBY-DAG:   sd.global @layers.0.attention_adapters.adapters.bottleneck.adapter_up.bias "trainable" : tensor<4xf32>
// HOULSBY-DAG:   sd.global @layers.0.output_adapters.adapters.bottleneck.adapter_down.0.bias "trainable" : tensor<2xf32>
// HOULSBY-DAG:   sd.global @layers.0.attn.o.weight "frozen"
// double_seq_bn (Houlsby): z' = z + up(swish(down(h))), h the block's output.
// HOULSBY:       %[[H:.*]] = sd.linear %{{.*}} {layout = "oi", module = "layers.0.attn.o"}
// HOULSBY:       %[[Z:.*]] = sd.add %[[H]], %arg0
// HOULSBY:       %[[D:.*]] = sd.linear %[[H]], {{.*}} {layout = "oi", module = "layers.0.attention_adapters.adapters.bottleneck.adapter_down.0"}
// HOULSBY:       %[[A:.*]] = sd.swish %[[D]]
// HOULSBY:       %[[U:.*]] = sd.linear %[[A]], {{.*}} module = "layers.0.attention_adapters.adapters.bottleneck.adapter_up"}
// HOULSBY:       %[[Z2:.*]] = sd.add %[[Z]], %[[U]]
// HOULSBY:       sd.linear %[[Z2]], {{.*}} module = "layers.0.mlp.up"
// HOULSBY:       sd.add %{{.*}}, %[[Z2]]

// seq_bn (Pfeiffer): the feed-forward block only, z' = z + up(relu(down(z))).
// PFEIFFER:      modules = ["layers.0.mlp.down"]
// PFEIFFER-NOT:  attention_adapters
// PFEIFFER:      %[[H:.*]] = sd.linear %{{.*}} {layout = "oi", module = "layers.0.mlp.down"}
// PFEIFFER:      %[[Z:.*]] = sd.add %[[H]], %[[R:[^ ]*]] :
// PFEIFFER:      %[[D:.*]] = sd.linear %[[Z]], {{.*}} module = "layers.0.output_adapters.adapters.bottleneck.adapter_down.0"}
// PFEIFFER:      %[[A:.*]] = sd.relu %[[D]]
// PFEIFFER:      %[[U:.*]] = sd.linear %[[A]]
// PFEIFFER:      %[[Z2:.*]] = sd.add %[[Z]], %[[U]]
// PFEIFFER:      return %[[Z2]]

// par_bn: u is the stream the block reads, the output scaled by 4; ParBnConfig's
// reduction factor 2 and mam_adapter start (up zero).
// PARALLEL:      scaling = 4.0
// PARALLEL:      %[[R:.*]] = sd.add %{{.*}}, %arg0
// PARALLEL:      %[[H:.*]] = sd.linear %{{.*}} {layout = "oi", module = "layers.0.mlp.down"}
// PARALLEL:      %[[Z:.*]] = sd.add %[[H]], %[[R]]
// PARALLEL:      %[[D:.*]] = sd.linear %[[R]], {{.*}} module = "layers.0.output_adapters.adapters.bottleneck.adapter_down.0"}
// PARALLEL:      %[[U:.*]] = sd.linear
// PARALLEL:      %[[S:.*]] = sd.mul %[[U]]
// PARALLEL:      sd.add %[[Z]], %[[S]]
// PARALLEL:      layers.0.output_adapters.adapters.bottleneck.adapter_up.weight: "0x040000000000000000000000000000000000000000000000000000000000000000000000"
module {
  sd.global @layers.0.attn.o.weight "trainable" : tensor<4x4xf32>
  sd.global @layers.0.mlp.up.weight "trainable" : tensor<8x4xf32>
  sd.global @layers.0.mlp.down.weight "trainable" : tensor<4x8xf32>
  func.func @forward(%x: tensor<3x4xf32>, %p: tensor<3x3xf32>, %v: tensor<3x4xf32>) -> tensor<3x4xf32> {
    %none = sd.none
    %wo = sd.global_load @layers.0.attn.o.weight : tensor<4x4xf32>
    %wu = sd.global_load @layers.0.mlp.up.weight : tensor<8x4xf32>
    %wd = sd.global_load @layers.0.mlp.down.weight : tensor<4x8xf32>
    %att = sd.matmul %p, %v : (tensor<3x3xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    %h = sd.linear %att, %wo, %none {layout = "oi", module = "layers.0.attn.o"} : (tensor<3x4xf32>, tensor<4x4xf32>, none) -> tensor<3x4xf32>
    %z = sd.add %h, %x : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    %u = sd.linear %z, %wu, %none {layout = "oi", module = "layers.0.mlp.up"} : (tensor<3x4xf32>, tensor<8x4xf32>, none) -> tensor<3x8xf32>
    %a = sd.relu %u : (tensor<3x8xf32>) -> tensor<3x8xf32>
    %h2 = sd.linear %a, %wd, %none {layout = "oi", module = "layers.0.mlp.down"} : (tensor<3x8xf32>, tensor<4x8xf32>, none) -> tensor<3x4xf32>
    %z2 = sd.add %h2, %z : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    return %z2 : tensor<3x4xf32>
  }
}

// -----

// The stream a block adds to is a LayerNorm's output, but no LayerNorm
// reads the sum: neither a pre-LN nor a post-LN block.
module {
  sd.global @layers.0.mlp.down.weight "trainable" : tensor<4x4xf32>
  sd.global @ln.weight "trainable" : tensor<4xf32>
  sd.global @ln.bias "trainable" : tensor<4xf32>
  func.func @forward(%x: tensor<3x4xf32>) -> tensor<3x4xf32> {
    %none = sd.none
    %g = sd.global_load @ln.weight : tensor<4xf32>
    %b = sd.global_load @ln.bias : tensor<4xf32>
    %wd = sd.global_load @layers.0.mlp.down.weight : tensor<4x4xf32>
    %r = sd.layer_normalization %x, %g, %b {axis = -1 : i64, epsilon = 1.0e-5 : f32} : (tensor<3x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<3x4xf32>
    // expected-error @+1 {{module 'layers.0.mlp.down': the stream its block adds to is a norm's output, but the sum is not LayerNorm-ed next}}
    %h = sd.linear %r, %wd, %none {layout = "oi", module = "layers.0.mlp.down"} : (tensor<3x4xf32>, tensor<4x4xf32>, none) -> tensor<3x4xf32>
    %z = sd.add %h, %r : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    return %z : tensor<3x4xf32>
  }
}

// -----

// Post-LN (BERT): the stream is a LayerNorm's output and the block's
// LayerNorm reads the sum. The adapter goes before that LayerNorm, which
// then reads z'; seq_bn's input is the sum through a copy of it. In the
// BERT family AdapterHub keeps the adapters in the block's output module.
// PFEIFFER:      places = ["encoder.layer.0.output"]
// PFEIFFER:      %[[R:.*]] = sd.layer_normalization %arg0
// PFEIFFER:      %[[H:.*]] = sd.linear %[[R]], {{.*}} module = "encoder.layer.0.output.dense"}
// PFEIFFER:      %[[Z:.*]] = sd.add %[[H]], %[[R]]
// PFEIFFER:      %[[U:.*]] = sd.layer_normalization %[[Z]], %[[G:[^,]*]], %[[B:[^ ]*]] {
// PFEIFFER:      %[[D:.*]] = sd.linear %[[U]], {{.*}} module = "encoder.layer.0.output.adapters.bottleneck.adapter_down.0"}
// PFEIFFER:      %[[Z2:.*]] = sd.add %[[Z]], %{{.*}}
// PFEIFFER:      %[[Y:.*]] = sd.layer_normalization %[[Z2]], %[[G]], %[[B]] {
// PFEIFFER:      return %[[Y]]
// HOULSBY:       places = ["encoder.layer.0.output"]
// PARALLEL:      places = ["encoder.layer.0.output"]
module {
  sd.global @encoder.layer.0.output.dense.weight "trainable" : tensor<4x4xf32>
  sd.global @ln.weight "trainable" : tensor<4xf32>
  sd.global @ln.bias "trainable" : tensor<4xf32>
  func.func @forward(%x: tensor<3x4xf32>) -> tensor<3x4xf32> {
    %none = sd.none
    %g = sd.global_load @ln.weight : tensor<4xf32>
    %b = sd.global_load @ln.bias : tensor<4xf32>
    %wd = sd.global_load @encoder.layer.0.output.dense.weight : tensor<4x4xf32>
    %r = sd.layer_normalization %x, %g, %b {axis = -1 : i64, epsilon = 1.0e-5 : f32} : (tensor<3x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<3x4xf32>
    %h = sd.linear %r, %wd, %none {layout = "oi", module = "encoder.layer.0.output.dense"} : (tensor<3x4xf32>, tensor<4x4xf32>, none) -> tensor<3x4xf32>
    %z = sd.add %h, %r : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    %y = sd.layer_normalization %z, %g, %b {axis = -1 : i64, epsilon = 1.0e-5 : f32} : (tensor<3x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<3x4xf32>
    return %y : tensor<3x4xf32>
  }
}
