"""BitFit (sdc compile --peft bitfit: only the bias terms train) against
PyTorch with every parameter but the biases frozen, on transformers' GPT-2
(biases in every layer and LayerNorm) and Qwen2 (biases on q/k/v only,
RMSNorm without one), built from configs with seeded random weights.

  selection  the plan trains exactly the parameters PyTorch names *.bias
  training   sdrun train gives PyTorch's AdamW losses and bias tensors
             step for step (1e-4 relative)
  merging    sdc merge --weights puts the trained biases into the ONNX
             model, and ONNX Runtime on it gives PyTorch's trained logits
  classify   BitFit's own setting: MiniLM's real BERT weights with a
             classification head (--recipe classify), the head trained in
             full beside the biases, step for step as PyTorch
  refusals   a model without biases (Llama), --target-modules, --quantize
             and --save-adapter on a BitFit plan are one-line errors
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import (ROOT, clean_error_problems, loss_gap, losses_of, norm_rel_err, ort_run, peft_steps, rel_err, sh,
                      tool_paths, write_token_rows)
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
    losses = losses_of(metrics)
    loss_err = loss_gap(losses, want)
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


def classify_checks(tmp, sdc, sdrun):
    """BitFit's own setting: a BERT encoder (MiniLM's real weights) with a
    classification head (--recipe classify), the head trained in full beside
    the biases, against PyTorch on test_classify's batches."""
    import torch
    import torch.nn.functional as F
    import sdc as sdc_module
    import test_classify as tc
    from export_minilm import model_dir
    from safetensors.numpy import load_file
    d = os.path.join(tmp, "minilm")
    os.makedirs(d)
    onnx_path, plan, data = (os.path.join(d, n) for n in ("minilm.onnx", "cls.sdp", "train.jsonl"))
    sh([sys.executable, os.path.join(ROOT, "examples", "export_minilm.py"), onnx_path])
    sh([sdc, "compile", onnx_path, "--peft", "bitfit", "--recipe", "classify", "--num-labels", str(tc.LABELS),
        "--shapes", f"input_ids={tc.BATCH}x{tc.SEQ}", "-o", plan])
    with open(data, "w") as f:
        for text, label in tc.DATA:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    tok = sh([sdrun, "tokenize", "--tokenizer", model_dir()], input="\n".join(t for t, _ in tc.DATA) + "\n")
    rows = [(json.loads(l), label) for l, (_, label) in zip(tok.splitlines(), tc.DATA)]

    p = sdc_module.Plan(plan)
    session = sdc_module.Session(p, threads=2)
    start = {g[0]: session.read_global(g[0]) for g in p.globals if g[3] == "trainable"}
    model = tc.Classifier.build(7)
    for name, param in model.named_parameters():  # BertModel's pooler: unused by the sentence embedding, not exported
        param.requires_grad_((name.endswith(".bias") and ".pooler." not in name) or name.startswith("classifier."))
    trained = {n: t for n, t in model.named_parameters() if t.requires_grad}
    check(f"MiniLM classification: the plan trains exactly PyTorch's {len(trained)} biases and the head",
          set(start) == set(trained), f"only the plan's: {sorted(set(start) - set(trained))[:3]}, only "
          f"PyTorch's: {sorted(set(trained) - set(start))[:3]}")
    if set(start) != set(trained):
        return
    with torch.no_grad():
        for n, t in trained.items():
            t.copy_(torch.tensor(start[n]))
    tc.STEPS = STEPS
    opt = torch.optim.AdamW(list(trained.values()), lr=LR, eps=1e-8, weight_decay=0.0)
    want = []
    for ids, mask, labels in tc.batches(rows):  # eval mode: the plan has no dropout
        loss = F.cross_entropy(model(torch.tensor(ids), torch.tensor(mask)), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    weights, metrics = os.path.join(d, "trained.safetensors"), os.path.join(d, "metrics.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--tokenizer", model_dir(), "--steps", str(STEPS), "--no-shuffle",
        "--lr", str(LR), "--lr-schedule", "constant", "--threads", "2", "--metrics", metrics, "--save-weights",
        weights], timeout=600)
    losses = losses_of(metrics)
    loss_err = loss_gap(losses, want)
    ours = load_file(weights)
    # A key projection's bias has an exact gradient of zero (softmax ignores
    # a shift of every key's score): it holds rounding noise that AdamW moves
    # by up to lr a step, differently in every summation order. It must stay
    # within that reach, and is left out of the relative comparison.
    keys = [k for k in trained if k.endswith("attention.self.key.bias")]
    key_moves = [float(np.abs(ours[k] - trained[k].detach().numpy()).max()) for k in keys if k in ours]
    errs = {k: norm_rel_err(ours[k], t.detach().numpy()) for k, t in trained.items() if k in ours and k not in keys}
    worst = max(errs, key=errs.get) if errs else "none"
    check(f"MiniLM classification: {STEPS} AdamW steps give PyTorch's losses and all {len(errs)} other tensors "
          f"(1e-4); the {len(keys)} key biases within AdamW's reach of PyTorch's ({STEPS} x lr)",
          set(ours) == set(trained) and loss_err <= 1e-4 and errs.get(worst, 1) <= 1e-4 and
          len(key_moves) == len(keys) and max(key_moves, default=0) <= STEPS * LR,
          f"losses {losses[:2]} vs PyTorch {want[:2]}, worst loss err {loss_err:.1e}, worst tensor err "
          f"{errs.get(worst, float('inf')):.1e} ({worst}), key biases apart by {max(key_moves, default=0):.1e}")


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
        try:
            classify_checks(tmp, sdc, sdrun)
        except Exception as e:
            check("MiniLM classification runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
        if "gpt2" in made:
            refusals(tmp, sdc, sdrun, *made["gpt2"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_bitfit")


if __name__ == "__main__":
    sys.exit(main())
