#!/usr/bin/env python3
"""AdaLoRA (sdc compile --peft adalora) against the real Hugging Face PEFT
(AdaLoraConfig, AdaLoraModel.update_and_allocate after each optimizer step,
global_step counted from 0) on a tiny Llama built from a config with seeded
random weights. The schedule is short so every phase is met: the warm-up
(tinit), masking steps every deltaT with a cubic budget, the final mask at
total_step - tfinal, and the fixed pattern after it.

  training   sdrun train from PEFT's start gives PEFT's losses (the
             orthogonality penalty included) and lora_A, lora_E, lora_B
             step for step, and the same triplets end pruned (E = 0), as many
             as the target budget leaves
  sdc->PEFT  the saved adapter loads in PeftModel.from_pretrained with no
             warnings and gives sdrun infer --adapter's logits
  PEFT->sdc  PEFT's own saved adapter (each module cut to its kept
             triplets, rank_pattern) loads in sdrun and merges
  merging    sdc merge equals merge_and_unload()
  resume     a run checkpointed in the pruning phase and resumed gives the
             straight run's losses and adapter (the sensitivity EMAs and the
             pattern are checkpointed)
  refusals   no --total-step, --target-r above --lora-r, --tinit past the
             schedule, tensors that do not fit their rank_pattern: one line,
             no file
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import ROOT, clean_error_problems, ort_run, rel_err, sdrun_logits, sh, tool_paths, write_token_rows
from test_peft_roundtrip import peft_warnings
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, LR = 2, 16, 5e-3
TARGETS = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn", "c_proj"]}  # GPT-2: Conv1D weights, fan_in_fan_out
INIT_R, TARGET_R, ALPHA = 6, 3, 8
TOTAL, TINIT, TFINAL, DELTA_T = 12, 2, 3, 2
STEPS = TOTAL


def adalora_config(arch):
    from peft import AdaLoraConfig
    return AdaLoraConfig(init_r=INIT_R, target_r=TARGET_R, lora_alpha=ALPHA, target_modules=TARGETS[arch],
                         total_step=TOTAL, tinit=TINIT, tfinal=TFINAL, deltaT=DELTA_T, task_type="CAUSAL_LM",
                         fan_in_fan_out=arch == "gpt2")


def compile_flags(arch):
    return ["--peft", "adalora", "--target-modules", ",".join(TARGETS[arch]), "--lora-r", str(INIT_R), "--target-r",
            str(TARGET_R), "--lora-alpha", str(ALPHA), "--total-step", str(TOTAL), "--tinit", str(TINIT), "--tfinal",
            str(TFINAL), "--delta-t", str(DELTA_T)]


def peft_adalora_steps(pm, rows, steps):
    """PEFT's AdaLoRA loop: the model's own loss (cross-entropy plus the
    orthogonality penalty), AdamW (no weight decay), then
    update_and_allocate(global_step) before zero_grad."""
    import torch
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=LR, eps=1e-8, weight_decay=0.0)
    losses = []
    for step in range(steps):
        ids = torch.tensor([rows[(step * BATCH + i) % len(rows)] for i in range(BATCH)])
        loss = pm(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        pm.base_model.update_and_allocate(step)
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def adapter_tensors(pm):
    """lora_A, lora_E and lora_B as named in an adapter file (PEFT's state
    dict would cut them to the rank pattern)."""
    return {"base_model.model." + n[len("base_model.model."):].replace(".default", ""): p.detach().numpy()
            for n, p in pm.named_parameters() if ".lora_" in n}


def train(sdrun, plan, data, init, d, tag, extra=(), steps=STEPS):
    metrics, trained = os.path.join(d, tag + ".jsonl"), os.path.join(d, tag)
    sh([sdrun, "train", plan, "--data", data, "--steps", str(steps), "--no-shuffle", "--lr", str(LR), "--lr-schedule",
        "constant", "--weight-decay", "0", "--threads", "2", "--adapter", init, "--metrics", metrics,
        "--save-adapter", trained, *extra])
    return [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l], trained


def arch_checks(arch, tmp, sdc, sdrun):
    import torch
    from peft import PeftModel, get_peft_model
    from safetensors.numpy import load_file
    import export_hf
    onnx_path, data, plan = (os.path.join(tmp, n) for n in ("model.onnx", "train.jsonl", "plan.sdp"))
    export_hf.export(export_hf.build(arch, 0), onnx_path, opset=17, batch=BATCH, seq=SEQ)
    write_token_rows(data, np.random.default_rng(3), 256, 2 * STEPS, SEQ)
    rows = [json.loads(l)["input_ids"] for l in open(data)]
    sh([sdc, "compile", onnx_path, *compile_flags(arch), "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes",
        f"input_ids={BATCH}x{SEQ}", "-o", plan])

    # Training from PEFT's start (A, B ~ N(0, 0.02), E = 0), against PEFT's loop.
    torch.manual_seed(11)
    pm = get_peft_model(export_hf.build(arch, 0), adalora_config(arch))
    init = os.path.join(tmp, "init")
    pm.save_pretrained(init)
    want = peft_adalora_steps(pm, rows, STEPS)
    losses, trained = train(sdrun, plan, data, init, tmp, "trained")
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
    theirs, ours = adapter_tensors(pm), load_file(os.path.join(trained, "adapter_model.safetensors"))
    errs = {k: rel_err(ours[k], v) for k, v in theirs.items() if k in ours}
    worst = max(errs, key=errs.get) if errs else "none"
    check(f"{arch} training: {STEPS} steps over every phase give PEFT's losses (orthogonality penalty included) and "
          f"all {len(theirs)} adapter tensors (1e-4)",
          set(ours) == set(theirs) and loss_err <= 1e-4 and errs.get(worst, 1) <= 1e-4,
          f"losses {[round(l, 5) for l in losses[:3]]} vs PEFT {[round(l, 5) for l in want[:3]]}, worst loss err "
          f"{loss_err:.1e}, worst tensor err {errs.get(worst, float('inf')):.1e} ({worst})")
    pattern = pm.peft_config["default"].rank_pattern
    kept_theirs = {k.replace(".default", "").replace("lora_E", "").rstrip("."): v for k, v in pattern.items()}
    kept_ours = {k[len("base_model.model."):-len(".lora_E")]: (ours[k].reshape(-1) != 0).tolist()
                 for k in ours if k.endswith(".lora_E")}
    kept = sum(sum(v) for v in kept_ours.values())
    same = {k: kept_theirs.get(k) == v for k, v in kept_ours.items()}
    check(f"{arch} pruning: the triplets sdrun keeps are PEFT's rank_pattern, {TARGET_R * len(kept_ours)} of "
          f"{INIT_R * len(kept_ours)} (the target budget)",
          len(kept_ours) == len(kept_theirs) and all(same.values()) and kept == TARGET_R * len(kept_ours),
          f"kept {kept}; per module {[sum(v) for v in kept_ours.values()]}; matching PEFT: {same}")

    # sdc -> PEFT and merging.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), trained).eval()
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    with torch.no_grad():
        want_logits = loaded(torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plan, trained, ids, tmp, "ours"), want_logits)
    check(f"{arch} sdc->PEFT: the adapter loads with no warnings and PEFT's logits equal sdrun infer --adapter (1e-4)",
          not peft_warnings(caught) and err <= 1e-4,
          f"relative err {err:.2e}; " + ("; ".join(peft_warnings(caught)) or "no warnings"))
    merged_onnx = os.path.join(tmp, "merged.onnx")
    sh([sdc, "merge", onnx_path, "--adapter", trained, "-o", merged_onnx])
    err = rel_err(ort_run(merged_onnx, {"input_ids": ids})["logits"], want_logits)
    with torch.no_grad():
        merged_logits = loaded.merge_and_unload()(torch.tensor(ids)).logits.numpy()
    check(f"{arch} merging: ONNX Runtime on sdc merge's model gives PEFT's logits, as merge_and_unload's model does "
          f"(1e-4)", err <= 1e-4 and rel_err(merged_logits, want_logits) <= 1e-4, f"relative err {err:.2e}")
    # PEFT's own save after training: each module cut to its kept triplets (rank_pattern).
    peft_saved = os.path.join(tmp, "peft_saved")
    pm.save_pretrained(peft_saved)
    shapes = {k: v.shape for k, v in load_file(os.path.join(peft_saved, "adapter_model.safetensors")).items()}
    cut = sum(1 for k, v in shapes.items() if k.endswith(".lora_E") and v[0] < INIT_R)
    with torch.no_grad():
        want_saved = pm.eval()(torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plan, peft_saved, ids, tmp, "peft_saved"), want_saved)
    merged_saved = os.path.join(tmp, "merged_saved.onnx")
    sh([sdc, "merge", onnx_path, "--adapter", peft_saved, "-o", merged_saved])
    merge_err = rel_err(ort_run(merged_saved, {"input_ids": ids})["logits"], want_saved)
    check(f"{arch} PEFT->sdc: PEFT's saved adapter ({cut} modules cut to their rank_pattern) gives PEFT's logits in "
          f"sdrun infer --adapter and through sdc merge (1e-4)", cut > 0 and err <= 1e-4 and merge_err <= 1e-4,
          f"sdrun relative err {err:.2e}, merged {merge_err:.2e}")
    return plan, init, ours, kept_ours, ids


def main():
    sdc, sdrun = tool_paths()
    import torch
    from safetensors.numpy import load_file
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    tmp = tempfile.mkdtemp(prefix="sd_adalora_")
    try:
        results = {}
        for arch in ("gpt2", "llama"):
            os.makedirs(os.path.join(tmp, arch))
            try:
                results[arch] = arch_checks(arch, os.path.join(tmp, arch), sdc, sdrun)
            except Exception as e:  # one failing model must not hide the other
                check(f"{arch} AdaLoRA runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
        if "llama" not in results:
            return report("test_adalora")
        # Llama from here on.
        plan, init, ours, kept_ours, ids = results["llama"]
        d = os.path.join(tmp, "llama")
        onnx_path, data = os.path.join(d, "model.onnx"), os.path.join(d, "train.jsonl")
        # Checkpointed at step 6 (masking phase), resumed: the straight run's losses and adapter.
        ckpt = os.path.join(tmp, "ckpt")
        first, _ = train(sdrun, plan, data, init, tmp, "first", ["--checkpoint-dir", ckpt, "--checkpoint-every", "6"],
                         steps=6)
        resumed, resumed_dir = train(sdrun, plan, data, init, tmp, "resumed", ["--checkpoint-dir", ckpt, "--resume"])
        losses = [json.loads(l)["loss"] for l in open(os.path.join(d, "trained.jsonl")) if '"loss"' in l]
        again = load_file(os.path.join(resumed_dir, "adapter_model.safetensors"))
        gap = max(float(np.max(np.abs(again[k] - ours[k]))) for k in ours)
        check("resume: checkpointed after 6 steps and resumed, the run ends with the straight run's losses and adapter "
              "bit for bit", first + resumed == losses and gap == 0.0,
              f"{len(first)} + {len(resumed)} losses, adapter max diff {gap:.1e}")

        # Refusals.
        out = os.path.join(tmp, "refused.sdp")
        base = ["--peft", "adalora", "--target-modules", "q_proj", "--shapes", f"input_ids={BATCH}x{SEQ}"]
        trained = os.path.join(d, "trained")
        for what, flags, words in (
                ("no --total-step", [], ["--total-step"]),
                ("--target-r above --lora-r", ["--total-step", "10", "--lora-r", "4", "--target-r", "6"],
                 ["--target-r", "4"]),
                ("--tinit past the schedule", ["--total-step", "10", "--tinit", "8", "--tfinal", "2"], ["--tinit (8)"])):
            problems, line = clean_error_problems([sdc, "compile", onnx_path, *base, *flags, "-o", out], words, [out])
            check(f"refused: {what}", not problems, "; ".join(problems) or line)
        # rank_pattern that does not fit the file: a whole file under a pattern that keeps fewer triplets.
        cut = os.path.join(tmp, "cut")
        shutil.copytree(trained, cut)
        cfg = json.load(open(os.path.join(cut, "adapter_config.json")))
        cfg["rank_pattern"] = {k + ".lora_E": v for k, v in kept_ours.items()}
        json.dump(cfg, open(os.path.join(cut, "adapter_config.json"), "w"))
        out_dir = os.path.join(tmp, "cut_out")
        ids_file = os.path.join(tmp, "ids.npy")
        np.save(ids_file, ids)
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", cut, "--input",
                                               f"input_ids={ids_file}", "--output-dir", out_dir],
                                              ["rank_pattern", "keeps"], [out_dir])
        check("refused: an adapter whose tensors do not fit its rank_pattern", not problems, "; ".join(problems) or line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_adalora")


if __name__ == "__main__":
    sys.exit(main())
