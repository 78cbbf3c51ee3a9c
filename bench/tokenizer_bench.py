#!/usr/bin/env python3
"""Tokenizer encode throughput: sdrun tokenize against the `tokenizers`
library on the same tokenizer.json (a GPT-2-style byte-level BPE trained here
on the KJV) and the same text (the whole KJV, one encode per line), in one run.

  sdrun:                 `sdrun tokenize` end to end (load, read stdin, encode,
                         print JSON), one thread, best of --repeats
  tokenizers encode:     Tokenizer.encode per line from Python, one thread
  tokenizers encode_batch: all lines in one call (the library's threads; set
                         RAYON_NUM_THREADS to pin them)

  bench/tokenizer_bench.py [--build build] [--vocab 8000] [--repeats 3]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import cpu_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build"))
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    raw = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, check=True).stdout
    lines = raw.decode().split("\n")
    tmp = tempfile.mkdtemp(prefix="sd_tokbench_")
    path = os.path.join(tmp, "tokenizer.json")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=a.vocab, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    tok = Tokenizer.from_file(path)
    mb = len(raw) / 1e6

    def best(fn):
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    sdrun = os.path.join(a.build, "tools", "sdrun")
    ours = best(lambda: subprocess.run([sdrun, "tokenize", "--tokenizer", path], input=raw, stdout=subprocess.DEVNULL,
                                       check=True))
    per_line = best(lambda: [tok.encode(l) for l in lines])
    batch = best(lambda: tok.encode_batch(lines))
    tokens = sum(len(e.ids) for e in tok.encode_batch(lines))
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores; tokenizers {tokenizers.__version__}; "
          f"KJV {mb:.2f} MB, {len(lines)} lines, {tokens} tokens, vocab {a.vocab}")
    for who, s in [("sdrun tokenize (1 thread, end to end)", ours), ("tokenizers encode per line (1 thread)", per_line),
                   ("tokenizers encode_batch (its threads)", batch)]:
        print(f"{who:42s} {s * 1000:8.0f} ms  {mb / s:6.2f} MB/s  {tokens / s / 1e6:5.2f} M tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
