#!/usr/bin/env python3
"""A reward command for `sdrun train --reward-cmd` (GRPO sampling its own
groups): one JSON line in per completion, {"prompt", "completion",
"prompt_ids", "completion_ids"}, one reward out, flushed. Started once per
run (per rank), so a reward model could be loaded here once.

This one rewards completions that mention WORD (default "LORD") and stay
near LENGTH words (default 12):

  sdrun train grpo.sdp --data prompts.jsonl --tokenizer TOK \\
      --reward-cmd "python3 examples/grpo_reward.py --word LORD --length 12"
"""
import argparse
import json
import sys


def score(completion, word, length):
    words = [w.strip(",.;:!?") for w in completion.split()]
    return float(word in words) - abs(len(words) - length) / length


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--word", default="LORD")
    ap.add_argument("--length", type=int, default=12)
    a = ap.parse_args()
    for line in sys.stdin:
        request = json.loads(line)
        print(score(request["completion"], a.word, a.length), flush=True)


if __name__ == "__main__":
    main()
