#!/usr/bin/env python3
"""Pieces of scripts/llm_demo.sh: a byte-level BPE tokenizer trained on the King
James Bible with the `tokenizers` library (ChatML special tokens and chat
template in its tokenizer_config.json), a small Llama-architecture model from
a transformers config with seeded random weights exported to ONNX, and the
data: one verse per {"text"} line for pre-training, and chat conversations
("What does Proverbs 3:5 say?" -> the verse) for the LoRA fine-tuning.

  chat_demo.py tokenizer OUT_DIR      chat_demo.py model TOKENIZER_DIR OUT.onnx
  chat_demo.py data OUT_DIR
"""
import json
import os
import re
import subprocess
import sys

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
BOOKS = {"Prv": "Proverbs", "Psa": "Psalms", "Ecc": "Ecclesiastes"}


def verses(spec="Gen1:1-Rev22:21"):
    """(reference, text) per verse, from bible-kjv."""
    out = subprocess.run(["bible", "-f", spec], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        ref, _, text = line.partition(" ")
        if text:
            yield ref, text.strip()


def tokenizer(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator((t for _, t in verses()), trainers.BpeTrainer(
        vocab_size=2048, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML}, f)
    print(f"   tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens, trained on the KJV")


def model(tokenizer_dir, path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import transformers
    from export_hf import export
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).get_vocab_size()
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=128, use_cache=False, tie_word_embeddings=False,
        attn_implementation="eager")).eval()
    export(m, path, 17, 8, 128)
    params = sum(p.numel() for p in m.parameters())
    print(f"   LlamaForCausalLM: hidden 192, 4 layers, 6 heads (2 KV heads), SwiGLU 512, rotary; {params / 1e6:.1f}M params")


def data(out):
    with open(os.path.join(out, "kjv.jsonl"), "w") as f:
        for _, text in verses():
            f.write(json.dumps({"text": text}) + "\n")
    with open(os.path.join(out, "chat.jsonl"), "w") as f:
        for spec in ("Prov1:1-Prov31:31", "Psa23:1-Psa23:6", "Ecc1:1-Ecc3:8"):
            for ref, text in verses(spec):
                book, chapter, verse = re.match(r"([A-Za-z]+)(\d+):(\d+)", ref).groups()
                question = f"What does {BOOKS.get(book, book)} {chapter}:{verse} say?"
                f.write(json.dumps({"messages": [{"role": "user", "content": question},
                                                 {"role": "assistant", "content": text}]}) + "\n")


if __name__ == "__main__":
    {"tokenizer": lambda: tokenizer(sys.argv[2]), "model": lambda: model(sys.argv[2], sys.argv[3]),
     "data": lambda: data(sys.argv[2])}[sys.argv[1]]()
