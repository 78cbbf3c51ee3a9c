#!/usr/bin/env python3
"""Serving many LoRA adapters at once, in one run at the same threads: C
clients send R requests each (a prompt of 64 tokens from Genesis, KJV; --new
greedy tokens), request k naming adapter k mod A.

  sdrun serve, slots:     a plan compiled with `sdc compile --max-loras S
                          --lora-r 8 --kv-cache 256 --kv-batch B`; every
                          adapter (--lora-modules) shares the B rows, each row
                          through its own adapter, S of them in slots at a time
  sdrun serve, sessions:  an ordinary --peft lora plan; each --lora-modules
                          adapter in its own session with its own B rows,
                          stepped in turn
  PEFT:                   one PeftModel holding every adapter; requests in
                          arrival order, B at a time, through generate with
                          adapter_names (PEFT's mixed-adapter batches)

The model is decode_bench.py's (vocab 1024, hidden 256, 4 layers, 8 heads, 4
KV heads, seeded random weights, a byte-level BPE on Genesis); the adapters
are PEFT LoRAs of rank 8 (alpha 16) on q_proj and v_proj with random factors
(init_lora_weights=False). Throughput = completion tokens / wall time of the
whole load. Each sdrun server's greedy text of the first prompt through the
first adapter is compared with PEFT's generate.

  bench/multi_lora_bench.py [--build build] [--threads 2] [--adapters 8] [--slots 4] [--rows 4]
                            [--clients 8] [--requests 2] [--new 32]
"""
import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from decode_bench import PROMPT_TOKENS, build_model  # noqa: E402
from peers import cpu_model  # noqa: E402
from serve_bench import complete, free_port, genesis_prompts, serve  # noqa: E402


def make_adapters(model, folder, count):
    """`count` PEFT LoRAs with random factors, saved; their folders."""
    import torch
    from peft import LoraConfig, get_peft_model
    dirs = []
    for i in range(count):
        torch.manual_seed(100 + i)
        peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                                     target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # PEFT's random start is small: make each adapter's text its own
            for n, p in peft_model.named_parameters():
                if "lora_B" in n:
                    p.mul_(4)
        dirs.append(os.path.join(folder, f"adapter{i}"))
        peft_model.save_pretrained(dirs[-1])
    return dirs


def requests_of(prompts, clients, per_client, adapters):
    """(client, prompt, adapter index) of every request, client by client."""
    return [[(prompts[(c * per_client + r) % len(prompts)], (c * per_client + r) % adapters)
             for r in range(per_client)] for c in range(clients)]


def load(port, names, plan, new):
    """Each client's requests back to back; completion tokens/s over the whole load."""
    tokens, errors, lock = [0], [], threading.Lock()

    def client(reqs):
        for prompt, adapter in reqs:
            try:
                _, n = complete(port, names[adapter], prompt, new)
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
                return
            with lock:
                tokens[0] += n
    threads = [threading.Thread(target=client, args=(reqs,)) for reqs in plan]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return tokens[0] / (time.perf_counter() - t0)


def peft_rate(model, dirs, tok, plan, rows, new):
    """PEFT's mixed-adapter generate over the requests in arrival order, `rows` at a time."""
    import torch
    from peft import PeftModel
    peft_model = PeftModel.from_pretrained(copy.deepcopy(model), dirs[0], adapter_name="a0").eval()
    for i, d in enumerate(dirs[1:], 1):
        peft_model.load_adapter(d, adapter_name=f"a{i}")
    order = [req for r in range(len(plan[0])) for reqs in plan for req in [reqs[r]]]
    tokens, t0, first = 0, time.perf_counter(), None
    with torch.no_grad():
        for k in range(0, len(order), rows):
            batch = order[k:k + rows]
            ids = [tok.encode(p).ids for p, _ in batch]
            width = max(len(i) for i in ids)  # left padding (the prompts are 64 tokens; a few differ)
            mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
            x = torch.tensor([[0] * (width - len(i)) + i for i in ids])
            out = peft_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, pad_token_id=0, adapter_names=[f"a{a}" for _, a in batch])
            tokens += out.shape[0] * new
            if first is None:
                first = tok.decode(out[0, width:].tolist())
    return tokens / (time.perf_counter() - t0), first


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--new", type=int, default=32)
    a = ap.parse_args()
    import peft
    import torch
    import transformers
    from export_hf import export
    sdc, sdrun = os.path.join(a.build, "tools", "sdc"), os.path.join(a.build, "tools", "sdrun")
    tmp = tempfile.mkdtemp(prefix="sd_multi_lora_bench_")
    results, texts = [], {}
    try:
        hf = os.path.join(tmp, "hf")
        model, _ = build_model(hf)
        tok, prompts = genesis_prompts(hf)
        dirs = make_adapters(model, tmp, a.adapters)
        onnx_path = os.path.join(tmp, "model.onnx")
        export(model, onnx_path, 17, a.rows, 16)
        common = ["--target-modules", "q_proj,v_proj", "--lora-r", "8", "--lora-alpha", "16", "--kv-cache", "256",
                  "--kv-batch", str(a.rows), "--prefill-chunk", str(PROMPT_TOKENS)]
        slots_plan, sessions_plan = os.path.join(tmp, "slots.sdp"), os.path.join(tmp, "sessions.sdp")
        base_plan = os.path.join(tmp, "base.sdp")
        subprocess.run([sdc, "compile", onnx_path, *common[4:], "-o", base_plan], check=True, capture_output=True)
        subprocess.run([sdc, "compile", onnx_path, "--max-loras", str(a.slots), *common, "-o", slots_plan],
                       check=True, capture_output=True)
        subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--shapes", f"input_ids={a.rows}x16", *common,
                        "-o", sessions_plan], check=True, capture_output=True)
        names = [f"a{i}" for i in range(a.adapters)]
        modules = [x for i, d in enumerate(dirs) for x in ("--lora-modules", f"a{i}={d}")]
        plan = requests_of(prompts, a.clients, a.requests, a.adapters)
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        for name, p, served, flags in (
                (f"sdrun serve, {a.slots} slots", slots_plan, names, modules),
                ("sdrun serve, a session each", sessions_plan, names, modules),
                ("sdrun serve, the base model alone (no adapters: the cost of none)", base_plan,
                 ["base"] * a.adapters, ["--served-model-name", "base"])):
            port = free_port()
            proc = serve([sdrun, "serve", p, "--tokenizer", hf, "--threads", str(a.threads), "--port", str(port),
                          *flags], port, env)
            try:
                text, _ = complete(port, served[0], prompts[0], a.new)  # warm-up, and the greedy text
                if p != base_plan:
                    texts[name] = text
                results.append((name, load(port, served, plan, a.new)))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        torch.set_num_threads(a.threads)
        rate, first = peft_rate(model, dirs, tok, plan, a.rows, a.new)
        results.append((f"PEFT generate, adapter_names, {a.rows} at a time", rate))
        texts["PEFT"] = first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, peft {peft.__version__}")
    print(f"{a.adapters} adapters (rank 8, q_proj and v_proj), {a.rows} rows; {a.clients} clients x {a.requests} "
          f"requests, prompts of {PROMPT_TOKENS} tokens, {a.new} new tokens each (greedy)\n")
    print("| server | completion tokens/s |")
    print("|---|---|")
    for name, rate in results:
        print(f"| {name} | {rate:.0f} |")
    print()
    for name, text in texts.items():
        if name != "PEFT":
            print(f"{name}: greedy text of the first adapter {'equals' if text == texts['PEFT'] else 'differs from'} "
                  f"PEFT's generate")


if __name__ == "__main__":
    main()
