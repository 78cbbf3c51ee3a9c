#!/usr/bin/env python3
"""The cost of structured output's token mask, in one run on the same tokens:
for JSON documents that follow a schema, token by token, the time to decide
which tokens of the whole vocabulary may come next.

  sdrun (sd_json_mask_bench):  JsonConstraint::allowedTokens, the full mask
                               (what sampling with top_p < 1 asks for; greedy,
                               top-k and plain temperature ask about fewer tokens)
  xgrammar:                    GrammarMatcher.fill_next_token_bitmask (the
                               engine vLLM and SGLang use), its JSON-schema
                               grammar set to compact JSON as ours is

The vocabulary is a byte-level BPE of --vocab tokens trained on the KJV Bible
and fortune-mod's texts (as GPT-2's and Llama 3's are byte-level); the documents are verse records:
book (an enum), chapter (an integer), the verse text (a long string), and up
to three words (an array). Both must allow every token of every document.
xgrammar compiles the grammar once before timing (its compile time is
reported apart); each mask is timed alone.

  bench/structured_bench.py [--build build] [--vocab 32000] [--docs 40]
"""
import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from peers import cpu_model  # noqa: E402

BOOKS = ["Genesis", "Exodus", "Psalms", "Proverbs", "John", "Revelation"]
SCHEMA = {"type": "object", "properties": {
    "book": {"enum": BOOKS}, "chapter": {"type": "integer"}, "text": {"type": "string"},
    "words": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["book", "chapter", "text", "words"], "additionalProperties": False}


def train_tokenizer(folder, lines, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>"}, f)
    return tok.get_vocab_size()


def documents(lines, count):
    docs = []
    verses = [line.split(None, 1) for line in lines if len(line) > 40]
    for i, (first, text) in enumerate(v for v in verses if v[0].isdigit()):
        if i == count:
            break
        chapter = int(first)
        docs.append(json.dumps({"book": BOOKS[i % len(BOOKS)], "chapter": chapter, "text": text.strip(),
                                "words": text.split()[:i % 4]}, separators=(",", ":"), ensure_ascii=False))
    return docs


def xgrammar_masks(folder, docs):
    import torch  # noqa: F401  (xgrammar's bitmask is a torch tensor)
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"), eos_token="<|endoftext|>")
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    start = time.perf_counter()
    grammar = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                            separators=(",", ":"), strict_mode=True)
    compile_ms = (time.perf_counter() - start) * 1e3
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for doc in docs:
        m = xgr.GrammarMatcher(grammar)
        for t in hf.encode(doc, add_special_tokens=False):
            start = time.perf_counter()
            m.fill_next_token_bitmask(mask)
            times.append((time.perf_counter() - start) * 1e6)
            if not (int(mask[0, t // 32]) >> (t % 32)) & 1:
                raise RuntimeError(f"xgrammar masks out token {t} of {doc[:60]!r}")
            if not m.accept_token(t):
                raise RuntimeError(f"xgrammar refuses token {t} of {doc[:60]!r}")
    times.sort()
    return {"tokens": len(times), "mean_us": statistics.fmean(times), "p50_us": times[len(times) // 2],
            "p99_us": times[min(len(times) - 1, len(times) * 99 // 100)]}, compile_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--docs", type=int, default=40)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sd_structured_bench_")
    keep = os.environ.get("SD_STRUCTURED_BENCH_KEEP")  # a folder to leave the tokenizer, schema and documents in
    if keep:
        tmp = keep
        os.makedirs(tmp, exist_ok=True)
    try:
        lines = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        folder = os.path.join(tmp, "tok")
        fortunes = []
        for name in ("fortunes", "literature", "riddles"):  # fortune-mod's: more words than the Bible's
            path = os.path.join("/usr/share/games/fortunes", name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    fortunes += f.read().splitlines()
        vocab = train_tokenizer(folder, lines + fortunes, a.vocab)
        docs = documents(lines[1000::300], a.docs)
        schema_path, docs_path = os.path.join(tmp, "schema.json"), os.path.join(tmp, "docs.jsonl")
        with open(schema_path, "w") as f:
            json.dump(SCHEMA, f)
        with open(docs_path, "w") as f:
            f.write("\n".join(docs) + "\n")
        out = subprocess.run([os.path.join(a.build, "bench", "sd_json_mask_bench"), folder, schema_path, docs_path],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError("sd_json_mask_bench: " + out.stderr[-400:])
        ours = json.loads(out.stdout)
        theirs, compile_ms = xgrammar_masks(folder, docs)
        print(f"CPU: {cpu_model()}; xgrammar {importlib.metadata.version('xgrammar')}; vocabulary {vocab} (byte-level BPE on KJV and fortune-mod's texts); "
              f"{len(docs)} documents, {ours['tokens']} tokens (xgrammar: {theirs['tokens']}); "
              f"xgrammar's grammar compile {compile_ms:.0f} ms (not in its masks)")
        print("| Mask per token | mean (us) | median (us) | p99 (us) |")
        print("|---|---|---|---|")
        for name, r in [("sdrun JsonConstraint", ours), ("xgrammar", theirs)]:
            print(f"| {name} | {r['mean_us']:.1f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |")
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
