"""BitFit (sdc compile --peft bitfit: only the bias terms train) against
PyTorch with every parameter but the biases frozen, on transformers' GPT-2
(biases in every layer and LayerNorm) and Qwen2 (biases on q/k/v only,
RMSNorm without one), built from configs with seeded random weights.

  selection  the plan trains exactly the parameters PyTorch names *.bias
  training   sdrun train gives PyTorch's AdamW losses and bias tensors
             step for step (1e-4 relative)
  merging    sdc merge --weights puts the trained biases into the ONNX
             model, and ONNX Runtime on it gives PyTorch's trained logits
  refusals   a model without biases (Llama), --target-modules, --quantize
             and --save-adapter on a BitFit plan are one-line errors
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import (ROOT, clean_error_problems, norm_rel_err, ort_run, peft_steps, rel_err, sh, tool_paths,
                      write_token_rows)
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
BATCH, SEQ, STEPS, LR = 2, 16, 8, 1e-3


def arch_checks(arch, tmp, sdc, sdrun):
    import torch
    import export_hf
    import sdc as sdc_module
    from safetensors.numpy import load_file
    d = os.path.join(tmp, arch)
    os.makedirs(d)
    onnx_path, data, plan = (os.path.join(d, n) for n in ("model.onnx", "train.jsonl", "plan.sdp"))
    export_hf.export(export_hf.build(arch, 0), onnx_path, opset=17, batch=BATCH, seq=SEQ)
    write_token_rows(data, np.random.default_rng(3), 256, 2 * STEPS, SEQ)
    sh([sdc, "compile", onnx_path, "--peft", "bitfit", "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes",
        f"input_ids={BATCH}x{SEQ}", "-o", plan])

    model = export_hf.build(arch, 0)
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(".bias"))
    biases = {n for n, p in model.named_parameters() if p.requires_grad}
    trained = {g[0] for g in sdc_module.Plan(plan).globals if g[3] == "trainable"}
    check(f"{arch}: the plan trains exactly PyTorch's {len(biases)} bias parameters", trained == biases,
          f"only the plan's: {sorted(trained - biases)[:3]}, only PyTorch's: {sorted(biases - trained)[:3]}")

    rows = [json.loads(l)["input_ids"] for l in open(data)]
    want = peft_steps(model, rows, STEPS, BATCH, LR)
    weights, metrics = os.path.join(d, "trained.safetensors"), os.path.join(d, "metrics.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--metrics", metrics, "--save-weights", weights])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
    ours = load_file(weights)
    theirs = {n: p.detach().numpy() for n, p in model.named_parameters() if p.requires_grad}
    errs = {k: norm_rel_err(ours[k], v) for k, v in theirs.items() if k in ours}
    worst = max(errs, key=errs.get) if errs else "none"
    check(f"{arch}: {STEPS} AdamW steps give PyTorch's losses and all {len(theirs)} biases (1e-4)",
          set(ours) == set(theirs) and loss_err <= 1e-4 and errs.get(worst, 1) <= 1e-4,
          f"losses {losses[:2]} vs PyTorch {want[:2]}, worst loss err {loss_err:.1e}, worst tensor err "
          f"{errs.get(worst, float('inf')):.1e} ({worst}), {len(ours)} saved")

    merged = os.path.join(d, "merged.onnx")
    sh([sdc, "merge", onnx_path, "--weights", weights, "-o", merged])
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    with torch.no_grad():
        want_logits = model.eval()(input_ids=torch.tensor(ids)).logits.numpy()
    err = rel_err(ort_run(merged, {"input_ids": ids})["logits"], want_logits)
    check(f"{arch}: sdc merge --weights gives a model whose logits in ONNX Runtime are PyTorch's trained model's "
          f"(1e-4)", err <= 1e-4, f"relative err {err:.2e}")
    return plan, data


def refusals(tmp, sdc, sdrun, gpt2_plan, data):
    import export_hf
    llama = os.path.join(tmp, "llama.onnx")
    export_hf.export(export_hf.build("llama", 0), llama, opset=17, batch=BATCH, seq=SEQ)
    plan = os.path.join(tmp, "refused.sdp")
    shapes = ["--shapes", f"input_ids={BATCH}x{SEQ}"]
    cases = [
        ([sdc, "compile", llama, "--peft", "bitfit", *shapes, "-o", plan], ["no bias terms"], [plan]),
        ([sdc, "compile", llama, "--peft", "bitfit", "--target-modules", "q_proj", *shapes, "-o", plan],
         ["--target-modules"], [plan]),
        ([sdc, "compile", llama, "--peft", "bitfit", "--quantize", "nf4", *shapes, "-o", plan], ["--quantize"], [plan]),
        ([sdrun, "train", gpt2_plan, "--data", data, "--steps", "1", "--save-adapter", os.path.join(tmp, "adapter")],
         ["no adapters", "--save-weights"], [os.path.join(tmp, "adapter")]),
    ]
    for cmd, words, files in cases:
        problems, line = clean_error_problems(cmd, words, no_files=files)
        check(f"refused: {line or ' '.join(cmd[1:4])}", not problems, "; ".join(problems))


def main():
    sdc, sdrun = tool_paths()
    import torch
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_bitfit_")
    try:
        made = {}
        for arch in ("gpt2", "qwen2"):
            try:
                made[arch] = arch_checks(arch, tmp, sdc, sdrun)
            except Exception as e:  # one failing model must not hide the other
                check(f"{arch} runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
        if "gpt2" in made:
            refusals(tmp, sdc, sdrun, *made["gpt2"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_bitfit")


if __name__ == "__main__":
    sys.exit(main())
