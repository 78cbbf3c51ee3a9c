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
bf16, and the f32 and bf16 plans must differ.

fp16 (`--precision fp16`) adds dynamic loss scaling, checked against
torch.amp.GradScaler on the same autocast run: the same steps are skipped for
an Inf/NaN gradient and the loss scale takes the same values (halved on a
skip, doubled after a window of clean steps), the losses and the update agree
to fp16's noise. A skipped step leaves weights, moments, gradients and the
step counter exactly as they were, and a resumed fp16 run repeats the
uninterrupted one bit for bit (the scale and its window live in the
checkpoint)."""
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
LOSS_SCALE_WINDOW = 3  # short, so that 10 steps see skips, a growth and a skip after it
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
        fp16_flags = ["--loss-scale-window", str(LOSS_SCALE_WINDOW)]
        train = lambda plan: [sdrun, "train", plan, "--data", data, "--no-shuffle", "--threads", "2", "--lr", str(lr),
                              "--weight-decay", str(wd), "--clip-norm", str(clip)]
        records = {}
        for precision in ("fp32", "bf16", "fp16"):
            plan = os.path.join(tmp, f"{precision}.sdp")
            sh([sdc, "compile", onnx_path, "--peft", "none", "--precision", precision, "--shapes",
                f"input_ids={BATCH}x{SEQ}", "--adam-epsilon", str(ADAM_EPS), "-o", plan] +
               (fp16_flags if precision == "fp16" else []))
            metrics = os.path.join(tmp, f"{precision}.jsonl")
            weights = os.path.join(tmp, f"{precision}.safetensors")
            sh(train(plan) + ["--steps", str(STEPS), "--metrics", metrics, "--save-weights", weights])
            records[precision] = [json.loads(l) for l in open(metrics)]
            losses[precision] = [r["loss"] for r in records[precision]]
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

        check_fp16(sdc, sdrun, tmp, onnx_path, base, rows, records["fp16"], train, lr, wd, clip)

        bad = [("an unknown precision is refused", ["--precision", "fp8"], "fp32, bf16 or fp16"),
               ("a loss scale without fp16 is refused", ["--precision", "bf16", "--loss-scale-init", "8"], "fp16"),
               ("a loss scale that is not positive is refused", ["--precision", "fp16", "--loss-scale-init", "-1"],
                "positive"),
               ("a loss-scale window of 0 is refused", ["--precision", "fp16", "--loss-scale-window", "0"],
                "whole number of steps")]
        for label, flags, needle in bad:
            problems, line = clean_error_problems([sdc, "compile", onnx_path] + flags + ["-o", os.path.join(tmp, "x.sdp")],
                                                  [needle], [os.path.join(tmp, "x.sdp")])
            check(label, not problems, "; ".join(problems) or line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report_checks("mixed_precision", RESULTS)


def check_fp16(sdc, sdrun, tmp, onnx_path, base, rows, ours, train, lr, wd, clip):
    import torch
    from export_models import Gpt
    model = Gpt(d=64, layers=2, heads=4, block=SEQ)
    model.load_state_dict(base.state_dict())
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0, growth_interval=LOSS_SCALE_WINDOW)
    scales = []
    ref = torch_losses(model, rows, STEPS, 1, lr, wd, clip, autocast=torch.float16, scaler=scaler, scales=scales)
    mine = [(r.get("skipped"), r.get("loss_scale")) for r in ours]
    check("fp16: the same steps are skipped and the loss scale takes the same values as GradScaler's",
          mine == [(bool(s), float(v)) for s, v in scales] and any(s for s, _ in scales) and
          any(b > a for (_, a), (_, b) in zip(scales, scales[1:])),
          f"ours {mine}; PyTorch {scales}")
    check("fp16: a skipped step reports no gradient norm", all((r["grad_norm"] is None) == r["skipped"] for r in ours),
          f"{[r['grad_norm'] for r in ours]}")
    rel = max(abs(r["loss"] - b) / abs(b) for r, b in zip(ours, ref)) if len(ours) == len(ref) else float("inf")
    check(f"fp16: {STEPS} losses match PyTorch autocast + GradScaler", rel < LOSS_RTOL,
          f"max rel diff {rel:.2e} (PyTorch first {ref[0]:.4f}, last {ref[-1]:.4f})")
    got = read_safetensors(os.path.join(tmp, "fp16.safetensors"))
    state, start = dict(model.named_parameters()), dict(base.named_parameters())
    diff = sum(float(np.sum((w - state[n].detach().numpy()) ** 2)) for n, w in got.items())
    update = sum(float(np.sum((state[n] - start[n]).detach().numpy() ** 2)) for n in got)
    rel = (diff / update) ** 0.5 if update > 0 else float("inf")
    check("fp16: the f32 master weights' update matches PyTorch's", rel < UPDATE_RTOL and len(got) == len(state),
          f"|ours - PyTorch| / |PyTorch's update| = {rel:.3f} over {len(got)} tensors")

    # A scale no gradient survives: the one step is skipped; everything but
    # the scale keeps its bits.
    huge = os.path.join(tmp, "huge.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "none", "--precision", "fp16", "--loss-scale-init", "1e30", "--shapes",
        f"input_ids={BATCH}x{SEQ}", "-o", huge])
    ck = os.path.join(tmp, "huge_ck")
    sh(train(huge) + ["--steps", "1", "--checkpoint-dir", ck])
    saved = read_safetensors(os.path.join(ck, "checkpoint-1", "state.safetensors"))
    initial = {n: p.detach().numpy() for n, p in base.named_parameters()}
    changed = [n for n, v in saved.items() if n != "loss_scale" and
               not (np.array_equal(v.view(np.uint32), initial[n].view(np.uint32)) if n in initial else not v.any())]
    check("fp16: a skipped step keeps weights bit for bit, moments, gradients and step count at zero",
          not changed and len(initial) > 0 and all(n in saved for n in initial) and
          float(saved["loss_scale"]) == float(np.float32(1e30) * np.float32(0.5)),
          f"{len(saved)} tensors, changed: {changed[:5]}, loss_scale {saved.get('loss_scale')}")

    # The Python binding's StepReport (through the C API) reports the same.
    sdc_dir = os.path.join(os.path.dirname(os.path.dirname(sdc)), "python")
    code = ("import sys, json, sdc\n"
            "s = sdc.Session(sdc.Plan(sys.argv[1]), threads=2)\n"
            "t = sdc.Trainer(s, data=sys.argv[2], steps=int(sys.argv[3]), lr=float(sys.argv[4]),\n"
            "                weight_decay=float(sys.argv[5]), clip_norm=float(sys.argv[6]), shuffle=False)\n"
            "print(json.dumps([[r.skipped, r.loss_scale, r.loss] for r in t]))\n")
    r = subprocess.run([sys.executable, "-c", code, os.path.join(tmp, "fp16.sdp"), train(None)[4], str(STEPS),
                        str(lr), str(wd), str(clip)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=sdc_dir))
    py = json.loads(r.stdout) if r.returncode == 0 else r.stderr.strip()[-600:]
    if isinstance(py, list):
        py = [[s, scale, float(f"{loss:.8g}")] for s, scale, loss in py]  # as the metrics file prints it
    check("fp16: Python's StepReport carries skipped and loss_scale (the C API's sd_step_report)",
          py == [[r["skipped"], r["loss_scale"], r["loss"]] for r in ours], f"{py}")

    # Resume across the skips and the growth: the same records bit for bit.
    plan = os.path.join(tmp, "fp16.sdp")
    ck, metrics = os.path.join(tmp, "fp16_ck"), os.path.join(tmp, "fp16_resumed.jsonl")
    sh(train(plan) + ["--steps", "5", "--checkpoint-dir", ck, "--metrics", metrics])
    sh(train(plan) + ["--steps", str(STEPS), "--checkpoint-dir", ck, "--metrics", metrics, "--resume"])
    keys = ("step", "loss", "grad_norm", "loss_scale", "skipped")
    resumed = [tuple(json.loads(l).get(k) for k in keys) for l in open(metrics)]
    straight = [tuple(r.get(k) for k in keys) for r in ours]
    check("fp16: a run resumed at step 5 repeats the uninterrupted one (scale and window in the checkpoint)",
          resumed == straight, f"{len(resumed)} records; first difference: "
          f"{next(((a, b) for a, b in zip(resumed, straight) if a != b), None)}")


if __name__ == "__main__":
    sys.exit(main())
