#!/usr/bin/env python3
"""Decoding a 4-bit model against ONNX Runtime GenAI on the same files, in
one run at the same threads: onnxruntime-genai's model builder writes the
model twice from one transformers checkpoint, `-p int4 -e cpu` (MatMulNBits,
4-bit weights in blocks of 32, its CPU default accuracy_level 4: activations
quantized to int8 inside ONNX Runtime) and `-p fp32 -e cpu`; sdrun compiles
each file as it is (`sdc compile --kv-cache 256 --prefill-chunk 64`) and
og.Generator runs each folder, greedy. A third sdrun plan is the fp32 file compiled with
`--quantize int4` (sdc's own 4-bit weights; its tokens are compared with
onnxruntime-genai's int4 ones, from other codes).

The model is a Llama-architecture decoder from a transformers config with
seeded random weights (default: hidden 1024, 8 layers, 16 heads, 8 KV heads,
MLP 2816, vocabulary 1536 of a BPE trained on Genesis; about 97M
parameters, so decoding reads 0.39 GB of f32 weights a token, 50 MB in int4).
Prefill is timed to the first new token; decode rate = (new - 1) / (time to
the last token - time to the first). Median of --repeats.

  bench/int4_decode_bench.py [--build build] [--threads 2] [--new 64] [--repeats 3]
                             [--hidden 1024] [--layers 8] [--mlp 2816]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from decode_bench import PROMPT_TOKENS, CACHE, time_genai, time_sdrun  # noqa: E402
from peers import cpu_model  # noqa: E402

# The builder takes any linear layer with as many outputs as the vocabulary
# for the LM head, so the vocabulary must differ from every projection's width.
VOCAB = 1536


def build_model(folder, hidden, layers, mlp):
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    lines = subprocess.run(["bible", "Gen1:1-Gen50:26"], capture_output=True, check=True).stdout.decode().split("\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"], show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<s>")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp,
                                   num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                                   max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=0,
                                   eos_token_id=1, pad_token_id=0, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return tok.encode(" ".join(lines[100:140])).ids[:PROMPT_TOKENS], params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=2816)
    a = ap.parse_args()
    import onnxruntime_genai
    tmp = tempfile.mkdtemp(prefix="sd_int4_bench_")
    try:
        hf = os.path.join(tmp, "hf")
        prompt, params = build_model(hf, a.hidden, a.layers, a.mlp)
        results, sizes = {}, {}
        for precision in ("int4", "fp32"):
            folder, plan = os.path.join(tmp, precision), os.path.join(tmp, precision + ".sdp")
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf, "-i", hf, "-o",
                            folder, "-p", precision, "-e", "cpu"], check=True, capture_output=True)
            subprocess.run([os.path.join(a.build, "tools", "sdc"), "compile", os.path.join(folder, "model.onnx"),
                            "--kv-cache", str(CACHE), "--prefill-chunk", str(PROMPT_TOKENS), "-o", plan], check=True,
                           capture_output=True)
            sizes[precision] = os.path.getsize(plan)
            results[f"sdrun {precision}"] = time_sdrun(a.build, plan, prompt, a.new, a.threads, a.repeats)
            results[f"ONNX Runtime GenAI {precision}"] = time_genai(folder, prompt, a.new, a.threads, a.repeats)
        # sdc's own 4-bit weights from the fp32 file (sdc compile --quantize int4).
        plan = os.path.join(tmp, "own_int4.sdp")
        subprocess.run([os.path.join(a.build, "tools", "sdc"), "compile", os.path.join(tmp, "fp32", "model.onnx"),
                        "--quantize", "int4", "--kv-cache", str(CACHE), "--prefill-chunk", str(PROMPT_TOKENS), "-o",
                        plan], check=True, capture_output=True)
        results["sdrun fp32 file --quantize int4"] = time_sdrun(a.build, plan, prompt, a.new, a.threads, a.repeats)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; onnxruntime-genai {onnxruntime_genai.__version__}")
    print(f"Llama {params / 1e6:.0f}M parameters (hidden {a.hidden}, {a.layers} layers, MLP {a.mlp}); plans "
          f"{sizes['int4'] / 1e6:.0f} MB (int4) and {sizes['fp32'] / 1e6:.0f} MB (fp32); prompt {len(prompt)} "
          f"tokens, {a.new} new tokens, greedy, median of {a.repeats}\n")
    print("| runtime | prefill (ms) | decode (tokens/s) | greedy tokens equal to ONNX Runtime GenAI's on the same file |")
    print("|---|---:|---:|---|")
    for name, (runs, tokens) in results.items():
        peer = results["ONNX Runtime GenAI " + ("int4" if name.endswith("int4") else "fp32")][1]
        same = sum(1 for x, y in zip(tokens, peer) if x == y) if len(tokens) == len(peer) else 0
        prefill = statistics.median(r[0] for r in runs) * 1e3
        rate = statistics.median(r[1] for r in runs)
        print(f"| {name} | {prefill:.1f} | {rate:.1f} | {same}/{len(peer)} |")


if __name__ == "__main__":
    main()
