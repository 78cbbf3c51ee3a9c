#!/usr/bin/env python3
"""Writes the plans, data and CPU reference results that `gpu-check.sh --run`
compares a GPU against: the tiny GPT's LoRA, full fine-tuning and packed-LoRA
plans (the same as test/e2e/test_cuda_plans.py), their inference logits and
their 20-step training losses and weights on the CPU.

  gpu_bundle.py --build BUILD --out BUNDLE"""
import argparse
import os
import shutil
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
import test_cuda_plans as cp  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sdc, sdrun = os.path.join(args.build, "tools", "sdc"), os.path.join(args.build, "tools", "sdrun")
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    plans = cp.plans(sdc, work)
    tokens = os.path.join(args.out, "tokens.npy")
    np.save(tokens, (np.arange(8, dtype=np.int64) * 37 % 256).reshape(1, 8))
    data = cp.write_data(os.path.join(args.out, "train.jsonl"))
    os.makedirs(os.path.join(args.out, "plans"), exist_ok=True)
    for kind, plan in plans:
        shutil.copy(plan, os.path.join(args.out, "plans", f"{kind}.sdp"))
        ref = os.path.join(args.out, "ref", kind)
        logits = cp.infer(sdrun, plan, "cpu", tokens, os.path.join(work, kind, "infer"))
        os.makedirs(ref, exist_ok=True)
        np.save(ref + "-infer.npy", logits)
        cp.train(sdrun, plan, "cpu", data, ref, kind)
        print(f"gpu_bundle: {kind}: plan, logits, {cp.STEPS} training steps on the CPU")
    shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
