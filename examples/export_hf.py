#!/usr/bin/env python3
"""Builds a tiny Hugging Face transformers model from its config with seeded
random weights (nothing is downloaded) and exports it with torch.onnx.export
(TorchScript mode, as most users still export), beside the transformers
checkpoint PEFT loads as its base model:

  DIR/hf/           save_pretrained: config.json + model.safetensors
  DIR/model.onnx    input_ids [batch, seq] -> logits [batch, seq, vocab]

Usage: export_hf.py --arch gpt2|llama|qwen2|mistral --out DIR [--seed 0] [--opset 17]
                    [--fixed-batch B --seq S] [--token-input NAME]
"""
import argparse
import os

import torch
import transformers
import transformers.masking_utils

ARCHS = {
    # GPT-2 stores its Conv1D weights [in, out]: PEFT needs fan_in_fan_out.
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4, use_cache=False,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager")),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, use_cache=False, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")),
    # q/k/v projections with biases.
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, use_cache=False, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")),
    # A sliding window longer than any sequence here: the mask is the causal one.
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=128, sliding_window=4096, use_cache=False,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")),
    # Phi-2's decoder: partial rotary (a quarter of each 64-wide head: onnxruntime's GroupQueryAttention wants
    # the rotated half-width a multiple of 8), LayerNorm, a GELU MLP (fc1, fc2), attention and MLP in parallel
    # off one norm, q/k/v and dense with biases.
    "phi": lambda: transformers.PhiForCausalLM(transformers.PhiConfig(
        vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, partial_rotary_factor=0.25, use_cache=False,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")),
    # Phi-3 (mini, 4k: no long-context rotary scaling): q/k/v in one qkv_proj and gate/up in one gate_up_proj
    # (split in the graph), RMSNorm, full rotary.
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=128, use_cache=False,
        tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")),
    # Cohere (Command R): rotary on interleaved pairs (x[..., ::2], x[..., 1::2]) written out in the graph,
    # LayerNorm without bias, parallel attention and MLP, scaled logits.
    "cohere": lambda: transformers.CohereForCausalLM(transformers.CohereConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, use_cache=False, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="eager")),
}


def build(arch, seed):
    torch.manual_seed(seed)
    model = ARCHS[arch]().eval()
    # Fresh biases are all zero and LayerNorm weights all one: give them values
    # so tests see every parameter (and the exporter keeps them apart).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def export(model, path, opset, batch, seq, token_input="input_ids", fixed_batch=False):
    """TorchScript export of logits only. Naming the graph input sets the
    input's name; the model's own attribute path names every node scope
    (/transformer/h.0/attn/c_attn/Gemm), which is what PEFT's module names are."""
    # transformers' packed-sequence check traces to aten::diff, which the
    # TorchScript exporter cannot export; an export is never packed.
    transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None
    forward = type(model).forward
    model.forward = lambda ids: forward(model, input_ids=ids, use_cache=False).logits
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    dynamic = None if fixed_batch else {token_input: {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    try:
        torch.onnx.export(model, (ids,), path, input_names=[token_input], output_names=["logits"],
                          opset_version=opset, dynamo=False, dynamic_axes=dynamic)
    finally:
        del model.forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--fixed-batch", type=int, default=0, help="export without dynamic axes, at this batch")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--token-input", default="input_ids", help="name of the ONNX token input")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model = build(a.arch, a.seed)
    model.save_pretrained(os.path.join(a.out, "hf"))
    export(model, os.path.join(a.out, "model.onnx"), a.opset, a.fixed_batch or 2, a.seq, a.token_input,
           fixed_batch=a.fixed_batch > 0)
    print(f"exported {a.arch} to {a.out}")


if __name__ == "__main__":
    main()
