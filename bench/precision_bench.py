#!/usr/bin/env python3
"""Mixed precision on the CPU: a LoRA and a full fine-tuning step of the demo
GPT (d 128, 2 layers, 4 heads, 128 tokens, batch 4) compiled with
--precision fp32, bf16 and fp16 (`sdrun bench --entry train_step`), against
PyTorch eager in f32 and under torch.autocast("cpu", bfloat16), same model,
batch and threads, in one run. On the CPU the half types are storage types:
sdc's kernels compute them through f32 (frozen weights widened once when the
session is created, activations converted per step), PyTorch runs bf16
kernels where it has them.

  bench/precision_bench.py [--build build] [--threads 2] [--iterations 20]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
from peers import bench_cli, cpu_model, one_line, run_child, table, versions  # noqa: E402
from train_bench import LORA_R, LORA_TARGETS, export_gpt_and_batch, torch_gpt  # noqa: E402

D, LAYERS, HEADS, SEQ, BATCH = 128, 2, 4, 128, 4


def torch_child(a):
    import time
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    model = torch_gpt(D, LAYERS, HEADS, SEQ, a.mode)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, 256, (BATCH, SEQ))
    times = []
    for i in range(3 + a.iterations):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.peer == "torch-bf16"):
            logits = model(ids).float()
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    print(json.dumps({"median_ms": times[len(times) // 2]}))


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__, ("peer", "mode"))
    if a.peer:
        return torch_child(a)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, data = export_gpt_and_batch(tmp, "gpt", D, LAYERS, HEADS, SEQ, BATCH)
        for mode in ("lora", "full"):
            row = {"step": f"{mode}, batch {BATCH} x {SEQ}"}
            peft = ["--peft", "lora", "--target-modules", ",".join(LORA_TARGETS), "--lora-r", str(LORA_R)] \
                if mode == "lora" else ["--peft", "none"]
            for precision in ("fp32", "bf16", "fp16"):
                plan = os.path.join(tmp, f"{mode}_{precision}.sdp")
                try:
                    subprocess.run([sdc, "compile", onnx_path, "--shapes", f"input_ids={BATCH}x{SEQ}", "--precision",
                                    precision, "-o", plan] + peft, check=True, capture_output=True)
                    row[f"sdrun {precision}"] = run_child(
                        [sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--iterations",
                         str(a.iterations), "--warmup", "3", "--threads", str(a.threads)])["median_ms"]
                except Exception as e:  # a peer that fails is reported, never dropped
                    row[f"sdrun {precision}"] = one_line(e)
            for peer in ("torch-f32", "torch-bf16"):
                try:
                    row[peer] = run_child(me + ["--peer", peer, "--mode", mode])["median_ms"]
                except Exception as e:
                    row[peer] = one_line(e)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; versions: {json.dumps(versions())}")
    print("\nTraining step (AdamW), ms (x: relative to sdrun fp32)\n")
    print(table(rows, ["step"], ["sdrun fp32", "sdrun bf16", "sdrun fp16", "torch-f32", "torch-bf16"], "sdrun fp32"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
