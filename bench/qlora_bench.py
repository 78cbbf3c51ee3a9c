#!/usr/bin/env python3
"""One QLoRA training step, sdrun against PEFT on bitsandbytes' 4-bit model,
on the Llama-architecture model, batch, sequence and thread count of
bench/peft_methods_bench.py, in one run:

  LoRA r = 8 on q/k/v/o and the MLP projections; every linear weight but
  the head in NF4 (blocks of 64), computing in f32

sdrun: `sdrun bench PLAN --entry train_step --data` on a --quantize nf4 plan
(each weight dequantized just before each op that reads it, forward and
backward), and the same LoRA plan in f32 for reference. PEFT: the model
loaded by transformers with BitsAndBytesConfig(load_in_4bit, nf4, compute
f32), in training mode (bitsandbytes' f32 dequantize-and-multiply), the
shifted cross-entropy, backward and torch.optim.AdamW. Each peer in its own
process with the same threads. Median milliseconds per step, and the plans'
weight and arena bytes (sdrun inspect).

  bench/qlora_bench.py [--build build] [--threads 2] [--iterations 20]
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from peers import bench_cli, cpu_model, run_child, table, versions  # noqa: E402
from peft_methods_bench import (ALPHA, BATCH, HEADS, HIDDEN, INTERMEDIATE, LAYERS, R, SEQ, TARGETS, VOCAB,  # noqa: E402
                                build_model, causal_lm_step_ms)


def peft_child(folder, threads, iterations):
    """PEFT's QLoRA on bitsandbytes' 4-bit model: the median ms of one AdamW step, as JSON."""
    import warnings
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, device_map="cpu", dtype=torch.float32, quantization_config=transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32))
    model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    print(json.dumps({"median_ms": causal_lm_step_ms(model.train(), iterations)}))


def inspect_bytes(sdrun, plan):
    out = subprocess.run([sdrun, "inspect", plan], check=True, capture_output=True, text=True).stdout
    line = lambda key: next(l for l in out.splitlines() if l.startswith(key))
    return int(line("weights:").split()[1]), int(line("arena:").split()[1])


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__, hidden=("peer", "folder"))
    if a.peer:
        return peft_child(a.folder, a.threads, a.iterations)
    import numpy as np
    import export_hf
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model()
        hf, onnx_path, data = (os.path.join(tmp, n) for n in ("hf", "llama.onnx", "train.jsonl"))
        model.save_pretrained(hf)
        export_hf.export(model, onnx_path, 17, BATCH, SEQ)
        rng = np.random.default_rng(1)
        with open(data, "w") as f:
            for _ in range(4 * BATCH):
                f.write(json.dumps({"input_ids": rng.integers(0, VOCAB, SEQ).tolist()}) + "\n")
        for name, extra in (("QLoRA (NF4)", ["--quantize", "nf4"]), ("LoRA (f32)", [])):
            plan = os.path.join(tmp, "plan.sdp")
            subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA),
                            "--target-modules", ",".join(TARGETS), *extra, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o",
                            plan], check=True, capture_output=True)
            weights, arena = inspect_bytes(sdrun, plan)
            row = {"step": name, "weight MB": round(weights / 1e6, 2), "arena MB": round(arena / 1e6, 2)}
            row["sdrun"] = run_child([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads",
                                      str(a.threads), "--iterations", str(a.iterations), "--warmup", "3"])["median_ms"]
            if extra:
                row["PEFT + bitsandbytes"] = run_child(me + ["--peer", "qlora", "--folder", hf], env)["median_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nCPU: {cpu_model()}, {a.threads} threads; {json.dumps(versions())}")
    print(f"Llama d={HIDDEN} ffn={INTERMEDIATE} L={LAYERS} heads={HEADS} vocab={VOCAB}, batch {BATCH} x {SEQ}, "
          f"r={R}; median ms per AdamW step (x: peer / sdrun), plan weight and arena MB")
    print(table(rows, ["step", "weight MB", "arena MB"], ["sdrun", "PEFT + bitsandbytes"], "sdrun"))


if __name__ == "__main__":
    sys.exit(main())
