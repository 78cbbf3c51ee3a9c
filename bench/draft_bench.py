#!/usr/bin/env python3
"""Speculative decoding with a draft model against transformers' assisted
generation, in one run at the same threads: greedy decode time for --new
tokens after a prompt.

  sdrun:        `sdrun generate` on a plan compiled with `sdc compile --kv-cache
                512 --speculate 4`: with --draft (the draft plan's greedy
                tokens as guesses, as many a step as the measured costs and
                rates say pay best, checked when they pay), with prompt lookup
                (the default), and with --speculate 0
  transformers: LlamaForCausalLM.generate with assistant_model=the draft (its
                defaults), with prompt_lookup_num_tokens=4, and plain

The target is speculative_bench.py's inflated model: decode_bench.py's Llama
(vocab 1024, hidden 256, 4 layers) trained --train-steps AdamW steps on
Genesis, then given inert weights (the same function, ten times the weights
to read each step, as a real LLM's decode step on a CPU is bound by reading
them). Two drafts of its tokenizer: a Llama --draft-hidden wide and
--draft-layers deep distilled from the target (--distill-steps AdamW steps on
its next-token distributions over Genesis windows, KL divergence), as drafts
are made; and the trained Llama before inflating, which computes the target's
function (every guess holds: the most a draft can give at its cost). The
prompt is --prompt-verses verses of Exodus. Decode time = the run for --new
tokens less the run for 1 token, median of --repeats (sdrun's runs include
starting its process, alike in every variant). Reported: decode tokens/s,
each variant's speed-up over its runtime's plain decoding, the guesses
confirmed (sdrun's stderr), and whether the continuation is transformers'
plain greedy one.

  bench/draft_bench.py [--build build] [--threads 2] [--new 256] [--repeats 3] [--train-steps 300]
                       [--draft-hidden 128] [--draft-layers 1] [--distill-steps 600]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from decode_bench import build_model  # noqa: E402
from peers import cpu_model  # noqa: E402
from speculative_bench import CACHE, GUESSES, inflate, time_sdrun, time_transformers, train  # noqa: E402


def build_draft(target, hidden, layers):
    """A small Llama of the target's vocabulary (its tokenizer), seeded."""
    import torch
    import transformers
    torch.manual_seed(1)
    t = target.config
    cfg = transformers.LlamaConfig(vocab_size=t.vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=t.max_position_embeddings, tie_word_embeddings=False,
                                   bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id,
                                   pad_token_id=t.pad_token_id, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).eval()


def distill(draft, target, folder, steps, threads):
    """The draft trained to the target's next-token distributions on Genesis
    windows (KL divergence), as drafts are made to agree with their target."""
    import torch
    from transformers import AutoTokenizer
    torch.set_num_threads(threads)
    text = subprocess.run(["bible", "Gen1:1-Gen50:26"], capture_output=True, check=True).stdout.decode()
    ids = torch.tensor(AutoTokenizer.from_pretrained(folder)(text)["input_ids"])
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(draft.parameters(), lr=3e-3, weight_decay=0.01)
    draft.train()
    loss = None
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - 129, (16,), generator=gen)
        batch = torch.stack([ids[s:s + 128] for s in starts])
        with torch.no_grad():
            want = torch.log_softmax(target(input_ids=batch).logits, -1)
        got = torch.log_softmax(draft(input_ids=batch).logits, -1)
        loss = torch.nn.functional.kl_div(got, want, log_target=True, reduction="batchmean") / batch.shape[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval()
    return loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--prompt-verses", type=int, default=12)
    ap.add_argument("--draft-hidden", type=int, default=128)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--distill-steps", type=int, default=600)
    ap.add_argument("--inflate", type=int, default=8)
    ap.add_argument("--extra-layers", type=int, default=4)
    a = ap.parse_args()
    import torch
    import transformers
    from export_hf import export
    sdc, sdrun = os.path.join(a.build, "tools", "sdc"), os.path.join(a.build, "tools", "sdrun")
    tmp = tempfile.mkdtemp(prefix="sd_draft_bench_")
    try:
        hf = os.path.join(tmp, "hf")
        model, _ = build_model(hf)
        draft = build_draft(model, a.draft_hidden, a.draft_layers)
        losses = [train(model, hf, a.train_steps, a.threads)]
        losses.append(distill(draft, model, hf, a.distill_steps, a.threads))
        verses = subprocess.run(["bible", "Exo1:1-Exo40:38"], capture_output=True, check=True).stdout.decode()
        prompt = " ".join(line.split(" ", 1)[1] for line in verses.splitlines()[:a.prompt_verses] if " " in line)
        tok = transformers.AutoTokenizer.from_pretrained(hf)
        ids = torch.tensor([tok(prompt)["input_ids"]])
        # Two drafts: the distilled one, and the target's own small form (the
        # same function: every guess holds, the most a draft can give).
        drafts = {}
        for name, d in (("distilled", draft), ("ideal", model)):
            onnx_path, plan = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}.sdp")
            export(d, onnx_path, 17, 1, 16)
            subprocess.run([sdc, "compile", onnx_path, "--kv-cache", str(CACHE), "--speculate", str(GUESSES), "-o",
                            plan], check=True, capture_output=True)
            drafts[name] = (d, plan, sum(p.numel() for p in d.parameters()))
        big = inflate(model, os.path.join(tmp, "big"), a.inflate, a.extra_layers)
        params = sum(p.numel() for p in big.parameters())
        onnx_path, plan = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "plan.sdp")
        export(big, onnx_path, 17, 1, 16)
        subprocess.run([sdc, "compile", onnx_path, "--kv-cache", str(CACHE), "--speculate", str(GUESSES), "-o", plan],
                       check=True, capture_output=True)
        results = time_sdrun(sdrun, plan, hf, prompt, a.new, a.threads, a.repeats,
                             [("sdrun, --draft distilled", ["--draft", drafts["distilled"][1]]),
                              ("sdrun, --draft ideal", ["--draft", drafts["ideal"][1]]),
                              ("sdrun, prompt lookup", []), ("sdrun, --speculate 0", ["--speculate", "0"])])
        for name, extra in (("transformers, assistant_model distilled", {"assistant_model": draft}),
                            ("transformers, assistant_model ideal", {"assistant_model": model}),
                            (f"transformers, prompt_lookup_num_tokens={GUESSES}", {"prompt_lookup_num_tokens": GUESSES}),
                            ("transformers", {})):
            results[name] = time_transformers(big, ids, a.new, a.threads, a.repeats, extra)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"prompt {ids.shape[1]} tokens ({a.prompt_verses} verses of Exodus), {a.new} new tokens, greedy, median of "
          f"{a.repeats}")
    print(f"target: the trained Llama ({a.train_steps} steps, last loss {losses[0]:.2f}) inflated ({a.inflate}x MLP "
          f"width, +{a.extra_layers} layers), {params / 1e6:.1f}M parameters")
    print(f"drafts: distilled, {a.draft_layers} layer(s) of {a.draft_hidden}, {drafts['distilled'][2] / 1e6:.2f}M "
          f"parameters, {a.distill_steps} steps (last KL {losses[1]:.3f} nats a token); ideal, the trained Llama "
          f"itself ({drafts['ideal'][2] / 1e6:.1f}M parameters, the target's function)\n")
    ref = results["transformers"][1]
    ref_text = tok.decode(ids[0].tolist() + ref)
    print("| runtime | decode (tokens/s) | x its plain decode | guesses confirmed | tokens a step | "
          "continuation as transformers' |")
    print("|---|---:|---:|---:|---:|---|")
    for name, result in results.items():
        plain = results["sdrun, --speculate 0" if name.startswith("sdrun") else "transformers"][0]
        if name.startswith("sdrun"):
            same = result[1] == ref_text
            confirmed = f"{result[2][0]} of {result[2][1]}" if result[2] else "-"
            per_step = result[2][2] if result[2] else "1"
        else:
            same, confirmed, per_step = result[1] == ref, "-", "-"
        print(f"| {name} | {result[0]:.0f} | {result[0] / plain:.2f} | {confirmed} | {per_step} | "
              f"{'same' if same else 'differs'} |")


if __name__ == "__main__":
    main()
