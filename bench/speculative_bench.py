#!/usr/bin/env python3
"""Speculative decoding by prompt lookup against transformers' own, in one run
at the same threads: greedy decode time for --new tokens after a prompt, with
and without guessed tokens.

  sdrun:        `sdrun generate` on a plan compiled with `sdc compile --kv-cache
                512 --speculate 4`, with its default (up to 4 tokens guessed a
                step, checked by the verify entry) and with --speculate 0
  transformers: LlamaForCausalLM.generate with prompt_lookup_num_tokens=4 and
                without it

The model is decode_bench.py's Llama-architecture decoder (vocab 1024, hidden
256, 4 layers, 8 heads, 4 KV heads, byte-level BPE on Genesis), trained here
for --train-steps AdamW steps on Genesis (KJV) so that its text goes on as
Genesis does: guesses from the text so far hold as often as a model that has
learned its data makes them hold, not as a random model's loops do. The prompt
is --prompt-verses verses of Exodus. The same model is timed a second time
inflated with inert weights (--inflate: its MLPs --inflate times as wide, the
extra units' output weights zero, and --extra-layers more layers whose output
projections are zero), so it computes the same function while each decode
step reads the weights of a model several times its size, as a real LLM's
decode step on a CPU is bound by reading its weights rather than by
arithmetic. Decode time = the run for --new tokens
less the run for 1 token (load and prefill), median of --repeats; sdrun's
figures include starting its process, equal in both of its runs. Reported:
decode tokens/s, the speed-up speculation gives each runtime, the share of
guesses confirmed (sdrun's stderr), and whether the four greedy continuations
are the same tokens.

  bench/speculative_bench.py [--build build] [--threads 2] [--new 256] [--repeats 3] [--inflate 8]
                             [--extra-layers 4]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from decode_bench import build_model  # noqa: E402
from peers import cpu_model  # noqa: E402

GUESSES, CACHE = 4, 512


def train(model, folder, steps, threads):
    """AdamW on Genesis token windows, so the model writes text like it."""
    import torch
    from transformers import AutoTokenizer
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(folder)
    text = subprocess.run(["bible", "Gen1:1-Gen50:26"], capture_output=True, check=True).stdout.decode()
    ids = torch.tensor(tok(text)["input_ids"])
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    loss = None
    for step in range(steps):
        starts = torch.randint(0, len(ids) - 129, (16,), generator=gen)
        batch = torch.stack([ids[s:s + 128] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


def inflate(model, folder, factor, extra_layers):
    """The model with inert weights added: the same logits, more to read each step."""
    import torch
    import transformers
    cfg = model.config.to_dict()
    cfg.update(intermediate_size=model.config.intermediate_size * factor,
               num_hidden_layers=model.config.num_hidden_layers + extra_layers, attn_implementation="eager")
    big = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    inner = model.config.intermediate_size
    with torch.no_grad():
        small = dict(model.named_parameters())
        for name, p in big.named_parameters():
            if name in small and small[name].shape == p.shape:
                p.copy_(small[name])
            elif name in small and "down_proj" in name:  # the extra units' outputs: zero
                p.zero_()
                p[:, :inner] = small[name]
            elif name in small:  # gate_proj, up_proj: the trained units first, random ones after
                p[:inner] = small[name]
            elif "o_proj" in name or "down_proj" in name:  # an extra layer adds nothing to the residual
                p.zero_()
    big.save_pretrained(folder)
    return big


def time_sdrun(sdrun, plan, tok, prompt, new, threads, repeats, variants):
    """Each variant's (name, generate flags) decode rate, text and speculation
    line, the variants' runs interleaved so the machine's drift reaches them alike."""
    def run(n, flags):
        cmd = [sdrun, "generate", plan, "--tokenizer", tok, "--prompt", prompt, "--temperature", "0",
               "--max-new-tokens", str(n), "--threads", str(threads), *flags]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return time.perf_counter() - t0, r.stdout, r.stderr
    rates = {name: [] for name, _ in variants}
    last = {}
    for _ in range(repeats):
        for name, flags in variants:
            one, _, _ = run(1, flags)
            full, text, err = run(new, flags)
            rates[name].append((new - 1) / max(full - one, 1e-9))
            last[name] = (text, err)
    out = {}
    for name, _ in variants:
        text, err = last[name]
        m = re.search(r"(\d+) of (\d+) guessed tokens confirmed; ([\d.]+) tokens a row", err)
        out[name] = (statistics.median(rates[name]), text.rstrip("\n"), m.groups() if m else None)
    return out


def time_transformers(model, ids, new, threads, repeats, extra):
    """Greedy decode rate with generate's `extra` arguments, and the continuation."""
    import torch
    torch.set_num_threads(threads)
    rates, out = [], None
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.generate(input_ids=ids, max_new_tokens=1, do_sample=False, pad_token_id=0, **extra)
            t1 = time.perf_counter()
            out = model.generate(input_ids=ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=0, eos_token_id=None, **extra)
            t2 = time.perf_counter()
            rates.append((new - 1) / max((t2 - t1) - (t1 - t0), 1e-9))
    return statistics.median(rates), out[0, ids.shape[1]:].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--prompt-verses", type=int, default=12)
    ap.add_argument("--inflate", type=int, default=8)
    ap.add_argument("--extra-layers", type=int, default=4)
    ap.add_argument("--keep", help="copy the two plans (plan0.sdp: as trained, plan1.sdp: inflated) and the "
                    "tokenizer here")
    a = ap.parse_args()
    import torch
    import transformers
    from export_hf import export
    sdc, sdrun = os.path.join(a.build, "tools", "sdc"), os.path.join(a.build, "tools", "sdrun")
    tmp = tempfile.mkdtemp(prefix="sd_spec_bench_")
    try:
        hf = os.path.join(tmp, "hf")
        model, _ = build_model(hf)
        t0 = time.perf_counter()
        loss = train(model, hf, a.train_steps, a.threads)
        print(f"trained {a.train_steps} steps in {time.perf_counter() - t0:.0f} s, last loss {loss:.3f}", file=sys.stderr)
        verses = subprocess.run(["bible", "Exo1:1-Exo40:38"], capture_output=True, check=True).stdout.decode()
        prompt = " ".join(line.split(" ", 1)[1] for line in verses.splitlines()[:a.prompt_verses] if " " in line)
        tok = transformers.AutoTokenizer.from_pretrained(hf)
        ids = torch.tensor([tok(prompt)["input_ids"]])
        if a.keep:
            shutil.copytree(hf, os.path.join(a.keep, "tokenizer"), dirs_exist_ok=True)
            with open(os.path.join(a.keep, "prompt.txt"), "w") as f:
                f.write(prompt)
        tables = []
        big = inflate(model, os.path.join(tmp, "big"), a.inflate, a.extra_layers)
        for label, m in (("as trained", model), (f"inflated ({a.inflate}x MLP width, +{a.extra_layers} layers)", big)):
            params = sum(p.numel() for p in m.parameters())
            onnx_path, plan = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "plan.sdp")
            export(m, onnx_path, 17, 1, 16)
            subprocess.run([sdc, "compile", onnx_path, "--kv-cache", str(CACHE), "--speculate", str(GUESSES),
                            "-o", plan], check=True, capture_output=True)
            timed = time_sdrun(sdrun, plan, hf, prompt, a.new, a.threads, a.repeats,
                               [("guessing", ["--speculate", str(GUESSES)]), ("plain", ["--speculate", "0"])])
            guessing, plain = timed["guessing"], timed["plain"]
            if a.keep:
                os.makedirs(a.keep, exist_ok=True)
                shutil.copy(plan, os.path.join(a.keep, f"plan{len(tables)}.sdp"))
            results = {
                "sdrun, guessing": guessing,
                "sdrun, --speculate 0": plain,
                "transformers, prompt_lookup_num_tokens=4": time_transformers(
                    m, ids, a.new, a.threads, a.repeats, {"prompt_lookup_num_tokens": GUESSES}),
                "transformers": time_transformers(m, ids, a.new, a.threads, a.repeats, {}),
            }
            tables.append((f"{label}: {params / 1e6:.1f}M parameters", results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"prompt {ids.shape[1]} tokens ({a.prompt_verses} verses of Exodus), {a.new} new tokens, greedy, "
          f"median of {a.repeats}; model trained {a.train_steps} steps (last loss {loss:.2f})")
    for title, results in tables:
        ref = results["transformers"][1]
        ref_text = tok.decode(ids[0].tolist() + ref)
        print(f"\n{title}\n")
        print("| runtime | decode (tokens/s) | guesses confirmed | tokens a step | continuation as transformers' |")
        print("|---|---:|---:|---:|---|")
        for name, result in results.items():
            rate = result[0]
            if name.startswith("sdrun"):
                same = result[1] == ref_text
                confirmed = f"{result[2][0]} of {result[2][1]}" if result[2] else "-"
                per_step = result[2][2] if result[2] else "1"
            else:
                same, confirmed, per_step = result[1] == ref, "-", "-"
            print(f"| {name} | {rate:.0f} | {confirmed} | {per_step} | {'same' if same else 'differs'} |")
        for who in ("sdrun", "transformers"):
            on = next(v[0] for k, v in results.items() if k.startswith(who) and ("guess" in k or "lookup" in k))
            off = next(v[0] for k, v in results.items() if k.startswith(who) and not ("guess" in k or "lookup" in k))
            print(f"{who}: speculation {on / off:.2f}x its own plain decode")


if __name__ == "__main__":
    main()
