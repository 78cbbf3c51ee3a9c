#!/usr/bin/env python3
"""LoRA started from the base weight, against the real Hugging Face PEFT:
sdc compile --lora-init pissa (PEFT's init_lora_weights="pissa", on GPT-2's
Conv1D weights and a tiny Llama), olora and loftq (Llama: PEFT's olora and
loftq read nn.Linear's [out, in] weight). Each rewrites the frozen weight
the adapter starts from. For each:

  start      the plan's own lora_A and lora_B equal PEFT's start (PiSSA and
             LoftQ up to the sign of each singular pair, which no SVD fixes;
             OLoRA's Householder QR exactly), and sdrun infer of the plan as
             compiled gives the logits of PEFT's model as get_peft_model
             leaves it (rewritten base weight plus adapter)
  training,  test_peft_methods' method_checks: sdrun train from PEFT's saved
  loading,   start gives PEFT's AdamW losses and adapter tensors step for
  merging    step; the saved adapter (init_lora_weights kept) loads in PEFT,
             which redoes the start on the original model, with PEFT's
             logits; sdc merge rebuilds the rewritten base the same way and
             equals merge_and_unload()

LoftQ with --loftq-iter 2: the start is PEFT's loftq_iter=2 start. LoftQ
with --quantize nf4 on every linear layer (QLoRA's use of it): the plan's
NF4 codes are those of LoftQ's dequantized weight, so training equals
PEFT's LoftQ model step for step. Refusals: olora on a Conv1D, r above min(out, in), an adapter
of another start on the plan, --loftq-iter without loftq.

PEFT's loftq_init runs its quantization on "cuda" or "xpu" only; the test
runs PEFT's own function with that one device name replaced by "cpu".
"""
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import ROOT, clean_error_problems, peft_steps, rel_err, sdrun_logits, sh, tool_paths, write_token_rows
from test_peft_methods import ALPHA, BATCH, LORA_TARGETS, LR, R, SEQ, STEPS, compile_flags, method_checks, peft_config
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))

# Reads the plan's own start: the adapter a fresh session saves.
SAVE_START = """
import sys, sdc
sdc.Session(sdc.Plan(sys.argv[1])).save_adapter(sys.argv[2])
"""


def loftq_on_cpu():
    """PEFT's loftq_init with its compute device "cpu" (bitsandbytes
    quantizes on the CPU too); nothing else of it changed."""
    import peft.tuners.lora.layer as layer
    import peft.utils.loftq_utils as loftq_utils
    src = inspect.getsource(loftq_utils.loftq_init)
    device = 'compute_device = "xpu" if is_xpu_available() else "cuda"'
    if device not in src:
        raise RuntimeError("PEFT's loftq_init no longer picks its device as this test expects")
    namespace = dict(vars(loftq_utils))
    exec(src.replace(device, 'compute_device = "cpu"'), namespace)
    loftq_utils.loftq_init = layer.loftq_init = namespace["loftq_init"]


def aligned_gap(method, ours, theirs):
    """Worst relative error of lora_A and lora_B over the adapted modules,
    each rank-one pair (row k of A, column k of B) turned to PEFT's sign
    first for an SVD start."""
    worst = 0.0
    for key in theirs:
        if not key.endswith("lora_A.weight"):
            continue
        b_key = key.replace("lora_A", "lora_B")
        a, b = ours[key].copy(), ours[b_key].copy()
        if method != "olora":
            signs = np.sign(np.sum(a * theirs[key], axis=1))
            a *= signs[:, None]
            b *= signs[None, :]
        worst = max(worst, rel_err(a, theirs[key]), rel_err(b, theirs[b_key]))
    return worst


def start_checks(method, arch, model_dir, plan, sdrun, build, rounds=1):
    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from safetensors.numpy import load_file
    import export_hf
    d = os.path.join(model_dir, f"{method}{rounds}_start")
    os.makedirs(d)
    config = peft_config(method, arch)
    if rounds > 1:
        config.loftq_config["loftq_iter"] = rounds
    pm = get_peft_model(export_hf.build(arch, 0), config).eval()
    theirs = {k.replace(".default", ""): v.detach().numpy() for k, v in get_peft_model_state_dict(pm).items()}
    start = os.path.join(d, "start")
    subprocess.run([sys.executable, "-c", SAVE_START, plan, start], check=True,
                   env=dict(os.environ, PYTHONPATH=os.path.join(build, "python")))
    ours = load_file(os.path.join(start, "adapter_model.safetensors"))
    gap = aligned_gap(method, ours, theirs) if set(ours) == set(theirs) else float("inf")
    ids = np.random.default_rng(7).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    with torch.no_grad():
        want = pm(torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plan, None, ids, d, "start"), want)
    how = "exactly" if method == "olora" else "up to each singular pair's sign"
    check(f"{arch} {method}{f' with {rounds} rounds' if rounds > 1 else ''}: the plan's lora_A and lora_B are PEFT's start ({how}, 1e-4) and the plan as compiled "
          f"gives the logits of PEFT's started model (1e-4)", gap <= 1e-4 and err <= 1e-4,
          f"worst factor err {gap:.2e} over {len(theirs)} tensors, logits relative err {err:.2e}")
    return pm


def loftq_quantized(model_dir, sdc, sdrun):
    """--lora-init loftq --quantize nf4: NF4 codes of LoftQ's dequantized
    weight dequantize to it exactly, so the QLoRA plan trains as PEFT's
    LoftQ model (whose base holds that weight in f32) does."""
    import torch
    from peft import get_peft_model
    import export_hf
    d = os.path.join(model_dir, "loftq_nf4")
    os.makedirs(d)
    plan, init, metrics = (os.path.join(d, n) for n in ("plan.sdp", "init", "metrics.jsonl"))
    data = os.path.join(model_dir, "train.jsonl")
    # Every linear layer but the head, as --quantize nf4 quantizes them and transformers' 4-bit loading does.
    sh([sdc, "compile", os.path.join(model_dir, "model.onnx"), "--peft", "lora", "--target-modules", "all-linear",
        "--lora-r", str(R), "--lora-alpha", str(ALPHA), "--lora-init", "loftq", "--quantize", "nf4",
        "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    config = peft_config("loftq", "llama")
    config.target_modules = "all-linear"
    pm = get_peft_model(export_hf.build("llama", 0), config)
    pm.save_pretrained(init)
    rows = [json.loads(l)["input_ids"] for l in open(data)]
    want = peft_steps(pm, rows, STEPS, BATCH, LR)
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
    check(f"llama loftq --quantize nf4: {STEPS} steps on the NF4 plan give the losses of PEFT's LoftQ model (1e-4)",
          err <= 1e-4, f"losses {losses[:2]} vs PEFT {want[:2]}, worst relative err {err:.1e}")


def refusals(model_dirs, trained, sdc, sdrun):
    gpt2, llama = (os.path.join(model_dirs[a], "model.onnx") for a in ("gpt2", "llama"))
    tmp = model_dirs["llama"]
    shapes = ["--shapes", f"input_ids={BATCH}x{SEQ}"]
    out = os.path.join(tmp, "refused.sdp")
    for what, cmd, words in (
            ("olora on GPT-2's Conv1D weights", [sdc, "compile", gpt2, *compile_flags("olora", "gpt2"), *shapes],
             ["olora", "[in, out]", "pissa"]),
            ("pissa with r above min(out, in)", [sdc, "compile", llama, "--peft", "lora", "--target-modules", "q_proj",
                                                 "--lora-r", "100", "--lora-init", "pissa", *shapes], ["r=100", "64"]),
            ("--loftq-iter without loftq", [sdc, "compile", llama, *compile_flags("pissa", "llama"), "--loftq-iter",
                                            "2", *shapes], ["--loftq-iter", "loftq"]),
            ("--lora-init pissa with --use-dora", [sdc, "compile", llama, *compile_flags("pissa", "llama"),
                                                   "--use-dora", *shapes], ["pissa", "--use-dora"])):
        problems, line = clean_error_problems([*cmd, "-o", out], words, [out])
        check(f"sdc compile: {what} is a one-line error", not problems, "; ".join(problems) or line)
    plain = os.path.join(tmp, "plain.sdp")
    sh([sdc, "compile", llama, "--peft", "lora", "--target-modules", ",".join(LORA_TARGETS["llama"]), "--lora-r",
        str(R), "--lora-alpha", str(ALPHA), *shapes, "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plain])
    ids = os.path.join(tmp, "refuse_ids.npy")
    np.save(ids, np.zeros((BATCH, SEQ), np.int64))
    for what, plan, adapter, words in (
            ("a PiSSA adapter on a plain LoRA plan", plain, trained["pissa"], ["pissa", "--lora-init"]),
            ("an OLoRA adapter on the PiSSA plan", trained["pissa_plan"], trained["olora"], ["olora", "pissa"])):
        out_dir = os.path.join(tmp, "refused_out")
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", adapter, "--input",
                                               f"input_ids={ids}", "--output-dir", out_dir], words, [out_dir])
        check(f"sdrun infer: {what} is a one-line error naming both starts", not problems,
              "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    build = os.path.dirname(os.path.dirname(sdrun))
    import torch
    import export_hf
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    loftq_on_cpu()
    tmp = tempfile.mkdtemp(prefix="sd_lora_starts_")
    try:
        model_dirs, trained = {}, {}
        for arch, methods in (("gpt2", ("pissa",)), ("llama", ("pissa", "olora", "loftq"))):
            model_dir = model_dirs[arch] = os.path.join(tmp, arch)
            os.makedirs(model_dir)
            export_hf.export(export_hf.build(arch, 0), os.path.join(model_dir, "model.onnx"), opset=17, batch=BATCH,
                             seq=SEQ)
            write_token_rows(os.path.join(model_dir, "train.jsonl"), np.random.default_rng(3), 256, 2 * STEPS, SEQ)
            for method in methods:
                try:
                    plan, adapter = method_checks(method, arch, model_dir, sdc, sdrun)
                    start_checks(method, arch, model_dir, plan, sdrun, build)
                    if arch == "llama":
                        trained[method], trained[method + "_plan"] = adapter, plan
                except Exception as e:  # one failing method must not hide the others
                    check(f"{arch} {method} runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
        two_rounds = os.path.join(model_dirs["llama"], "loftq2.sdp")
        sh([sdc, "compile", os.path.join(model_dirs["llama"], "model.onnx"), *compile_flags("loftq", "llama"),
            "--loftq-iter", "2", "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}",
            "-o", two_rounds])
        start_checks("loftq", "llama", model_dirs["llama"], two_rounds, sdrun, build, rounds=2)
        loftq_quantized(model_dirs["llama"], sdc, sdrun)
        if "pissa" in trained and "olora" in trained:
            refusals(model_dirs, trained, sdc, sdrun)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_lora_starts")


if __name__ == "__main__":
    sys.exit(main())
