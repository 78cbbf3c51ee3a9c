#!/usr/bin/python3
"""Cuts plain text into JSON Lines of byte-level training examples:
{"text": "..."} per chunk of at most --chunk bytes, cut at whitespace.

  text_to_jsonl.py --chunk 128 [--eval-every 50 --eval-out eval.jsonl] < text > train.jsonl
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--eval-every", type=int, default=0, help="send every Nth chunk to --eval-out")
    ap.add_argument("--eval-out")
    args = ap.parse_args()
    text = " ".join(sys.stdin.buffer.read().decode("utf-8", "replace").split())
    data = text.encode("ascii", "replace")
    ev = open(args.eval_out, "w") if args.eval_out else None
    n, start = 0, 0
    while start < len(data):
        end = min(len(data), start + args.chunk)
        if end < len(data):
            cut = data.rfind(b" ", start, end)
            end = cut if cut > start else end
        chunk = data[start:end].decode("ascii")
        start = end + 1
        if len(chunk) < 2:
            continue
        n += 1
        out = ev if ev and args.eval_every and n % args.eval_every == 0 else sys.stdout
        out.write(json.dumps({"text": chunk}) + "\n")


if __name__ == "__main__":
    main()
