#!/usr/bin/env python3
"""LSTM and GRU, inference and a training step, against ONNX Runtime and
PyTorch at the same threads, in one run (issue 16):

Inference: a speech-style frame tagger (80 features, 2-layer bidirectional
RNN of hidden 128, linear head to 32 classes; batch 4, 100 frames), exported
by torch.onnx (TorchScript mode, opset 17). Peers: sdrun bench, ONNX Runtime
(ORT_ENABLE_ALL), PyTorch eager (no_grad).

Training step: a language model (embedding 128, one RNN layer of hidden 256,
vocab 256; batch 4 x 64 tokens), full fine-tuning with AdamW. Peers: sdrun
bench --entry train_step, PyTorch eager. ONNX Runtime Training is not run here.

Every peer runs in its own process (PyTorch's OpenMP workers would otherwise
take the cores from the others). Times are medians of --iterations.

  bench/recurrent_bench.py [--build build] [--threads 2] [--iterations 20]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peers import bench_cli, cpu_model, one_line, run_child, table, timed, versions  # noqa: E402

FEATS, HIDDEN, CLASSES, BATCH, FRAMES = 80, 128, 32, 4, 100
VOCAB, EMB, LM_HIDDEN, SEQ = 256, 128, 256, 64


def tagger(kind):
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(FEATS, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)
            self.head = torch.nn.Linear(2 * HIDDEN, CLASSES)

        def forward(self, feats):
            return self.head(self.rnn(feats)[0])
    torch.manual_seed(0)
    return Tagger().eval()


def language_model(kind):
    import torch

    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, EMB)
            self.rnn = getattr(torch.nn, kind)(EMB, LM_HIDDEN, batch_first=True)
            self.head = torch.nn.Linear(LM_HIDDEN, VOCAB)

        def forward(self, ids):
            return self.head(self.rnn(self.emb(ids))[0])
    torch.manual_seed(0)
    return Lm()


def child(a):
    """One PyTorch or ONNX Runtime peer; prints {"median_ms": ...}."""
    import numpy as np
    import torch
    torch.set_num_threads(a.threads)
    if a.peer == "ort":
        from ort_run import make_session
        sess = make_session(a.model, a.threads, "all")
        feeds = {"feats": np.random.default_rng(0).standard_normal((BATCH, FRAMES, FEATS)).astype(np.float32)}
        ms = timed(lambda: sess.run(None, feeds), a.iterations, 5)
    elif a.peer == "torch-infer":
        model = tagger(a.kind)
        feats = torch.randn(BATCH, FRAMES, FEATS)

        def run():
            with torch.no_grad():
                model(feats)
        ms = timed(run, a.iterations, 5)
    else:
        import torch.nn.functional as F
        model = language_model(a.kind)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))

        def step():
            opt.zero_grad(set_to_none=True)
            logits = model(ids)
            F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
            opt.step()
        ms = timed(step, a.iterations, 3)
    print(json.dumps({"median_ms": ms}))


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__, ("peer", "kind", "model"))
    if a.peer:
        return child(a)
    import torch
    infer_rows, train_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("LSTM", "GRU"):
            row = {"model": f"{kind} tagger"}
            onnx_path = os.path.join(tmp, f"{kind}.onnx")
            torch.onnx.export(tagger(kind), (torch.randn(BATCH, FRAMES, FEATS),), onnx_path, dynamo=False,
                              opset_version=17, input_names=["feats"], output_names=["logits"])
            plan = os.path.join(tmp, f"{kind}.sdp")
            try:
                subprocess.run([sdc, "compile", onnx_path, "--shapes", f"feats={BATCH}x{FRAMES}x{FEATS}", "-o", plan],
                               check=True, capture_output=True)
                row["sdrun"] = run_child([sdrun, "bench", plan, "--iterations", str(a.iterations), "--warmup", "5",
                                          "--threads", str(a.threads)])["median_ms"]
            except Exception as e:  # a peer that fails is reported, never dropped
                row["sdrun"] = one_line(e)
            for peer in ("ort", "torch-infer"):
                try:
                    row[peer] = run_child(me + ["--peer", peer, "--kind", kind, "--model", onnx_path])["median_ms"]
                except Exception as e:
                    row[peer] = one_line(e)
            infer_rows.append(row)

            row = {"model": f"{kind} LM"}
            lm_path = os.path.join(tmp, f"{kind}_lm.onnx")
            torch.onnx.export(language_model(kind), (torch.zeros(BATCH, SEQ, dtype=torch.long),), lm_path,
                              dynamo=False, opset_version=17, input_names=["input_ids"], output_names=["logits"])
            lm_plan = os.path.join(tmp, f"{kind}_lm.sdp")
            data = os.path.join(tmp, "data.jsonl")
            with open(data, "w") as f:
                for i in range(BATCH):
                    f.write(json.dumps({"input_ids": [(i * 7 + j * 13) % VOCAB for j in range(SEQ)]}) + "\n")
            try:
                subprocess.run([sdc, "compile", lm_path, "--peft", "none", "--shapes", f"input_ids={BATCH}x{SEQ}",
                                "-o", lm_plan], check=True, capture_output=True)
                row["sdrun"] = run_child([sdrun, "bench", lm_plan, "--entry", "train_step", "--data", data,
                                          "--iterations", str(a.iterations), "--warmup", "3", "--threads",
                                          str(a.threads)])["median_ms"]
            except Exception as e:
                row["sdrun"] = one_line(e)
            try:
                row["torch-train"] = run_child(me + ["--peer", "torch-train", "--kind", kind])["median_ms"]
            except Exception as e:
                row["torch-train"] = one_line(e)
            train_rows.append(row)
    print(f"CPU: {cpu_model()}, {a.threads} threads; versions: {json.dumps(versions())}")
    print(f"\nInference, batch {BATCH} x {FRAMES} frames, ms (x: relative to sdrun)\n")
    print(table(infer_rows, ["model"], ["sdrun", "ort", "torch-infer"], "sdrun"))
    print(f"\nTraining step (AdamW), batch {BATCH} x {SEQ} tokens, ms\n")
    print(table(train_rows, ["model"], ["sdrun", "torch-train"], "sdrun"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
