#!/usr/bin/env python3
"""Cuts plain text into JSON Lines of byte-level training examples:
{"text": "..."} per chunk of at most --chunk bytes, cut at whitespace.
With --records SEP, lines equal to SEP end a record (a fortune-mod file's
"%") and every record starts a new example: short examples that
`sdc compile --packing` plans pack several to a row.

  text_to_jsonl.py --chunk 128 [--records %] [--eval-every 50 --eval-out eval.jsonl] < text > train.jsonl
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--eval-every", type=int, default=0, help="send every Nth chunk to --eval-out")
    ap.add_argument("--eval-out")
    ap.add_argument("--records", help="a line equal to this ends a record; each record starts a new example")
    args = ap.parse_args()
    text = sys.stdin.buffer.read().decode("utf-8", "replace")
    if args.records is None:
        records = [text]
    else:
        records, current = [], []
        for line in text.splitlines():
            if line.strip() == args.records:
                records.append("\n".join(current))
                current = []
            else:
                current.append(line)
        records.append("\n".join(current))
    ev = open(args.eval_out, "w") if args.eval_out else None
    n = 0
    for record in records:
        for chunk in chunks(record, args.chunk):
            n += 1
            out = ev if ev and args.eval_every and n % args.eval_every == 0 else sys.stdout
            out.write(json.dumps({"text": chunk}) + "\n")


def chunks(text, size):
    """Whitespace-normalized pieces of at most `size` bytes, cut at spaces."""
    data = " ".join(text.split()).encode("ascii", "replace")
    start = 0
    while start < len(data):
        end = min(len(data), start + size)
        if end < len(data):
            cut = data.rfind(b" ", start, end)
            end = cut if cut > start else end
        chunk = data[start:end].decode("ascii")
        start = end + 1
        if len(chunk) >= 2:
            yield chunk


if __name__ == "__main__":
    main()
