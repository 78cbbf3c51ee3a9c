#!/usr/bin/env python3
"""LoRA and full fine-tuning steps of a GPT-2-style and a Llama-architecture
model: sdrun (`sdrun bench --entry train_step`) against PyTorch eager + PEFT
and torch.compile(mode="reduce-overhead") + PEFT, on one device, same model,
batch and sequence, in one run. Reports ms per step, tokens/s, peak memory and
MFU, with

  FLOPs per token = 6 N (full fine-tuning) or 4 N (LoRA) + 12 L d T (attention),
  N = weights multiplied per token (every Linear, the LM head included;
  embedding lookups excluded), L layers, d model width, T sequence length;
  MFU = tokens/s x FLOPs per token / the device's dense bf16 peak
  (--peak-tflops; 989.4 for H100/H200 SXM, 312 for A100; on the CPU the
  measured OpenBLAS sgemm rate is the reference instead).

Each config runs in every precision of --precisions: fp32 (no TF32 on either
side) and bf16 (sdc compile --precision bf16 against torch.autocast(bfloat16),
both with f32 master weights and optimizer state). The GPT configs use GPT-2's
tanh GELU (gelu_new), as GPT-2 does.

  bench/gpu_train_bench.py --device cuda [--configs gpt2-small,llama-small] [--precisions fp32,bf16]
  bench/gpu_train_bench.py --device cpu --configs gpt-tiny,llama-tiny   (end to end on the CPU)

A GPU machine without sdc (scripts/gpu-check.sh's bare machine) takes plans
compiled elsewhere: --write-plans DIR compiles them with external weights and
keeps each weights file's header only (the weights of GPT-2-small are 500 MB);
--plans DIR --sdrun PATH fills the weights in with random values there (a
step's speed does not depend on them) and runs the same benchmark.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from train_bench import measure, sgemm_rate  # noqa: E402

# arch, d, layers, heads, kv_heads, ffn, vocab, seq, batch
CONFIGS = {
    "gpt2-small": ("gpt", 768, 12, 12, 12, 3072, 256, 1024, 8),
    "llama-small": ("llama", 768, 12, 12, 4, 2048, 32000, 1024, 8),
    "gpt-tiny": ("gpt", 128, 2, 4, 4, 512, 256, 128, 4),
    "llama-tiny": ("llama", 128, 2, 4, 2, 256, 256, 128, 4),
}
LORA = {"gpt": ["qkv", "proj", "fc1", "fc2"], "llama": ["q_proj", "k_proj", "v_proj", "o_proj"]}
LORA_R, LORA_ALPHA = 8, 16
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


def build_model(name):
    """The PyTorch model of a config, seed 0."""
    import torch
    import transformers
    arch, d, layers, heads, kv, ffn, vocab, seq, _ = CONFIGS[name]
    torch.manual_seed(0)
    if arch == "gpt":
        from export_models import Gpt
        return Gpt(vocab=vocab, d=d, layers=layers, heads=heads, block=seq, gelu="tanh")
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, max_position_embeddings=seq, use_cache=False, tie_word_embeddings=False,
        attn_implementation="eager"))


def logits_of(model, ids):
    out = model(ids)
    return out if not hasattr(out, "logits") else out.logits


def linear_weights(model):
    import torch
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def torch_child(args):
    import peft
    import torch
    import torch.nn.functional as F
    name = args.config
    arch, d, layers, heads, kv, ffn, vocab, seq, batch = CONFIGS[name]
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    model = build_model(name).to(device)
    if args.mode == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                           target_modules=LORA[arch]))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, vocab, (batch, seq), device=device)

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else
                __import__("contextlib").nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            logits = logits_of(model, ids)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()

    if args.peer == "compiled":
        model.forward = torch.compile(model.forward, mode="reduce-overhead")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(args.warmup + args.iterations):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else None
    if args.profile_out:
        write_torch_profile(args.profile_out, step, sync, device)
    print(json.dumps({"median_ms": times[len(times) // 2], "peak_mib": peak}))


def write_torch_profile(path, step, sync, device):
    """Three more steps under torch.profiler: the per-kernel table (device
    time first on a GPU), to set beside `sdrun bench --profile`'s per-op table."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        sync()
    averages = prof.key_averages()
    table = None
    for key in (["self_device_time_total", "self_cuda_time_total"] if device.type == "cuda" else []) + \
            ["self_cpu_time_total"]:
        try:
            table = averages.table(sort_by=key, row_limit=50)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    with open(path, "w") as f:
        f.write(f"torch.profiler, 3 steps, sorted by {key}\n{table}\n")


def export(name, tmp):
    """ONNX export of the config's model (seed 0) and one batch of JSON Lines."""
    import torch
    arch, d, layers, heads, kv, ffn, vocab, seq, batch = CONFIGS[name]
    model = build_model(name).eval()
    path = os.path.join(tmp, f"{name}.onnx")
    if arch == "gpt":
        from export_models import export_gpt
        export_gpt(model, path, torch.zeros((batch, seq), dtype=torch.long), 17)
    else:
        import export_hf
        export_hf.export(model, path, 17, batch, seq, fixed_batch=True)
    data = os.path.join(tmp, f"{name}.jsonl")
    with open(data, "w") as f:
        for i in range(batch):
            f.write(json.dumps({"input_ids": [(i * 7 + j * 13) % vocab for j in range(seq)]}) + "\n")
    return path, data, linear_weights(model)


MODES = ("lora", "full")


def plan_path(folder, name, mode, precision):
    return os.path.join(folder, f"{name}-{mode}-{precision}.sdp")


def compile_plans(sdc, name, tmp, out_dir, external, precisions):
    """The LoRA and full fine-tuning plans of a config in each precision, and
    its data; with `external`, each plan's weights go to PLAN.safetensors beside it."""
    arch, *_, seq, batch = CONFIGS[name]
    onnx_path, data, n = export(name, tmp)
    plans = {}
    for mode in MODES:
        for precision in precisions:
            plan = plan_path(out_dir, name, mode, precision)
            peft_flags = (["--peft", "lora", "--target-modules", ",".join(LORA[arch]), "--lora-r", str(LORA_R),
                           "--lora-alpha", str(LORA_ALPHA)] if mode == "lora" else ["--peft", "none"])
            subprocess.run([sdc, "compile", onnx_path, "--shapes", f"input_ids={batch}x{seq}", "--precision", precision,
                            "-o", plan] + peft_flags + (["--external-weights"] if external else []),
                           check=True, capture_output=True)
            plans[(mode, precision)] = plan
    return plans, data, n


# Tensors up to this size travel with a plan written by --write-plans; larger
# weights are made again, at random, where it runs.
SMALL_TENSOR_BYTES = 1 << 16


def drawn_where_run(name, dtype, data):
    """Whether a tensor may be drawn at random on the GPU machine: a large
    float weight. Constants travel as they are: sdc's (rotary tables, a
    causal mask), and buffers that compress (a model's own causal mask):
    a random mask or table would change what the step computes."""
    import zlib
    return (len(data) > SMALL_TENSOR_BYTES and dtype in ("F32", "BF16", "F16") and not name.startswith("__constant")
            and len(zlib.compress(data[:1 << 20], 1)) > len(data[:1 << 20]) // 2)


def read_safetensors_raw(path):
    """{name: (dtype tag, shape, bytes)} of a safetensors file, read without a
    library (the GPU machine's Python may lack one that knows bf16)."""
    import struct
    with open(path, "rb") as f:
        blob = f.read()
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + size])
    header.pop("__metadata__", None)
    body = blob[8 + size:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def write_safetensors_raw(path, tensors):
    import struct
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    # Written beside and renamed over: a killed run leaves no half-written file.
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors.values()))
    os.replace(path + ".tmp", path)


def write_plans(args, configs, precisions):
    """Plans, data and a manifest for a machine without sdc: each plan's
    external weights file shrinks to its small tensors and constants plus the
    header of the large weights (PLAN.large.json)."""
    os.makedirs(args.write_plans, exist_ok=True)
    sdc = os.path.join(args.build, "tools", "sdc")
    manifest = {}
    with tempfile.TemporaryDirectory(prefix="sd_gpu_bench_") as tmp:
        for name in configs:
            plans, data, n = compile_plans(sdc, name, tmp, args.write_plans, external=True, precisions=precisions)
            shutil.copy(data, os.path.join(args.write_plans, f"{name}.jsonl"))
            manifest[name] = {"linear_weights": n, "precisions": precisions}
            for plan in plans.values():
                base = os.path.splitext(plan)[0]
                tensors = read_safetensors_raw(base + ".safetensors")
                drawn = {k for k, v in tensors.items() if drawn_where_run(k, v[0], v[2])}
                write_safetensors_raw(base + ".small.safetensors",
                                      {k: v for k, v in tensors.items() if k not in drawn})
                with open(base + ".large.json", "w") as f:
                    json.dump({k: [v[0], v[1]] for k, v in tensors.items() if k in drawn}, f)
                os.remove(base + ".safetensors")
    with open(os.path.join(args.write_plans, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    print(f"gpu_train_bench: plans of {', '.join(configs)} in {args.write_plans}")
    return 0


def restore_weights(plan):
    """PLAN.safetensors from PLAN.small.safetensors and PLAN.large.json: the
    large tensors drawn from N(0, 0.02) (one-dimensional ones: 1 for
    weights, 0 for biases), as a model's initialization would; F32, or BF16
    (an autocast plan's frozen half copies) rounded to nearest even."""
    import numpy as np
    base = os.path.splitext(plan)[0]
    tensors = read_safetensors_raw(base + ".small.safetensors")
    rng = np.random.default_rng(0)
    for name, (dtype, shape) in json.load(open(base + ".large.json")).items():
        if len(shape) == 1:
            values = np.full(shape, 1.0 if name.endswith("weight") else 0.0, np.float32)
        else:
            values = (rng.standard_normal(shape, np.float32) * np.float32(0.02)).astype(np.float32)
        if dtype == "BF16":
            bits = values.view(np.uint32)
            data = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        elif dtype == "F32":
            data = values.tobytes()
        else:
            sys.exit(f"{plan}: cannot draw {dtype} weights ({name})")
        tensors[name] = (dtype, shape, data)
    write_safetensors_raw(base + ".safetensors", tensors)


def device_peak(args):
    if args.peak_tflops:
        return args.peak_tflops
    if args.device != "cuda":
        return None
    import torch
    gpu = torch.cuda.get_device_name(0)
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in gpu:
            return tflops
    sys.exit(f"unknown GPU '{gpu}': give its dense bf16 peak with --peak-tflops")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--configs", default=None, help="default: gpt2-small,llama-small (cuda), gpt-tiny,llama-tiny (cpu)")
    ap.add_argument("--peers", default="eager,compiled", help="PyTorch peers: eager, compiled")
    ap.add_argument("--precisions", default=None, help="fp32, bf16 (default: both on cuda, fp32 on cpu)")
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--write-plans", metavar="DIR", help="compile the configs' plans into DIR for --plans, and stop")
    ap.add_argument("--plans", metavar="DIR", help="take the plans from DIR (written by --write-plans), not sdc")
    ap.add_argument("--sdrun", help="the sdrun to run (default: BUILD/tools/sdrun)")
    ap.add_argument("--torch-profile", metavar="DIR",
                    help="also write each PyTorch peer's per-kernel table (torch.profiler, 3 steps) to "
                         "DIR/torch-PEER-CONFIG-MODE-PRECISION.txt")
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_child:
        return torch_child(args)
    configs = (args.configs or ("gpt2-small,llama-small" if args.device == "cuda" else "gpt-tiny,llama-tiny")).split(",")
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"unknown config '{c}' (configs: {', '.join(CONFIGS)})")
    precisions = (args.precisions or ("fp32,bf16" if args.device == "cuda" else "fp32")).split(",")
    for p in precisions:
        if p not in ("fp32", "bf16"):
            sys.exit(f"unknown precision '{p}' (fp32, bf16)")
    if args.write_plans:
        return write_plans(args, configs, precisions)
    if args.torch_profile:
        os.makedirs(args.torch_profile, exist_ok=True)
    peak = device_peak(args)
    sgemm = sgemm_rate(args.threads) if args.device == "cpu" else None
    sdc = os.path.join(args.build, "tools", "sdc")
    sdrun = args.sdrun or os.path.join(args.build, "tools", "sdrun")
    env = dict(os.environ)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sd_gpu_bench_") as tmp:
        for name in configs:
            arch, d, layers, heads, kv, ffn, vocab, seq, batch = CONFIGS[name]
            if args.plans:
                entry = json.load(open(os.path.join(args.plans, "manifest.json")))[name]
                n = entry["linear_weights"]
                missing = [p for p in precisions if p not in entry.get("precisions", ["fp32"])]
                if missing:
                    sys.exit(f"the plans in {args.plans} have no {', '.join(missing)} plans of {name}")
                data = os.path.join(args.plans, f"{name}.jsonl")
                plans = {(mode, p): plan_path(args.plans, name, mode, p) for mode in MODES for p in precisions}
                for plan in plans.values():
                    restore_weights(plan)
            else:
                plans, data, n = compile_plans(sdc, name, tmp, tmp, external=False, precisions=precisions)
            for mode, precision in [(m, p) for p in precisions for m in MODES]:
                plan = plans[(mode, precision)]
                out, rss = measure([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--device",
                                    args.device, "--threads", str(args.threads), "--iterations",
                                    str(args.iterations), "--warmup", str(args.warmup)], env)
                r = json.loads(out.strip().splitlines()[-1])
                # On the GPU: what the session holds on the device (arena, state, weights).
                results = {"sdrun": (r["median_ms"], rss if args.device == "cpu" else r["device_mib"])}
                # On the GPU: steps queued one ahead, as sdrun train runs them, and
                # the share of time the GPU waited for the host (CUDA events).
                if r.get("pipelined_ms", -1) > 0:
                    results["sdrun-pipelined"] = (r["pipelined_ms"], results["sdrun"][1])
                    print(f"{name:12} {mode:5} {precision:4} sdrun GPU idle: {r['device_idle_pct']:.1f}% waiting for each step, "
                          f"{r['pipelined_device_idle_pct']:.1f}% pipelined", flush=True)
                for peer in args.peers.split(","):
                    profile = (["--profile-out", os.path.join(args.torch_profile,
                                                              f"torch-{peer}-{name}-{mode}-{precision}.txt")]
                               if args.torch_profile else [])
                    out, prss = measure([sys.executable, os.path.abspath(__file__), "--torch-child", "--config", name,
                                         "--mode", mode, "--peer", peer, "--device", args.device, "--threads",
                                         str(args.threads), "--iterations", str(args.iterations), "--warmup",
                                         str(args.warmup), "--precision", precision] + profile, env)
                    r = json.loads(out.strip().splitlines()[-1])
                    results[f"torch-{peer}"] = (r["median_ms"], r["peak_mib"] if args.device == "cuda" else prss)
                flops_token = (4 if mode == "lora" else 6) * n + 12 * layers * d * seq
                tokens = batch * seq
                for who, (ms, mem) in results.items():
                    tps = tokens / (ms / 1000)
                    achieved = tps * flops_token / 1e12
                    row = {"config": name, "mode": mode, "precision": precision, "who": who, "ms": ms,
                           "tokens_per_s": tps,
                           "peak_mib": mem, "tflops": achieved,
                           "mfu": achieved / peak if peak else None,
                           "of_sgemm": achieved * 1e3 / sgemm if sgemm else None}
                    rows.append(row)
                    ref = f"MFU {100 * row['mfu']:.1f}%" if peak else f"{100 * row['of_sgemm']:.0f}% of sgemm"
                    mem_s = f"{mem:.0f} MiB" if mem is not None else "n/a"
                    print(f"{name:12} {mode:5} {precision:4} {who:15} {ms:9.1f} ms  {tps:10.0f} tok/s  peak {mem_s:>9}  "
                          f"{achieved * 1e3:8.1f} GFLOP/s  {ref}", flush=True)
    print(json.dumps({"device": args.device, "peak_tflops": peak, "sgemm_gflops": sgemm, "threads": args.threads,
                      "precisions": precisions, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
