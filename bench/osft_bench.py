#!/usr/bin/env python3
"""OSFT training step: sdc's plan against our own LoRA and full fine-tuning
steps and against two PyTorch peers on the same model, batch and threads, in
one run (issue 14):

  PEFT OSF        peft's OSFConfig (base weight plus a rank-2r delta every
                  forward, gradient hooks; no re-projection)
  torch factored  the factorized forward and factored gradient projection
                  written in PyTorch, with the parameter re-projection

Model: LlamaForCausalLM from a config with seeded random weights (hidden
256, MLP 688, 2 layers, vocab 256), every linear layer but the head
targeted. Times are medians of --steps optimizer steps after 3 warm-up steps.

Usage: bench/osft_bench.py [--build build] [--threads 2] [--steps 10]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, LR = 4, 128, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model():
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                                   use_cache=False, tie_word_embeddings=False, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


# sdrun's loop through the Python module, in its own process: PyTorch's
# OpenMP workers keep spinning after a step, and in the same process they
# would take the cores from sdc's thread pool.
SDC_TIMER = """
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
import sdc
plan, data, steps, threads, lr = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
trainer = sdc.Trainer(sdc.Session(sdc.Plan(plan), threads=threads), data, steps=steps + 3, lr=lr, shuffle=False)
times, last = [], time.perf_counter()
for i, _ in enumerate(trainer):
    now = time.perf_counter()
    if i >= 3:
        times.append(now - last)
    last = now
print(statistics.median(times))
"""


def time_sdc(build, plan, data, steps, threads):
    out = subprocess.run([sys.executable, "-c", SDC_TIMER, os.path.join(build, "python"), plan, data, str(steps),
                          str(threads), str(LR)], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def time_torch(model, params, steps, after_step=None):
    import torch
    opt = torch.optim.AdamW(params, lr=LR)
    rng = np.random.default_rng(0)
    model.train()
    times = []
    for i in range(steps + 3):
        batch = torch.tensor(rng.integers(0, 256, (BATCH, SEQ)))
        t0 = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if after_step:
            after_step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peft_osf(ratio, steps):
    from peft import OSFConfig, get_peft_model
    model = get_peft_model(build_model(), OSFConfig(target_modules=TARGETS, effective_rank=ratio))
    return time_torch(model, [p for p in model.parameters() if p.requires_grad], steps)


def torch_factored(ratio, steps):
    import torch
    model = build_model()
    for p in model.parameters():
        p.requires_grad_(False)
    lows, params = [], []
    for name, layer in list(model.named_modules()):
        if not name.split(".")[-1] in TARGETS:
            continue
        w = layer.weight.detach().double()
        u, s, vt = torch.linalg.svd(w, full_matrices=False)
        k = int(min(w.shape) * ratio)
        uh, sh, vh = u[:, :k].float(), s[:k].float(), vt[:k].float()
        p = [torch.nn.Parameter(a.float().contiguous()) for a in (u[:, k:], s[k:], vt[k:])]
        p[0].register_hook(lambda g, uh=uh: g - uh @ (uh.T @ g))
        p[2].register_hook(lambda g, vh=vh: g - (g @ vh.T) @ vh)
        layer.forward = lambda x, uh=uh, sh=sh, vh=vh, p=p: ((x @ vh.T) * sh) @ uh.T + ((x @ p[2].T) * p[1]) @ p[0].T
        lows.append((uh, vh, p))
        params += p

    def reproject():
        with torch.no_grad():
            for uh, vh, p in lows:
                p[0] -= uh @ (uh.T @ p[0])
                p[2] -= (p[2] @ vh.T) @ vh
    return time_torch(model, params, steps, reproject)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    import torch
    import export_hf
    torch.set_num_threads(args.threads)
    sdc_bin = os.path.join(args.build, "tools", "sdc")
    tmp = tempfile.mkdtemp(prefix="sd_osft_bench_")
    try:
        onnx_path = os.path.join(tmp, "model.onnx")
        export_hf.export(build_model(), onnx_path, opset=17, batch=BATCH, seq=SEQ)
        data = os.path.join(tmp, "train.jsonl")
        rng = np.random.default_rng(1)
        with open(data, "w") as f:
            for _ in range(BATCH * (args.steps + 3)):
                f.write(json.dumps({"input_ids": rng.integers(0, 256, SEQ).tolist()}) + "\n")
        shapes = ["--shapes", f"input_ids={BATCH}x{SEQ}"]
        targets = ",".join(TARGETS)

        def ours(name, flags):
            plan = os.path.join(tmp, name + ".sdp")
            subprocess.run([sdc_bin, "compile", onnx_path, *flags, *shapes, "-o", plan], check=True)
            return time_sdc(args.build, plan, data, args.steps, args.threads)

        full = ours("full", ["--peft", "none"])
        torch_full_model = build_model()
        torch_full = time_torch(torch_full_model, list(torch_full_model.parameters()), args.steps)
        lora = ours("lora", ["--peft", "lora", "--target-modules", targets, "--lora-r", "16"])
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        print(f"CPU: {cpu}; threads {args.threads}; torch {torch.__version__}; batch {BATCH} x seq {SEQ}")
        print(f"sdc full fine-tuning step {full * 1e3:.1f} ms (PyTorch eager {torch_full * 1e3:.1f} ms); "
              f"sdc LoRA r=16 step {lora * 1e3:.1f} ms\n")
        print("| preserved ratio | sdc OSFT ms | / sdc full FT | / sdc LoRA | sdc strategies | PEFT OSF ms | "
              "torch factored ms | faster peer / sdc |")
        print("|---:|---:|---:|---:|---|---:|---:|---:|")
        for ratio in (0.25, 0.5, 0.75):
            flags = ["--peft", "osft", "--target-modules", targets, "--osft-preserved-ratio", str(ratio)]
            t = ours(f"osft{ratio}", flags)
            dry = subprocess.run([sdc_bin, "compile", onnx_path, *flags, *shapes, "--dry-run"], check=True,
                                 capture_output=True, text=True).stdout
            dense = dry.count("strategy=dense")
            strategies = f"{dense} dense, {dry.count('strategy=factored')} factored"
            p, f = peft_osf(ratio, args.steps), torch_factored(ratio, args.steps)
            print(f"| {ratio} | {t * 1e3:.1f} | {t / full:.2f} | {t / lora:.2f} | {strategies} | {p * 1e3:.1f} | "
                  f"{f * 1e3:.1f} | {min(p, f) / t:.2f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
