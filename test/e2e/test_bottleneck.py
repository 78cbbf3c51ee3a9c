"""Bottleneck adapters (sdc compile --peft bottleneck) against AdapterHub's
own `adapters` library, on transformers' GPT-2 and a tiny Llama built from
configs with seeded random weights, and on MiniLM's real BERT weights. AdapterHub pins transformers 4.57, so its
side runs in .venv-optimum (adapterhub_reference.py), handed the exported
model's weights and the plan's starting adapter.

  training  sdrun train gives AdapterHub's AdamW losses and adapter tensors
            step for step (1e-4 relative) for its three bottleneck
            configurations: seq_bn (Pfeiffer: after each feed-forward block,
            on the residual sum), double_seq_bn (Houlsby: after the attention
            and the feed-forward blocks, on their outputs, swish) and par_bn
            (parallel: on each feed-forward block's input stream, scaling 4),
            and with another reduction factor and activation, a layer left
            out (leave_out), a trained scaling (learned: one factor;
            channel: one per feature) and AdapterHub's gate (use_gating,
            with bert and houlsby starts); in bf16 (--precision bf16):
            losses within 1e-2 of AdapterHub's under PyTorch's CPU autocast,
            the adapters' updates within 0.15 and logits within 1e-2 of its
            f32 run's (PyTorch's own autocast run is further from that: AdamW
            makes whole steps of rounded near-zero gradients)
  names     the plan's adapter tensors are AdapterHub's parameters, name
            for name and shape for shape
  logits    the trained plan's infer entry gives AdapterHub's logits
  sdc->hub  sdrun train --save-adapter writes AdapterHub's layout
            (adapter_config.json, adapter.safetensors), which its
            load_adapter loads, giving sdrun's logits
  hub->sdc  an adapter AdapterHub saved (under another name, "hub") runs in
            sdrun infer --adapter with AdapterHub's logits; one of another
            configuration is a one-line error naming what differs
  post-LN   MiniLM (BERT weights, post-LN blocks) classifying with a head
            (--recipe classify), seq_bn and double_seq_bn: AdapterHub's
            losses, tensors and logits, its load_adapter on the saved folder
  refusals  flags without --peft bottleneck, bad values, --target-modules,
            a --leave-out that names no layer or every layer are one-line
            errors
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import (ROOT, clean_error_problems, loss_gap, losses_of, norm_rel_err, rel_err, sdrun_logits, sh,
                      tool_paths, write_token_rows)
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
BATCH, SEQ, STEPS, LR = 2, 16, 8, 1e-3
REFERENCE_PYTHON = os.path.join(ROOT, ".venv-optimum", "bin", "python")
# (arch, config, extra sdc flags, AdapterHub's fields for them)
CASES = [
    ("llama", "seq_bn", [], {}),
    ("llama", "double_seq_bn", [], {}),
    ("llama", "par_bn", [], {}),
    ("gpt2", "seq_bn", ["--reduction-factor", "4", "--non-linearity", "gelu_new"],
     {"--reduction-factor": "4", "--non-linearity": "gelu_new"}),
    ("llama", "seq_bn", ["--leave-out", "0"], {"--leave-out": "0"}),
    ("llama", "double_seq_bn", ["--precision", "bf16"], {"--autocast": "bf16"}),
    ("gpt2", "double_seq_bn", ["--reduction-factor", "8"], {"--reduction-factor": "8"}),
    # AdapterHub's trained scaling (one factor, or one per feature) and its gate.
    ("llama", "seq_bn", ["--adapter-scaling", "learned", "--use-gating"], {"--scaling": "learned", "--use-gating": "1"}),
    ("gpt2", "double_seq_bn", ["--adapter-scaling", "channel"], {"--scaling": "channel"}),
    ("llama", "par_bn", ["--use-gating", "--bottleneck-init", "houlsby"], {"--use-gating": "1", "--init": "houlsby"}),
]


def plan_adapter(plan):
    """The plan's trainable tensors as the session starts them."""
    import sdc
    p = sdc.Plan(plan)
    session = sdc.Session(p, threads=2)
    return {g[0]: session.read_global(g[0]) for g in p.globals if g[3] == "trainable"}


def trained_logits(plan, weights, ids):
    import sdc
    from safetensors.numpy import load_file
    session = sdc.Session(sdc.Plan(plan), threads=2)
    for name, value in load_file(weights).items():
        session.write_global(name, value)
    return next(iter(session.run("infer", {"input_ids": ids}).values()))


def case_checks(arch, config, flags, fields, model_dir, sdc, sdrun):
    from safetensors.numpy import load_file, save_file
    name = f"{arch} {config}" + (" " + " ".join(flags) if flags else "")
    d = tempfile.mkdtemp(dir=model_dir)
    onnx_path, data = os.path.join(model_dir, "model.onnx"), os.path.join(model_dir, "train.jsonl")
    plan = os.path.join(d, "plan.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "bottleneck", "--bottleneck-config", config, *flags, "--shapes",
        f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    start = plan_adapter(plan)
    save_file(start, os.path.join(d, "start.safetensors"))
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    np.save(os.path.join(d, "ids.npy"), ids)
    ref = os.path.join(d, "adapterhub")
    cmd = [REFERENCE_PYTHON, os.path.join(ROOT, "test", "e2e", "adapterhub_reference.py"), "--arch", arch, "--base",
           os.path.join(model_dir, "base.safetensors"), "--config", config, "--start",
           os.path.join(d, "start.safetensors"), "--rows", data, "--steps", str(STEPS), "--batch", str(BATCH), "--lr",
           str(LR), "--ids", os.path.join(d, "ids.npy"), "--out", ref, "--save", os.path.join(d, "hub_saved")]
    for flag, value in fields.items():
        cmd += [flag, value]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    bf16 = "--precision" in flags
    if bf16 and run.returncode == 0:  # AdapterHub's f32 run too: its tensors are what bf16 training approximates
        autocast = cmd.index("--autocast")
        run = subprocess.run(cmd[:autocast] + cmd[autocast + 2:] + ["--out", ref + "_f32"], capture_output=True,
                             text=True, timeout=600)
    named = run.returncode == 0
    check(f"{name}: the plan's {len(start)} adapter tensors are AdapterHub's parameters, name for name and shape "
          f"for shape", named, (run.stderr.strip().splitlines() or ["?"])[-1] if not named else f"{len(start)} tensors")
    if not named:
        return None
    weights, metrics = os.path.join(d, "trained.safetensors"), os.path.join(d, "metrics.jsonl")
    saved = os.path.join(d, "saved")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--metrics", metrics, "--save-weights", weights,
        "--save-adapter", saved])
    losses = losses_of(metrics)
    want = json.load(open(ref + ".json"))["losses"]
    loss_err = loss_gap(losses, want)
    ours, theirs = load_file(weights), load_file(ref + ("_f32" if bf16 else "") + ".safetensors")
    # bf16 carries 8 significant bits: its adapters are compared by their
    # updates, with AdapterHub's f32 run's. (AdamW turns the rounding of
    # near-zero gradients into whole steps: PyTorch's own autocast run ends
    # further from its f32 run than sdc's bf16 plan does.)
    tol, tensor_tol, what = (1e-2, 0.15, "updates (of its f32 run)") if bf16 else (1e-4, 1e-4, "tensors")
    errs = {k: norm_rel_err(ours[k] - start[k], v - start[k]) if bf16 else norm_rel_err(ours[k], v)
            for k, v in theirs.items() if k in ours}
    worst = max(errs, key=errs.get) if errs else "none"
    moved = min(float(np.abs(ours[k] - start[k]).max()) for k in start)
    check(f"{name}: {STEPS} AdamW steps give AdapterHub's losses ({tol:g}) and all {len(theirs)} adapter {what} "
          f"({tensor_tol:g}), each one moved",
          set(ours) == set(theirs) and loss_err <= tol and errs.get(worst, 1) <= tensor_tol and moved > 0,
          f"losses {losses[:2]} vs AdapterHub {want[:2]}, worst loss err {loss_err:.1e}, worst tensor err "
          f"{errs.get(worst, float('inf')):.1e} ({worst}), least move {moved:.1e}")
    hub_logits = np.load(ref + ("_f32" if bf16 else "") + ".logits.npy")
    ours_logits = trained_logits(plan, weights, ids)
    err = rel_err(ours_logits, hub_logits)
    check(f"{name}: the trained plan's logits are AdapterHub's trained model's{' (f32 run)' if bf16 else ''} ({tol:g})",
          err <= tol,
          f"relative err {err:.2e}")

    # sdc -> AdapterHub: the saved folder loads with load_adapter.
    files = sorted(os.listdir(saved))
    keys = set(load_file(os.path.join(saved, "adapter.safetensors"))) if "adapter.safetensors" in files else set()
    loaded = os.path.join(d, "loaded")
    run = subprocess.run([REFERENCE_PYTHON, os.path.join(ROOT, "test", "e2e", "adapterhub_reference.py"), "--arch",
                          arch, "--base", os.path.join(model_dir, "base.safetensors"), "--load", saved, "--ids",
                          os.path.join(d, "ids.npy"), "--out", loaded], capture_output=True, text=True, timeout=600)
    err = rel_err(ours_logits, np.load(loaded + ".logits.npy")) if run.returncode == 0 else float("inf")
    check(f"{name} sdc->AdapterHub: --save-adapter writes adapter_config.json and adapter.safetensors with "
          f"AdapterHub's keys; its load_adapter gives sdrun's logits ({tol:g})",
          files == ["adapter.safetensors", "adapter_config.json"] and keys == set(theirs) and err <= tol,
          f"files {files}, {len(keys)} keys (AdapterHub's {len(theirs)}), relative err {err:.2e}"
          + (f"; {run.stderr.strip().splitlines()[-1]}" if run.returncode else ""))

    # AdapterHub -> sdc: its own saved adapter, named "hub".
    hub = os.path.join(d, "hub_saved")
    err = rel_err(sdrun_logits(sdrun, plan, hub, ids, d, "hub"), hub_logits)
    check(f"{name} AdapterHub->sdc: the adapter AdapterHub saved (named 'hub') gives AdapterHub's logits in sdrun "
          f"infer --adapter ({tol:g})", err <= tol, f"relative err {err:.2e}")
    return plan, hub


def refusals(model_dir, sdc):
    onnx_path = os.path.join(model_dir, "model.onnx")
    plan = os.path.join(model_dir, "refused.sdp")
    base = [sdc, "compile", onnx_path, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan]
    cases = [
        (base + ["--peft", "lora", "--target-modules", "q_proj", "--bottleneck-config", "seq_bn"],
         ["--peft bottleneck"]),
        (base + ["--peft", "none", "--reduction-factor", "8"], ["--peft bottleneck"]),
        (base + ["--peft", "bottleneck", "--bottleneck-config", "houlsby"], ["--bottleneck-config", "seq_bn"]),
        (base + ["--peft", "bottleneck", "--reduction-factor", "0"], ["--reduction-factor", "positive"]),
        (base + ["--peft", "bottleneck", "--adapter-scaling", "trained"], ["--adapter-scaling", "learned or channel"]),
        (base + ["--peft", "none", "--use-gating"], ["--use-gating", "--peft bottleneck"]),
        (base + ["--peft", "bottleneck", "--non-linearity", "softmax"], ["--non-linearity", "relu"]),
        (base + ["--peft", "bottleneck", "--bottleneck-init", "zeros"], ["--bottleneck-init", "bert"]),
        (base + ["--peft", "bottleneck", "--target-modules", "down_proj"], ["--target-modules", "--leave-out"]),
        (base + ["--peft", "bottleneck", "--leave-out", "7"], ["--leave-out '7'", "layer 7"]),
        (base + ["--peft", "bottleneck", "--leave-out", "0,1"], ["every layer"]),
        (base + ["--peft", "bottleneck", "--leave-out", "one"], ["--leave-out", "layer numbers"]),
        (base + ["--peft", "bottleneck", "--quantize", "nf4"], ["--peft bottleneck", "--quantize"]),
    ]
    for cmd, words in cases:
        problems, _ = clean_error_problems(cmd, words, no_files=[plan])
        check(f"refused: {' '.join(cmd[5:])}", not problems, "; ".join(problems))


def adapter_refusals(made, sdrun, tmp):
    """Adapters that do not fit a plan: one line naming the field."""
    ids = os.path.join(tmp, "ids.npy")
    np.save(ids, np.zeros((BATCH, SEQ), np.int64))
    (seq_plan, _), (_, par_adapter) = made[("llama", "seq_bn")], made[("llama", "par_bn")]
    cases = [(seq_plan, par_adapter, ["adapter_config.json", "par_bn", "seq_bn", "--bottleneck-config"])]
    leave_plan, _ = made[("llama", "seq_bn --leave-out 0")]
    seq_adapter = made[("llama", "seq_bn")][1]
    cases.append((leave_plan, seq_adapter, ["leave_out []", "the plan's [0]"]))
    for field, words in (("use_gating", ["use_gating true, the plan's false", "--use-gating"]),
                         ("ln_after", ["'ln_after' is set"])):
        bad = os.path.join(tmp, f"adapter_with_{field}")
        shutil.copytree(seq_adapter, bad)
        cfg = json.load(open(os.path.join(bad, "adapter_config.json")))
        cfg["config"][field] = True
        json.dump(cfg, open(os.path.join(bad, "adapter_config.json"), "w"))
        cases.append((seq_plan, bad, words))
    for plan, adapter, words in cases:
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", adapter, "--input",
                                               f"input_ids={ids}", "--output-dir", os.path.join(tmp, "refused_out")],
                                              words, no_files=[os.path.join(tmp, "refused_out")])
        check(f"refused: {os.path.basename(adapter)} on a plan it does not fit: {line}", not problems,
              "; ".join(problems))


def classify_checks(config, tmp, sdc, sdrun):
    """A post-LN encoder: MiniLM (real BERT weights) with test_classify's
    head, --recipe classify; AdapterHub puts the adapters in its BertOutput
    modules and hands them the block's LayerNorm."""
    from safetensors.numpy import load_file, save_file
    import test_classify as tc
    from export_minilm import model_dir
    d = os.path.join(tmp, "minilm_" + config)
    os.makedirs(d)
    onnx_path, plan, data = (os.path.join(d, n) for n in ("minilm.onnx", "cls.sdp", "train.jsonl"))
    sh([sys.executable, os.path.join(ROOT, "examples", "export_minilm.py"), onnx_path])
    sh([sdc, "compile", onnx_path, "--peft", "bottleneck", "--bottleneck-config", config, "--recipe", "classify",
        "--num-labels", str(tc.LABELS), "--shapes", f"input_ids={tc.BATCH}x{tc.SEQ}", "--infer-shapes",
        f"input_ids={tc.BATCH}x{tc.SEQ}", "-o", plan])
    with open(data, "w") as f:
        for text, label in tc.DATA:
            f.write(json.dumps({"text": text, "label": label}) + "\n")
    tok = sh([sdrun, "tokenize", "--tokenizer", model_dir()], input="\n".join(t for t, _ in tc.DATA) + "\n")
    rows = [[json.loads(l), label] for l, (_, label) in zip(tok.splitlines(), tc.DATA)]
    json.dump(rows, open(os.path.join(d, "rows.json"), "w"))
    start = plan_adapter(plan)
    save_file(start, os.path.join(d, "start.safetensors"))
    ids, mask, _ = (np.concatenate(a) for a in zip(*tc.batches([tuple(r) for r in rows])[:1]))
    np.save(os.path.join(d, "cls_ids.npy"), ids)
    np.save(os.path.join(d, "cls_mask.npy"), mask)
    ref = os.path.join(d, "adapterhub")
    reference = [REFERENCE_PYTHON, os.path.join(ROOT, "test", "e2e", "adapterhub_reference.py"), "--classify",
                 "--ids", os.path.join(d, "cls_ids.npy")]
    run = subprocess.run(reference + ["--config", config, "--start", os.path.join(d, "start.safetensors"), "--rows",
                                      os.path.join(d, "rows.json"), "--steps", str(STEPS), "--lr", str(LR), "--out",
                                      ref], capture_output=True, text=True, timeout=900)
    name = f"MiniLM {config} classification"
    check(f"{name}: the plan's {len(start)} tensors are AdapterHub's adapter parameters (in BertOutput) and the head",
          run.returncode == 0, (run.stderr.strip().splitlines() or ["?"])[-1] if run.returncode else f"{len(start)}")
    if run.returncode:
        return
    weights, metrics, saved = (os.path.join(d, n) for n in ("trained.safetensors", "metrics.jsonl", "saved"))
    sh([sdrun, "train", plan, "--data", data, "--tokenizer", model_dir(), "--steps", str(STEPS), "--no-shuffle",
        "--lr", str(LR), "--lr-schedule", "constant", "--threads", "2", "--metrics", metrics, "--save-weights",
        weights, "--save-adapter", saved], timeout=600)
    losses = losses_of(metrics)
    want = json.load(open(ref + ".json"))["losses"]
    loss_err = loss_gap(losses, want)
    ours, theirs = load_file(weights), load_file(ref + ".safetensors")
    errs = {k: norm_rel_err(ours[k], v) for k, v in theirs.items() if k in ours}
    worst = max(errs, key=errs.get) if errs else "none"
    # The adapters' biases start at zero, so they hold only their 8 AdamW
    # updates, and AdamW moves an element of near-zero gradient by float
    # noise (six real BERT layers: 1.8e-4 of seq_bn's down bias norm here).
    check(f"{name}: {STEPS} AdamW steps give AdapterHub's losses (1e-4) and all {len(theirs)} tensors, head included "
          f"(1e-3)", set(ours) == set(theirs) and loss_err <= 1e-4 and errs.get(worst, 1) <= 1e-3,
          f"losses {losses[:2]} vs AdapterHub {want[:2]}, worst loss err {loss_err:.1e}, worst tensor err "
          f"{errs.get(worst, float('inf')):.1e} ({worst})")
    got = tc.sdrun_class_logits(sdrun, plan, saved, ids, mask, d, "ours")
    loaded = os.path.join(d, "loaded")
    run = subprocess.run(reference + ["--load", saved, "--out", loaded], capture_output=True, text=True, timeout=600)
    err = rel_err(got, np.load(loaded + ".logits.npy")) if run.returncode == 0 else float("inf")
    trained_err = rel_err(got, np.load(ref + ".logits.npy"))
    check(f"{name}: the saved adapter (the head beside it) gives AdapterHub's trained logits in sdrun infer "
          f"--adapter, and loaded with AdapterHub's load_adapter (1e-4)", err <= 1e-4 and trained_err <= 1e-4,
          f"relative err {err:.2e} loaded, {trained_err:.2e} against AdapterHub's training"
          + (f"; {run.stderr.strip().splitlines()[-1]}" if run.returncode else ""))


def main():
    sdc, sdrun = tool_paths()
    import torch
    import export_hf
    from safetensors.torch import save_file
    torch.set_num_threads(2)
    if not os.path.exists(REFERENCE_PYTHON):
        check("AdapterHub's environment (.venv-optimum, scripts/install-deps.sh) is there", False, REFERENCE_PYTHON)
        return report("test_bottleneck")
    tmp = tempfile.mkdtemp(prefix="sd_bottleneck_")
    made = {}  # (arch, config and flags) -> (plan, AdapterHub's saved adapter)
    try:
        for arch in ("llama", "gpt2"):
            model_dir = os.path.join(tmp, arch)
            os.makedirs(model_dir)
            model = export_hf.build(arch, 0)
            save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                      os.path.join(model_dir, "base.safetensors"))
            export_hf.export(model, os.path.join(model_dir, "model.onnx"), opset=17, batch=BATCH, seq=SEQ)
            write_token_rows(os.path.join(model_dir, "train.jsonl"), np.random.default_rng(3), 256, 2 * STEPS, SEQ)
            for case_arch, config, flags, fields in CASES:
                if case_arch != arch:
                    continue
                try:
                    made[(arch, " ".join([config] + flags))] = case_checks(arch, config, flags, fields, model_dir, sdc,
                                                                           sdrun)
                except Exception as e:  # one failing case must not hide the others
                    check(f"{arch} {config} runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
            if arch == "llama":
                refusals(model_dir, sdc)
        if all(made.get(k) for k in [("llama", "seq_bn"), ("llama", "par_bn"), ("llama", "seq_bn --leave-out 0")]):
            adapter_refusals(made, sdrun, tmp)
        else:
            check("the adapter refusals have their plans", False, "a case above failed")
        for config in ("seq_bn", "double_seq_bn"):
            try:
                classify_checks(config, tmp, sdc, sdrun)
            except Exception as e:
                check(f"MiniLM {config} classification runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_bottleneck")


if __name__ == "__main__":
    sys.exit(main())
