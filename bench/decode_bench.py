#!/usr/bin/env python3
"""Decoding with a key/value cache, in one run at the same threads: prefill
time for a 64-token prompt and decode tokens/s for --new greedy tokens.

  sdrun:              a plan compiled with `sdc compile --kv-cache 256
                      --prefill-chunk 64` from the TorchScript export, driven
                      in-process through the sdc Python module (the C API's
                      generator: one prefill call, then one decode step per token)
  ONNX Runtime GenAI: the same weights built by onnxruntime_genai's model builder
                      (-p fp32 -e cpu: GroupQueryAttention, rotary and skip-RMSNorm
                      contrib ops), og.Generator with greedy search
  transformers:       LlamaForCausalLM.generate (its dynamic cache, greedy)

The model is a Llama-architecture decoder built from a transformers config
with seeded random weights (vocab 1024, hidden 256, 4 layers, 8 heads, 4 KV
heads), its byte-level BPE tokenizer trained on Genesis (KJV). Prefill is
timed to the first new token; decode rate = (new - 1) / (time to the last
token - time to the first). Median of --repeats. The three greedy
continuations are compared token by token.

  bench/decode_bench.py [--build build] [--threads 2] [--new 128] [--repeats 3]
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from peers import cpu_model  # noqa: E402

PROMPT_TOKENS, CACHE = 64, 256


def build_model(folder):
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    lines = subprocess.run(["bible", "Gen1:1-Gen50:26"], capture_output=True, check=True).stdout.decode().split("\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1024, special_tokens=["<s>", "</s>"], show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<s>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                                   attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    prompt = tok.encode(" ".join(lines[100:140])).ids[:PROMPT_TOKENS]
    return model, prompt


def time_sdrun(build, plan, prompt, new, threads, repeats):
    sys.path.insert(0, os.path.join(build, "python"))
    import sdc
    session = sdc.Session(sdc.Plan(plan), threads=threads)
    runs, tokens = [], None
    for _ in range(repeats):
        gen = sdc.Generator(session, temperature=0)  # a fresh generator: its cache holds nothing yet
        ids = list(prompt)
        t0 = time.perf_counter()
        ids.append(gen.next(ids))
        t1 = time.perf_counter()
        for _ in range(new - 1):
            ids.append(gen.next(ids))
        t2 = time.perf_counter()
        runs.append((t1 - t0, (new - 1) / (t2 - t1)))
        tokens = ids[len(prompt):]
    return runs, tokens


def time_genai(folder, prompt, new, threads, repeats):
    import onnxruntime_genai as og
    cfg_path = os.path.join(folder, "genai_config.json")
    cfg = json.load(open(cfg_path))
    cfg["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    cfg["model"]["decoder"]["session_options"]["inter_op_num_threads"] = 1
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    model = og.Model(folder)
    runs, tokens = [], None
    for _ in range(repeats):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + new, min_length=len(prompt) + new)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompt)
        gen.generate_next_token()
        t1 = time.perf_counter()
        for _ in range(new - 1):
            gen.generate_next_token()
        t2 = time.perf_counter()
        runs.append((t1 - t0, (new - 1) / (t2 - t1)))
        tokens = list(gen.get_sequence(0))[len(prompt):]
    return runs, tokens


def time_transformers(model, prompt, new, threads, repeats):
    import torch
    torch.set_num_threads(threads)
    ids = torch.tensor([prompt])
    runs, tokens = [], None
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.generate(input_ids=ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
            t1 = time.perf_counter()
            out = model.generate(input_ids=ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
            t2 = time.perf_counter()
            # Decode alone: the full run less its prefill (the first token).
            runs.append((t1 - t0, (new - 1) / max((t2 - t1) - (t1 - t0), 1e-9)))
            tokens = out[0, len(prompt):].tolist()
    return runs, tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import onnxruntime_genai
    import torch
    import transformers
    from export_hf import export
    tmp = tempfile.mkdtemp(prefix="sd_decode_bench_")
    try:
        hf = os.path.join(tmp, "hf")
        model, prompt = build_model(hf)
        onnx_path, plan = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "plan.sdp")
        export(model, onnx_path, 17, 1, 16)
        subprocess.run([os.path.join(a.build, "tools", "sdc"), "compile", onnx_path, "--kv-cache", str(CACHE),
                        "--prefill-chunk", str(PROMPT_TOKENS), "-o", plan], check=True)
        genai = os.path.join(tmp, "genai")
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf, "-i", hf, "-o", genai,
                        "-p", "fp32", "-e", "cpu"], check=True, capture_output=True)
        results = {"sdrun": time_sdrun(a.build, plan, prompt, a.new, a.threads, a.repeats),
                   "ONNX Runtime GenAI": time_genai(genai, prompt, a.new, a.threads, a.repeats),
                   "transformers generate": time_transformers(model, prompt, a.new, a.threads, a.repeats)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ref = results["transformers generate"][1]
    print(f"CPU: {cpu_model()}, {a.threads} threads; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"onnxruntime-genai {onnxruntime_genai.__version__}")
    print(f"prompt {len(prompt)} tokens, {a.new} new tokens, greedy, median of {a.repeats}\n")
    print("| runtime | prefill (ms) | decode (tokens/s) | greedy tokens equal to transformers' |")
    print("|---|---|---|---|")
    for name, (runs, tokens) in results.items():
        prefill = statistics.median(r[0] for r in runs) * 1e3
        rate = statistics.median(r[1] for r in runs)
        same = sum(1 for x, y in zip(tokens, ref) if x == y) if len(tokens) == len(ref) else 0
        first_diff = next((i for i, (x, y) in enumerate(zip(tokens, ref)) if x != y), None)
        agree = f"{same}/{len(ref)}" + (f" (first difference at {first_diff})" if first_diff is not None else "")
        print(f"| {name} | {prefill:.2f} | {rate:.0f} | {agree} |")


if __name__ == "__main__":
    main()
