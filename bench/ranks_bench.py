#!/usr/bin/env python3
"""Data-parallel training on CPU ranks (mpirun), three measurements in one run:

1. the communicator's all-reduce bandwidth against a raw MPI_Allreduce loop
   (build/bench/sd_allreduce_bench under mpirun -np 2);
2. bucketed gradient reduction (sdc compile default, 25 MiB buckets) against
   one reduction per gradient (--bucket-mb 0), 2 ranks, full fine-tuning;
   and 1 MiB buckets each reduced while the rest of the backward runs (the
   default overlap) against the same buckets reduced after the backward
   (--no-overlap-reduction);
3. scaling: 2 ranks x 1 thread against 1 rank x 2 threads on the same global
   batch;
4. the same step with optimizer state (--shard optimizer), gradients
   (--shard grads) and the weights themselves (--shard params, FSDP: every
   weight gathered before each op that reads it) sharded over the 2 ranks.

Step times are the median over the steps after the first two, from the
metrics file's elapsed_s. Prints Markdown tables for bench/RESULTS.md.

    .venv/bin/python bench/ranks_bench.py [--build build] [--d-model 256 --layers 4 --seq 128]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr[-1500:]}")
    return r.stdout


def step_ms(metrics):
    with open(metrics) as f:
        t = [json.loads(l)["elapsed_s"] for l in f if '"elapsed_s"' in l]
    return float(np.median(np.diff(t[1:]))) * 1e3


def train(sdrun, plan, data, ranks, threads, batch, steps, tmp, tag):
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    cmd = [sdrun, "train", plan, "--data", data, "--steps", str(steps), "--batch", str(batch), "--threads",
           str(threads), "--metrics", metrics, "--no-shuffle"]
    sh((MPIRUN + ["-np", str(ranks)] if ranks > 1 else []) + cmd)
    return step_ms(metrics)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    sdc, sdrun = os.path.join(a.build, "tools", "sdc"), os.path.join(a.build, "tools", "sdrun")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs; {sh(['mpirun', '--version']).splitlines()[0]}\n")

    print("### All-reduce bandwidth, 2 ranks (f32, in place)\n")
    out = sh(MPIRUN + ["-np", "2", os.path.join(a.build, "bench", "sd_allreduce_bench")])
    print("| bytes | sdc us | sdc algbw GB/s | sdc busbw GB/s | raw MPI_Allreduce us | MPI algbw | MPI busbw | sdc nonblocking us |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for line in out.splitlines():
        if not line.startswith("#"):
            print("| " + " | ".join(line.split("\t")) + " |")

    tmp = tempfile.mkdtemp(prefix="sd_ranks_bench_")
    try:
        gpt = os.path.join(tmp, "gpt")
        sh([sys.executable, os.path.join(ROOT, "examples", "export_models.py"), "--out", gpt, "--only", "gpt",
            "--d-model", str(a.d_model), "--layers", str(a.layers), "--heads", "4", "--seq", str(a.seq), "--batch", "1"])
        rng = np.random.default_rng(0)
        data = os.path.join(tmp, "train.jsonl")
        with open(data, "w") as f:
            for _ in range(a.global_batch * (a.steps + 2)):
                f.write(json.dumps({"input_ids": rng.integers(0, 256, a.seq).tolist()}) + "\n")
        # Each rank's plan holds its own rows (--batch is per rank), as a per-device batch does.
        half = a.global_batch // 2
        plans = {}
        for name, batch, extra in [("bucketed", half, []), ("per_tensor", half, ["--bucket-mb", "0"]),
                                   ("overlap_1mb", half, ["--bucket-mb", "1"]),
                                   ("after_1mb", half, ["--bucket-mb", "1", "--no-overlap-reduction"]),
                                   ("zero1", half, ["--shard", "optimizer"]), ("zero2", half, ["--shard", "grads"]),
                                   ("fsdp", half, ["--shard", "params"]),
                                   ("one_rank", a.global_batch, [])]:
            plans[name] = os.path.join(tmp, name + ".sdp")
            sh([sdc, "compile", os.path.join(gpt, "gpt.onnx"), "--peft", "none", "--shapes",
                f"input_ids={batch}x{a.seq}", *extra, "-o", plans[name]])
        grads = os.path.getsize(os.path.join(gpt, "gpt.onnx")) / 2 ** 20
        print(f"\n### Full fine-tuning step, GPT d={a.d_model}, {a.layers} layers, seq {a.seq}, global batch "
              f"{a.global_batch} (~{grads:.0f} MiB of gradients), median ms per step\n")
        b = train(sdrun, plans["bucketed"], data, 2, 1, half, a.steps, tmp, "b")
        p = train(sdrun, plans["per_tensor"], data, 2, 1, half, a.steps, tmp, "p")
        ov = train(sdrun, plans["overlap_1mb"], data, 2, 1, half, a.steps, tmp, "ov")
        af = train(sdrun, plans["after_1mb"], data, 2, 1, half, a.steps, tmp, "af")
        z1 = train(sdrun, plans["zero1"], data, 2, 1, half, a.steps, tmp, "z1")
        z2 = train(sdrun, plans["zero2"], data, 2, 1, half, a.steps, tmp, "z2")
        z3 = train(sdrun, plans["fsdp"], data, 2, 1, half, a.steps, tmp, "z3")
        one2 = train(sdrun, plans["one_rank"], data, 1, 2, a.global_batch, a.steps, tmp, "o2")
        one1 = train(sdrun, plans["one_rank"], data, 1, 1, a.global_batch, a.steps, tmp, "o1")
        print("| run | ms per step | tokens/s |")
        print("|---|---:|---:|")
        tok = a.global_batch * a.seq
        for label, ms in [("2 ranks x 1 thread, 25 MiB buckets", b), ("2 ranks x 1 thread, one reduction per gradient", p),
                          ("2 ranks x 1 thread, 1 MiB buckets reduced during the backward", ov),
                          ("2 ranks x 1 thread, 1 MiB buckets reduced after the backward", af),
                          ("2 ranks x 1 thread, --shard optimizer", z1), ("2 ranks x 1 thread, --shard grads", z2),
                          ("2 ranks x 1 thread, --shard params", z3),
                          ("1 rank x 2 threads", one2), ("1 rank x 1 thread", one1)]:
            print(f"| {label} | {ms:.1f} | {tok / ms * 1e3:.0f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
