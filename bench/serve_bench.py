#!/usr/bin/env python3
"""Serving throughput over HTTP with the OpenAI completions API, in one run
at the same threads: C clients each send R requests back to back (a prompt of
64 tokens from Genesis, KJV, each client its own; --new greedy tokens).

  sdrun serve:         a plan compiled with `sdc compile --kv-cache 256
                       --kv-batch B --prefill-chunk 64` from the TorchScript
                       export; every client's requests share the B rows
  transformers serve:  the same weights and tokenizer folder (FastAPI and
                       uvicorn; transformers' generate per request), --device
                       cpu; and with --continuous-batching (its paged cache)

The model is decode_bench.py's: a Llama-architecture decoder from a
transformers config with seeded random weights (vocab 1024, hidden 256, 4
layers, 8 heads, 4 KV heads) and a byte-level BPE trained on Genesis.
Throughput = completion tokens / wall time of the whole load; latency = the
median request's time. The clients speak raw HTTP (http.client), the same
for every server; each server gets one warm-up request first. The greedy
text of the first prompt is compared with transformers' generate.

  bench/serve_bench.py [--build build] [--threads 2] [--clients 1,4] [--requests 4] [--new 64] [--rows 4]
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(port, model, prompt, new):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": new, "temperature": 0})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    out = json.loads(data)
    return out["choices"][0]["text"], out["usage"]["completion_tokens"]


def genesis_prompts(folder, count=16):
    """The tokenizer build_model saved in `folder`, and `count` prompts of PROMPT_TOKENS tokens from Genesis."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    lines = subprocess.run(["bible", "Gen1:1-Gen50:26"], capture_output=True, check=True).stdout.decode().split("\n")
    return tok, [tok.decode(tok.encode(" ".join(lines[100 + 40 * k:140 + 40 * k])).ids[:PROMPT_TOKENS])
                 for k in range(count)]


def wait_ready(port, proc, seconds=300):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def load(port, model, prompts, clients, requests, new):
    """C clients, R requests each, back to back; (tokens/s, median latency s)."""
    latencies, tokens, errors = [], [0], []
    lock = threading.Lock()

    def client(c):
        for r in range(requests):
            t0 = time.perf_counter()
            try:
                _, n = complete(port, model, prompts[(c * requests + r) % len(prompts)], new)
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
                return
            with lock:
                latencies.append(time.perf_counter() - t0)
                tokens[0] += n
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(errors[0])
    return tokens[0] / wall, statistics.median(latencies)


def serve(cmd, port, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    try:
        wait_ready(port, proc)
    except RuntimeError as e:
        proc.kill()
        raise RuntimeError(f"{e}: {proc.stderr.read()[-400:]}")
    return proc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rows", type=int, default=4)
    a = ap.parse_args()
    import torch
    import transformers
    from export_hf import export
    clients = [int(c) for c in a.clients.split(",")]
    tmp = tempfile.mkdtemp(prefix="sd_serve_bench_")
    rows, texts = [], {}
    try:
        hf = os.path.join(tmp, "hf")
        model, prompt_ids = build_model(hf)
        tok, prompts = genesis_prompts(hf)
        onnx_path, plan = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "plan.sdp")
        export(model, onnx_path, 17, a.rows, 16)
        subprocess.run([os.path.join(a.build, "tools", "sdc"), "compile", onnx_path, "--kv-cache", "256", "--kv-batch",
                        str(a.rows), "--prefill-chunk", str(PROMPT_TOKENS), "-o", plan], check=True, capture_output=True)
        torch.set_num_threads(a.threads)
        with torch.no_grad():
            ids = tok.encode(prompts[0]).ids
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, pad_token_id=0)
        want = tok.decode(out[0].tolist())[len(tok.decode(ids)):]
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        servers = [
            (f"sdrun serve (--kv-batch {a.rows})", "plan",
             [os.path.join(a.build, "tools", "sdrun"), "serve", plan, "--tokenizer", hf, "--served-model-name", "plan",
              "--threads", str(a.threads)]),
            ("transformers serve", hf, [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; "
                                        "sys.argv[0] = 'transformers'; main()", "serve", hf, "--device", "cpu"]),
            ("transformers serve --continuous-batching", hf,
             [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; "
              "sys.argv[0] = 'transformers'; main()", "serve", hf, "--device", "cpu", "--continuous-batching"]),
        ]
        for name, model_id, cmd in servers:
            port = free_port()
            try:
                proc = serve(cmd + ["--port", str(port)], port, env)
            except RuntimeError as e:
                rows.append((name, None, str(e).splitlines()[-1][:200]))
                continue
            try:
                texts[name], _ = complete(port, model_id, prompts[0], a.new)  # warm-up, and the greedy text
                for c in clients:
                    rate, latency = load(port, model_id, prompts, c, a.requests, a.new)
                    rows.append((name, c, (rate, latency)))
            except RuntimeError as e:
                rows.append((name, None, str(e)[:200]))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"prompts of {PROMPT_TOKENS} tokens, {a.new} new tokens each (greedy), {a.requests} requests per client\n")
    print("| server | clients | completion tokens/s | median request (s) |")
    print("|---|---|---|---|")
    for name, c, r in rows:
        if c is None:
            print(f"| {name} | - | failed: {r} | |")
        else:
            print(f"| {name} | {c} | {r[0]:.0f} | {r[1]:.2f} |")
    print()
    for name, text in texts.items():
        same = text == want
        common = next((i for i, (x, y) in enumerate(zip(text, want)) if x != y), min(len(text), len(want)))
        print(f"{name}: greedy text {'equals' if same else 'differs from'} transformers' generate"
              + ("" if same else f" (first {common} characters equal)"))


if __name__ == "__main__":
    main()
