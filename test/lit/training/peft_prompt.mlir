// RUN: sd-opt %s --sd-peft-prompt="virtual-tokens=3" | FileCheck %s
// RUN: sd-opt %s --sd-peft-prompt="virtual-tokens=3" --sd-recipe-sft | FileCheck %s --check-prefix=SFT
// RUN: sd-opt %s --sd-peft-prompt="virtual-tokens=2 init=vocab seed=1" | FileCheck %s --check-prefix=VOCAB
// RUN: sd-opt %s --sd-peft-prompt="virtual-tokens=3" --sd-kv-entries="max-length=16 chunk=4" | FileCheck %s --check-prefix=KV

// Prompt tuning: 3 trained embeddings before every row. Virtual token i is
// id vocab + i (8, 9, 10): the tokens get those ids in front, so what reads
// them sees N + S positions, and the lookup takes ids from 8 on from the
// prompt, wherever they stand. attention_mask gains 3 ones; position_ids
// become 0..N+S-1 (PEFT ignores given ones). The lengthening Concats are
// marked for the generation entries. The table freezes.
// CHECK:       sd.peft = {first_virtual_id = 8 : i64, num_virtual_tokens = 3 : i64, peft_type = "PROMPT_TUNING", prompt_tuning_init = "RANDOM", prompt_tuning_init_text = "", token_dim = 4 : i64, tokenizer_name_or_path = ""}
// CHECK-DAG:   sd.global @emb "frozen"
// CHECK-DAG:   sd.global @prompt_embeddings "trainable" : tensor<3x4xf32> = dense_resource
// CHECK-LABEL: func.func @infer
// CHECK-SAME:  (%[[TOK:[^:]*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "input_ids"}, %[[MASK:[^:]*]]: tensor<?x?xi64> {{.*}}sd.name = "attention_mask"}) -> tensor<?x?x8xf32>
// CHECK:       %[[IDS:.*]] = sd.constant dense<{{\[\[}}8, 9, 10]]> : tensor<1x3xi64>
// CHECK:       %[[FRONT:.*]] = sd.expand %[[IDS]]
// CHECK:       %[[LONGER:.*]] = sd.concat %[[FRONT]], %[[TOK]] {axis = 1 : i64, sd.virtual_prefix = 1 : i64}
// CHECK:       %[[ONES:.*]] = sd.constant_of_shape {{.*}}value = 1.0
// CHECK:       %[[MASK2:.*]] = sd.concat %[[ONES]], %[[MASK]] {axis = 1 : i64, sd.virtual_prefix = 1 : i64}
// CHECK:       sd.shape %[[LONGER]] {end = 2 : i64, start = 1 : i64}
// CHECK:       %[[RANGE:.*]] = sd.range
// CHECK:       %[[POS:.*]] = sd.unsqueeze %[[RANGE]]
// CHECK:       %[[V:.*]] = sd.constant dense<8> : tensor<i64>
// CHECK:       %[[ISV:.*]] = sd.greater_or_equal %[[LONGER]], %[[V]]
// CHECK:       %[[SLOT:.*]] = sd.sub %[[LONGER]], %[[V]]
// CHECK:       %[[SLOT0:.*]] = sd.max %[[SLOT]]
// CHECK:       %[[OWNID:.*]] = sd.min %[[LONGER]]
// CHECK:       %[[OWN:.*]] = sd.gather %{{.*}}, %[[OWNID]]
// CHECK:       %[[P:.*]] = sd.global_load @prompt_embeddings
// CHECK:       %[[VROWS:.*]] = sd.gather %[[P]], %[[SLOT0]]
// CHECK:       %[[COND:.*]] = sd.unsqueeze %[[ISV]]
// CHECK:       %[[ROWS:.*]] = sd.where %[[COND]], %[[VROWS]], %[[OWN]]
// CHECK:       sd.gather %{{.*}}, %[[POS]]
// CHECK:       sd.add %[[ROWS]]
// CHECK:       sd.cast %[[MASK2]]

// The sft loss: labels get 3 uncounted (-100) positions in front, then shift,
// so the last virtual token's scores meet the first token.
// SFT-LABEL:   func.func @eval_step
// SFT-SAME:    %[[IDS:[^:]*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "input_ids"}
// SFT-SAME:    %[[LABELS:[^:]*]]: tensor<?x?xi64> {sd.dim_params = ["batch", "seq"], sd.name = "labels"}
// SFT:         %[[N:.*]] = sd.constant dense<-100> : tensor<i64>
// SFT:         %[[PADDED:.*]] = sd.pad %[[LABELS]], %{{.*}}, %[[N]]
// SFT:         sd.slice %[[PADDED]]
// SFT:         sd.softmax_cross_entropy_loss

// Generation entries take the virtual ids as tokens (the generator feeds
// them first): the marked Concats stand for their last operand, so the
// lookup reads the entry's tokens as they are.
// KV-LABEL:    func.func @prefill
// KV-SAME:     (%[[T:[^:]*]]: tensor<?x?xi64>
// KV-NOT:      sd.virtual_prefix
// KV:          %[[ISV:.*]] = sd.greater_or_equal %[[T]]
// KV:          sd.where
// KV-LABEL:    func.func @decode

// --prompt-init vocab: each virtual token starts at a table row.
// VOCAB:       prompt_tuning_init = "SAMPLE_VOCAB"
// VOCAB:       sd.global @prompt_embeddings "trainable" : tensor<2x4xf32>
module {
  sd.global @emb "trainable" : tensor<8x4xf32> = dense<[[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0],
      [3.0, 3.0, 3.0, 3.0], [4.0, 4.0, 4.0, 4.0], [5.0, 5.0, 5.0, 5.0], [6.0, 6.0, 6.0, 6.0], [7.0, 7.0, 7.0, 7.0]]> : tensor<8x4xf32>
  func.func @infer(%ids: tensor<?x?xi64> {sd.name = "input_ids", sd.dim_params = ["batch", "seq"]},
                   %mask: tensor<?x?xi64> {sd.name = "attention_mask", sd.dim_params = ["batch", "seq"]},
                   %pos: tensor<?x?xi64> {sd.name = "position_ids", sd.dim_params = ["batch", "seq"]}) -> tensor<?x?x8xf32>
      attributes {sd.entry = "infer", sd.output_names = ["logits"]} {
    %e = sd.global_load @emb : tensor<8x4xf32>
    %h = sd.gather %e, %ids : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %p = sd.gather %e, %pos : (tensor<8x4xf32>, tensor<?x?xi64>) -> tensor<?x?x4xf32>
    %s = sd.add %h, %p : (tensor<?x?x4xf32>, tensor<?x?x4xf32>) -> tensor<?x?x4xf32>
    %mf = sd.cast %mask {to = 1 : i64} : (tensor<?x?xi64>) -> tensor<?x?xf32>
    %axes = sd.constant dense<[2]> : tensor<1xi64>
    %m3 = sd.unsqueeze %mf, %axes : (tensor<?x?xf32>, tensor<1xi64>) -> tensor<?x?x1xf32>
    %x = sd.mul %s, %m3 : (tensor<?x?x4xf32>, tensor<?x?x1xf32>) -> tensor<?x?x4xf32>
    %none = sd.none
    %l = sd.linear %x, %e, %none {layout = "oi", module = "head"} : (tensor<?x?x4xf32>, tensor<8x4xf32>, none) -> tensor<?x?x8xf32>
    return %l : tensor<?x?x8xf32>
  }
}
