#!/usr/bin/env python3
"""Writes the plans, inputs, data and CPU reference results that
`gpu-check.sh --run` compares a GPU against: every plan kind of
test/e2e/test_cuda_plans.py, its inference outputs and, for training plans,
20 training steps' losses and weights on the CPU.

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
    data = cp.write_data(os.path.join(args.out, "train.jsonl"))
    for sub in ("plans", "inputs", "ref"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    for p in plans:
        shutil.copy(p.plan, os.path.join(args.out, "plans", f"{p.kind}.sdp"))
        # inputs/KIND.NAME.npy: the infer entry's input NAME (none: a decoding plan without one).
        for name, f in [(p.input_name, p.input_file), *p.more_inputs.items()]:
            if f:
                shutil.copy(f, os.path.join(args.out, "inputs", f"{p.kind}.{name}.npy"))
        if p.data:  # data/KIND: a tensor-data plan's training arrays, or a preference plan's pairs file
            os.makedirs(os.path.join(args.out, "data"), exist_ok=True)
            (shutil.copytree if os.path.isdir(p.data) else shutil.copy)(p.data, os.path.join(args.out, "data", p.kind))
        ref = os.path.join(args.out, "ref", p.kind)
        os.makedirs(ref, exist_ok=True)
        # The plan's GPU-vs-CPU tolerances (half precision gets wider ones).
        with open(os.path.join(ref, "tolerances"), "w") as f:
            f.write(" ".join(str(p.tol[k]) for k in ("logits_rtol", "logits_atol", "loss_rtol", "weights_atol")) + "\n")
        if p.cpu_ops:  # a second GPU infer puts these ops on the CPU (sdrun --cpu-ops)
            with open(os.path.join(ref, "cpu-ops"), "w") as f:
                f.write(",".join(p.cpu_ops) + "\n")
        if p.input_file:
            np.save(ref + "-infer.npy", cp.infer(sdrun, p, "cpu", os.path.join(work, p.kind, "infer")))
        if p.prompts:  # a decoding plan: the prompts, a line each, and the CPU's greedy text
            with open(os.path.join(ref, "prompts"), "w") as f:
                f.write("\n".join(p.prompts) + "\n")
            with open(os.path.join(ref, "generate.txt"), "wb") as f:
                f.write(cp.generate(sdrun, p.plan, p.prompts, "cpu"))
        if p.trains:
            cp.train(sdrun, p.plan, "cpu", p.data or data, ref, p.kind)
        print(f"gpu_bundle: {p.kind}: plan" + (", infer outputs" if p.input_file else "") +
              (", greedy text" if p.prompts else "") + (f", {cp.STEPS} training steps" if p.trains else "") +
              " on the CPU")
    shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
