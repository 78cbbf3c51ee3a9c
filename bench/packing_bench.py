#!/usr/bin/env python3
"""Sequence packing: LoRA training throughput on short examples, padded
(one example per row) against packed (sdc compile --packing), same model,
data, batch and threads, in one run. The data is the train demo's: one
fortune-mod fortune per example. Reports trained tokens per second (tokens
with a label, what the loss averages over) and tokens per step; the first
steps are skipped as warm-up.

  bench/packing_bench.py [--build build] [--steps 60] [--threads 2]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORTUNES = ["/usr/share/games/fortunes/" + f for f in ("fortunes", "literature", "riddles")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    sdc, sdrun = (os.path.join(args.build, "tools", t) for t in ("sdc", "sdrun"))
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    from export_models import Gpt, export_gpt
    tmp = tempfile.mkdtemp(prefix="sd_packing_bench_")
    try:
        torch.manual_seed(0)
        onnx_path = os.path.join(tmp, "gpt.onnx")
        export_gpt(Gpt(d=128, layers=4, heads=4, block=128), onnx_path, torch.zeros((8, 128), dtype=torch.long), 17)
        data = os.path.join(tmp, "fortune.jsonl")
        text = b"".join(open(f, "rb").read() for f in FORTUNES)
        with open(data, "wb") as out:
            subprocess.run([sys.executable, os.path.join(ROOT, "examples", "text_to_jsonl.py"), "--chunk", "128",
                            "--records", "%"], input=text, stdout=out, check=True)
        lengths = [len(json.loads(l)["text"]) for l in open(data)]
        print(f"data: {len(lengths)} fortunes, mean {statistics.mean(lengths):.1f} bytes; model d=128, 4 layers, "
              f"rows 8x128, LoRA r=16 on qkv,proj,fc1,fc2, {args.threads} threads")
        lora = ["--peft", "lora", "--target-modules", "qkv,proj,fc1,fc2", "--lora-r", "16", "--lora-alpha", "32",
                "--shapes", "input_ids=8x128"]
        env = dict(os.environ)
        env.pop("OPENBLAS_CORETYPE", None)
        results = {}
        for mode, extra in (("padded", []), ("packed", ["--packing"])):
            plan, metrics = os.path.join(tmp, mode + ".sdp"), os.path.join(tmp, mode + ".jsonl")
            subprocess.run([sdc, "compile", onnx_path, *lora, *extra, "-o", plan], check=True)
            subprocess.run([sdrun, "train", plan, "--data", data, "--steps", str(args.steps), "--threads",
                            str(args.threads), "--lr", "1e-3", "--metrics", metrics], check=True, env=env,
                           stderr=subprocess.DEVNULL)
            steps = [json.loads(l) for l in open(metrics)][args.warmup:]
            seconds = sum(s["tokens"] / s["tokens_per_s"] for s in steps)
            tokens = sum(s["tokens"] for s in steps)
            results[mode] = (tokens / seconds, tokens / len(steps), 1000 * seconds / len(steps))
            print(f"{mode}: {results[mode][0]:.0f} trained tokens/s, {results[mode][1]:.0f} tokens/step "
                  f"(of {8 * 127} label slots), {results[mode][2]:.1f} ms/step")
        print(json.dumps({"packed_over_padded_tokens_per_s": results["packed"][0] / results["padded"][0]}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
