#!/usr/bin/env python3
"""Mixed precision against PyTorch: `sdc compile --precision bf16` (sd-autocast:
matrix products and attention in bf16, f32 master weights, optimizer state,
norms and losses) trained by `sdrun train`, and the same model trained by
PyTorch with its forward under torch.autocast("cpu", dtype=torch.bfloat16)
and the same AdamW.

The two round the same products to bf16 but not every other op alike:
PyTorch's CPU autocast runs the ops after a bf16 product (GELU, softmax,
scaling) in bf16, we run them on the f32 copy. So the runs agree to bf16's
noise, not bit for bit, and at this model size our f32 plan is as close to
PyTorch's autocast run as our bf16 plan is (the test prints both): the loss
check bounds the bf16 plan's error, the IR check proves the products run in
bf16, and the f32 and bf16 plans must differ. fp16 is refused until dynamic
loss scaling lands."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import clean_error_problems, report_checks, sh, tool_paths
from test_training import BATCH, SEQ, ADAM_EPS, export_base, make_data, read_safetensors, torch_losses

RESULTS = []
STEPS = 10
LOSS_RTOL = 1e-2      # bf16 carries 8 significant bits: about 0.4% per rounding
UPDATE_RTOL = 0.1     # of the norm of PyTorch's total weight update


def check(name, ok, detail):
    RESULTS.append((name, bool(ok), detail))


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_models import Gpt
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="sd_mixed_")
    try:
        base, onnx_path = export_base(tmp)
        data = os.path.join(tmp, "train.jsonl")
        rows = make_data(data, 9, seed=3)
        lr, wd, clip = 2e-3, 0.1, 1.0
        losses = {}
        for precision in ("fp32", "bf16"):
            plan = os.path.join(tmp, f"{precision}.sdp")
            sh([sdc, "compile", onnx_path, "--peft", "none", "--precision", precision, "--shapes",
                f"input_ids={BATCH}x{SEQ}", "--adam-epsilon", str(ADAM_EPS), "-o", plan])
            metrics = os.path.join(tmp, f"{precision}.jsonl")
            weights = os.path.join(tmp, f"{precision}.safetensors")
            sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--threads", "2",
                "--lr", str(lr), "--weight-decay", str(wd), "--clip-norm", str(clip), "--metrics", metrics,
                "--save-weights", weights])
            losses[precision] = [json.loads(l)["loss"] for l in open(metrics)]
        config = json.loads(subprocess.run([sdrun, "inspect", os.path.join(tmp, "bf16.sdp")], capture_output=True,
                                           text=True).stdout.split("config: ")[1].splitlines()[0])
        check("the bf16 plan records its precision", config.get("precision") == "bf16", f"config {config}")
        ir = subprocess.run([sdc, "compile", onnx_path, "--peft", "none", "--precision", "bf16", "--shapes",
                             f"input_ids={BATCH}x{SEQ}", "--emit", "mlir"], capture_output=True, text=True).stdout
        linears = [l for l in ir.splitlines() if '"Linear"' in l or '"Attention"' in l]
        bf16_linears = [l for l in linears if "bf16" in l]
        check("bf16 plan: every linear and attention step computes in bf16", linears and len(bf16_linears) == len(linears),
              f"{len(bf16_linears)} of {len(linears)}")
        check("bf16 training differs from f32 training (autocast took effect)",
              losses["bf16"] != losses["fp32"], f"first losses {losses['fp32'][0]:.6f} / {losses['bf16'][0]:.6f}")

        model = Gpt(d=64, layers=2, heads=4, block=SEQ)
        model.load_state_dict(base.state_dict())
        ref = torch_losses(model, rows, STEPS, 1, lr, wd, clip, autocast=torch.bfloat16)
        ours = losses["bf16"]
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref)) if len(ours) == len(ref) else float("inf")
        # For scale: how far our f32 plan is from the same PyTorch autocast run.
        f32 = max(abs(a - b) / abs(b) for a, b in zip(losses["fp32"], ref))
        check(f"bf16: {STEPS} losses match PyTorch autocast", rel < LOSS_RTOL,
              f"max rel diff {rel:.2e}; our f32 plan's: {f32:.2e} (PyTorch first {ref[0]:.4f}, last {ref[-1]:.4f})")
        # Adam gives every element a step of about lr whatever its gradient's
        # size, so elements with tiny gradients (the key bias, whose exact
        # gradient is zero) move by bf16 rounding noise in both runs; the
        # updates are compared as a whole instead of element by element.
        got = read_safetensors(os.path.join(tmp, "bf16.safetensors"))
        state, start = dict(model.named_parameters()), dict(base.named_parameters())
        diff = update = 0.0
        for name, w in got.items():
            want, w0 = state[name].detach().numpy(), start[name].detach().numpy()
            diff += float(np.sum((w - want) ** 2))
            update += float(np.sum((want - w0) ** 2))
        rel = (diff / update) ** 0.5 if update > 0 else float("inf")
        check("bf16: the f32 master weights' update matches PyTorch autocast's",
              rel < UPDATE_RTOL and len(got) == len(state),
              f"|ours - PyTorch| / |PyTorch's update| = {rel:.3f} over {len(got)} tensors")

        for label, flag, needle in [("fp16 is refused until loss scaling lands", "fp16", "loss scaling"),
                                    ("an unknown precision is refused", "fp8", "fp32 or bf16")]:
            problems, line = clean_error_problems([sdc, "compile", onnx_path, "--precision", flag, "-o",
                                                   os.path.join(tmp, "x.sdp")], [needle],
                                                  [os.path.join(tmp, "x.sdp")])
            check(label, not problems, "; ".join(problems) or line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report_checks("mixed_precision", RESULTS)


if __name__ == "__main__":
    sys.exit(main())
