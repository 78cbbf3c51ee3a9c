#!/usr/bin/env python3
"""Times one training step of sdrun (`sdrun bench --entry train_step --data`)
against PyTorch eager (.venv's torch) on the same exported GPT-style
model, batch, sequence length and thread count, in one run: LoRA and full
fine-tuning, with peak memory (max RSS of each process) and achieved GFLOP/s
against this machine's OpenBLAS sgemm rate.

  bench/train_bench.py [--threads N] [--iterations N] [--configs demo,large] [--also-no-fuse NAME]

--also-no-fuse NAME times a second plan compiled with `sdc --no-fuse NAME`
in the same run (a fusion's effect on this machine, beside the peer).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

CONFIGS = {  # d_model, layers, heads, seq, batch
    "demo": (128, 2, 4, 128, 4),
    "large": (512, 4, 8, 256, 2),
}
LORA_TARGETS = ["qkv", "proj", "fc1", "fc2"]
LORA_R = 8


def measure(cmd, env=None):
    """stdout and peak RSS (MiB) of one child process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            os.execvpe(cmd[0], cmd, env or os.environ)
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({os.waitstatus_to_exitcode(status)})")
    return b"".join(chunks).decode(), usage.ru_maxrss / 1024.0


def step_flops(d, layers, seq, batch, vocab, lora):
    tokens = batch * seq
    matmul = 12 * d * d * layers + d * vocab  # weights per token (qkv 3, proj 1, fc1 4, fc2 4; head)
    attn = 4 * seq * d * layers                # QK^T and AV per token (full causal matrices)
    fwd = 2 * tokens * matmul + tokens * attn
    # Backward: input gradients ~ forward; weight gradients ~ forward (full FT only).
    return fwd * (2 if lora else 3)


def torch_gpt(d, layers, heads, seq, mode):
    """The bench GPT in PyTorch (seed 0), with LoRA adapters on LORA_TARGETS
    when mode is "lora" (A seeded, B zero, as sdc initializes them)."""
    import numpy as np
    import torch
    from export_models import Gpt
    torch.manual_seed(0)
    model = Gpt(d=d, layers=layers, heads=heads, block=seq)
    if mode == "lora":
        sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
        from test_training import add_lora
        rng = np.random.default_rng(0)
        init = {}
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and any(name.endswith("." + t) for t in LORA_TARGETS):
                init[name] = ((rng.standard_normal((LORA_R, mod.in_features)) * 0.02).astype(np.float32),
                              np.zeros((mod.out_features, LORA_R), np.float32))
        add_lora(model, LORA_TARGETS, LORA_R, 16.0, init)
    return model


def torch_child(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    d, layers, heads, seq, batch = CONFIGS[args.config]
    model = torch_gpt(d, layers, heads, seq, args.mode)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, 256, (batch, seq))
    times = []
    for i in range(args.warmup + args.iterations):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 256), ids[:, 1:].reshape(-1), reduction="sum")
        (loss / (batch * (seq - 1))).backward()
        opt.step()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    print(json.dumps({"median_ms": times[len(times) // 2]}))


def export_gpt_and_batch(tmp, name, d, layers, heads, seq, batch):
    """The GPT of a config exported to TMP/NAME.onnx (seed 0, opset 17), and
    one batch of byte tokens as JSON Lines for sdrun bench --data."""
    import torch
    from export_models import Gpt, export_gpt
    torch.manual_seed(0)
    onnx_path = os.path.join(tmp, f"{name}.onnx")
    export_gpt(Gpt(d=d, layers=layers, heads=heads, block=seq), onnx_path, torch.zeros((batch, seq), dtype=torch.long),
               17)
    data = os.path.join(tmp, f"{name}.jsonl")
    with open(data, "w") as f:
        for i in range(batch):
            f.write(json.dumps({"input_ids": [(i * 7 + j * 13) % 256 for j in range(seq)]}) + "\n")
    return onnx_path, data


def sgemm_rate(threads):
    code = ("import numpy as np, time\n"
            "a = np.random.rand(1024, 1024).astype(np.float32); b = a.copy()\n"
            "a @ b\nbest = 1e9\n"
            "for _ in range(10):\n t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)\n"
            "print(2 * 1024 ** 3 / best / 1e9)\n")
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
    env.pop("OPENBLAS_CORETYPE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--configs", default="demo,large")
    ap.add_argument("--also-no-fuse", help="also time plans compiled with sdc --no-fuse NAME")
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_child:
        return torch_child(args)
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)  # see bench/run_bench.sh
    sdc, sdrun = os.path.join(args.build, "tools", "sdc"), os.path.join(args.build, "tools", "sdrun")
    rate = sgemm_rate(args.threads)
    print(f"OpenBLAS sgemm 1024^3, {args.threads} threads: {rate:.1f} GFLOP/s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sd_train_bench_") as tmp:
        for name in args.configs.split(","):
            d, layers, heads, seq, batch = CONFIGS[name]
            onnx_path, data = export_gpt_and_batch(tmp, name, d, layers, heads, seq, batch)
            for mode in ("lora", "full"):
                plan = os.path.join(tmp, f"{name}-{mode}.sdp")
                peft = (["--peft", "lora", "--target-modules", ",".join(LORA_TARGETS), "--lora-r", str(LORA_R),
                         "--lora-alpha", "16"] if mode == "lora" else ["--peft", "none"])
                subprocess.run([sdc, "compile", onnx_path, "--shapes", f"input_ids={batch}x{seq}", "-o", plan] + peft,
                               check=True, capture_output=True)
                bench = [sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads", str(args.threads),
                         "--iterations", str(args.iterations), "--warmup", str(args.warmup)]
                out, sd_rss = measure(bench, env)
                sd_ms = json.loads(out.strip().splitlines()[-1])["median_ms"]
                unfused_ms = None
                if args.also_no_fuse:
                    unfused = os.path.join(tmp, f"{name}-{mode}-unfused.sdp")
                    subprocess.run([sdc, "compile", onnx_path, "--shapes", f"input_ids={batch}x{seq}", "-o", unfused,
                                    "--no-fuse", args.also_no_fuse] + peft, check=True, capture_output=True)
                    out, _ = measure([unfused if a == plan else a for a in bench], env)
                    unfused_ms = json.loads(out.strip().splitlines()[-1])["median_ms"]
                out, pt_rss = measure([sys.executable, os.path.abspath(__file__), "--torch-child", "--config", name,
                                       "--mode", mode, "--threads", str(args.threads), "--iterations",
                                       str(args.iterations), "--warmup", str(args.warmup)], env)
                pt_ms = json.loads(out.strip().splitlines()[-1])["median_ms"]
                flops = step_flops(d, layers, seq, batch, 256, mode == "lora")
                rows.append({"config": name, "mode": mode, "d": d, "layers": layers, "seq": seq, "batch": batch,
                             "sdrun_ms": sd_ms, "torch_ms": pt_ms, "ratio": sd_ms / pt_ms,
                             "sdrun_rss_mib": sd_rss, "torch_rss_mib": pt_rss,
                             "sdrun_gflops": flops / sd_ms / 1e6, "torch_gflops": flops / pt_ms / 1e6})
                r = rows[-1]
                if unfused_ms is not None:
                    r["sdrun_no_fuse_ms"] = unfused_ms
                    print(f"{name:6} {mode:5}: sdrun with --no-fuse {args.also_no_fuse} {unfused_ms:8.1f} ms", flush=True)
                print(f"{name:6} {mode:5} d={d} L={layers} seq={seq} batch={batch}: sdrun {sd_ms:8.1f} ms, "
                      f"PyTorch {pt_ms:8.1f} ms, ratio {r['ratio']:.2f}; peak RSS {sd_rss:.0f} vs {pt_rss:.0f} MiB; "
                      f"{r['sdrun_gflops']:.1f} vs {r['torch_gflops']:.1f} GFLOP/s ({100 * r['sdrun_gflops'] / rate:.0f}% "
                      f"of sgemm)", flush=True)
    print(json.dumps({"threads": args.threads, "sgemm_gflops": rate, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
