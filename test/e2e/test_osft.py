#!/usr/bin/env python3
"""Orthogonal subspace fine-tuning (sdc compile --peft osft) on a tiny
LlamaForCausalLM built from a config with seeded random weights:

  split       the plan's six factors rebuild each targeted weight to fp32
              precision, and the low factors start orthogonal to the high ones
  subspace    after 50 AdamW steps (weight decay, clipping) U_high^T U_low and
              V_low V_high^T stay <= 1e-5 relative, and the high factors are
              bit for bit unchanged
  PyTorch     a reference OSFT written here (the plan's split, factorized
              forward, gradient projection, AdamW, parameter re-projection)
              trains 10 steps: losses and low factors equal to 1e-4
  strategy    the dense strategy (W rebuilt once per step) trains like the
              factored one
  PEFT        an adapter sdrun saves loads with PEFT's OSF without warnings
              and gives sdrun's logits (1e-4); a PEFT OSF adapter loads in
              sdrun and gives PEFT's logits
  merge       sdc merge of an OSF adapter equals PEFT's merge_and_unload()
  bad input   ratio outside (0, 1), a rank that leaves nothing trainable, OSF
              configs sdc cannot honour, an adapter split from other base
              weights, a LoRA adapter on an OSF plan: one-line errors
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import ROOT, norm_rel_err, ort_run, sdrun_logits, sh, tool_paths, train_peft_model, write_token_rows
from test_training import check, clean_error, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, RATIO, LR, WD, CLIP = 2, 16, 0.5, 1e-3, 0.01, 1.0
TARGETS = ["q_proj", "v_proj", "down_proj"]
SUFFIXES = ("osf_U_high", "osf_S_high", "osf_V_high", "osf_svd_params.U_low", "osf_svd_params.S_low",
            "osf_svd_params.V_low")



def rows(path):
    with open(path) as f:
        return np.array([json.loads(l)["input_ids"] for l in f], dtype=np.int64)


def factors(session, modules):
    return {m: [session.read_global(f"{m}.{s}").astype(np.float64) for s in SUFFIXES] for m in modules}


def osft_modules(plan_path):
    import sdc
    return json.loads(sdc.Plan(plan_path).config)["osf"]["modules"]


def train(plan, data, steps, **kw):
    import sdc
    session = sdc.Session(sdc.Plan(plan), threads=2)
    trainer = sdc.Trainer(session, data, steps=steps, lr=LR, weight_decay=WD, clip_norm=CLIP, shuffle=False, **kw)
    losses = [r.loss for r in trainer]
    return session, trainer, losses


def check_split(plan, base):
    import sdc
    session = sdc.Session(sdc.Plan(plan), threads=2)
    mods = osft_modules(plan)
    worst, ortho = 0.0, 0.0
    for m, (uh, sh_, vh, ul, sl, vl) in factors(session, mods).items():
        w = base.get_submodule(m).weight.detach().double().numpy()
        rebuilt = (uh * sh_) @ vh + (ul * sl) @ vl
        worst = max(worst, norm_rel_err(rebuilt, w))
        ortho = max(ortho, np.abs(uh.T @ ul).max(), np.abs(vl @ vh.T).max())
    check(f"split: U S V rebuilds all {len(mods)} targeted weights to fp32 precision", worst <= 2e-6,
          f"worst relative err {worst:.2e}")
    check("split: the low factors start orthogonal to the high ones", ortho <= 1e-5, f"max |U_h^T U_l|, |V_l V_h^T| {ortho:.1e}")
    return session, mods


def check_subspace(plan, data, mods, before):
    session, _, losses = train(plan, data, 50)
    after = factors(session, mods)
    worst, moved, same = 0.0, 0.0, True
    for m in mods:
        uh, _, vh, ul, _, vl = after[m]
        worst = max(worst, np.linalg.norm(uh.T @ ul) / np.linalg.norm(ul), np.linalg.norm(vl @ vh.T) / np.linalg.norm(vl))
        moved = max(moved, np.abs(ul - before[m][3]).max())
        same = same and all(np.array_equal(after[m][i], before[m][i]) for i in range(3))
    check("subspace: 50 AdamW steps move the low factors", moved > 1e-4, f"max change {moved:.2e}")
    check("subspace: after 50 steps U_high^T U_low and V_low V_high^T stay <= 1e-5 relative", worst <= 1e-5,
          f"worst {worst:.1e}")
    check("subspace: the high factors are bit for bit unchanged after 50 steps", same, "")
    check("subspace: the loss goes down", losses[-1] < losses[0], f"{losses[0]:.4f} -> {losses[-1]:.4f}")


def reference_osft(base, split, data, steps):
    """OSFT in PyTorch from the plan's split: factorized forward, gradients
    projected out of the high subspaces (hooks), AdamW (decay on U and V, not
    S, as sdc), clipping, then U_low and V_low projected back."""
    import torch
    model = base
    model.train()
    lows = {}
    for m, (uh, sh_, vh, ul, sl, vl) in split.items():
        layer = model.get_submodule(m)
        t = lambda a: torch.tensor(a, dtype=torch.float32)
        uh, sh_, vh = t(uh), t(sh_), t(vh)
        p = [torch.nn.Parameter(t(a)) for a in (ul, sl, vl)]
        p[0].register_hook(lambda g, uh=uh: g - uh @ (uh.T @ g))
        p[2].register_hook(lambda g, vh=vh: g - (g @ vh.T) @ vh)
        lows[m] = (uh, vh, p)
        bias = layer.bias

        def forward(x, uh=uh, sh_=sh_, vh=vh, p=p, bias=bias):
            y = ((x @ vh.T) * sh_) @ uh.T + ((x @ p[2].T) * p[1]) @ p[0].T
            return y if bias is None else y + bias
        layer.forward = forward
    for q in model.parameters():
        q.requires_grad_(False)
    decay = [q for _, _, p in lows.values() for q in (p[0], p[2])]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": [p[1] for _, _, p in lows.values()], "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8)
    ids, losses = rows(data), []
    for s in range(steps):
        batch = torch.tensor(ids[s * BATCH:(s + 1) * BATCH])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([q for _, _, p in lows.values() for q in p], CLIP)
        opt.step()
        with torch.no_grad():
            for uh, vh, p in lows.values():
                p[0] -= uh @ (uh.T @ p[0])
                p[2] -= (p[2] @ vh.T) @ vh
        losses.append(float(loss))
    return losses, {m: [q.detach().double().numpy() for q in p] for m, (_, _, p) in lows.items()}


def check_against_torch(plan, data, base, split):
    steps = 10
    session, _, ours = train(plan, data, steps)
    want_losses, want = reference_osft(base, split, data, steps)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(ours, want_losses))
    check(f"PyTorch: {steps} steps give the reference OSFT's losses (1e-4)", loss_err <= 1e-4,
          f"worst relative err {loss_err:.1e}; last loss {ours[-1]:.5f} vs {want_losses[-1]:.5f}")
    got = factors(session, split)
    worst = max(norm_rel_err(got[m][3 + i], want[m][i]) for m in split for i in range(3))
    check(f"PyTorch: after {steps} steps the low factors equal the reference's (1e-4)", worst <= 1e-4,
          f"worst relative err {worst:.1e}")
    return ours


def check_targets(sdc_bin, sdrun, onnx_path, hf_dir, data, ids, tmp):
    """all-linear takes every linear layer but the head; a rank pattern sets
    one module's preserved rank, and PEFT splits that module the same way."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    shapes = ["--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}"]
    dry = sh([sdc_bin, "compile", onnx_path, "--peft", "osft", "--target-modules", "all-linear", "--dry-run"] + shapes)
    listed = [l.split()[0] for l in dry.splitlines() if " k=" in l]
    linear = [n for n, m in AutoModelForCausalLM.from_pretrained(hf_dir).named_modules()
              if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    check("all-linear: every linear layer but the output head is targeted", sorted(listed) == sorted(linear),
          f"{len(listed)} modules listed, {len(linear)} linear layers besides lm_head")
    plan = os.path.join(tmp, "pattern.sdp")
    flags = ["--peft", "osft", "--target-modules", "q_proj,down_proj", "--osft-rank-pattern", r"layers\.1\.mlp=40"]
    dry = sh([sdc_bin, "compile", onnx_path] + flags + shapes + ["--dry-run"])
    ranks = {l.split()[0]: int(l.split("k=")[1].split()[0]) for l in dry.splitlines() if " k=" in l}
    want = {"model.layers.0.self_attn.q_proj": 32, "model.layers.1.self_attn.q_proj": 32,
            "model.layers.0.mlp.down_proj": 32, "model.layers.1.mlp.down_proj": 40}
    check("rank pattern: the matching module keeps k=40, the others the ratio's k=32", ranks == want, str(ranks))
    sh([sdc_bin, "compile", onnx_path] + flags + shapes + ["-o", plan])
    adapter = os.path.join(tmp, "pattern_adapter")
    sh([sdrun, "train", plan, "--data", data, "--steps", "2", "--lr", "1e-2", "--save-adapter", adapter])
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_dir).eval(), adapter).eval()
    with torch.no_grad():
        want_logits = pm(torch.tensor(ids)).logits.numpy()
    err = norm_rel_err(sdrun_logits(sdrun, plan, adapter, ids, tmp, "pattern"), want_logits)
    check("rank pattern: PEFT loads the adapter with the same per-module ranks and gives sdrun's logits (1e-4)",
          err <= 1e-4, f"relative err {err:.1e}")


def check_peft(sdc_bin, sdrun, plan, onnx_path, hf_dir, data, ids, tmp):
    import torch
    from peft import OSFConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
    base = lambda: AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ours = os.path.join(tmp, "sdc_adapter")
    sh([sdrun, "train", plan, "--data", data, "--steps", "3", "--lr", "1e-2", "--save-adapter", ours])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = PeftModel.from_pretrained(base(), ours).eval()
    noise = [str(w.message)[:120] for w in caught if "osf" in str(w.message).lower() or "unexpected" in str(w.message).lower()
             or "missing" in str(w.message).lower()]
    check("sdc->PEFT: PeftModel.from_pretrained loads the OSF adapter without warnings", not noise, "; ".join(noise))
    with torch.no_grad():
        want = pm(torch.tensor(ids)).logits.numpy()
    err = norm_rel_err(sdrun_logits(sdrun, plan, ours, ids, tmp, "ours"), want)
    check("sdc->PEFT: PEFT's OSF logits equal sdrun infer --adapter's (1e-4)", err <= 1e-4, f"relative err {err:.1e}")

    torch.manual_seed(5)
    pm2 = train_peft_model(get_peft_model(base(), OSFConfig(target_modules=TARGETS, effective_rank=RATIO)),
                           np.random.default_rng(9), 256, 3, BATCH, SEQ)
    theirs = os.path.join(tmp, "peft_adapter")
    pm2.save_pretrained(theirs)
    with torch.no_grad():
        want = pm2(torch.tensor(ids)).logits.numpy()
    err = norm_rel_err(sdrun_logits(sdrun, plan, theirs, ids, tmp, "theirs"), want)
    check("PEFT->sdc: sdrun infer --adapter gives PEFT's OSF logits (1e-4)", err <= 1e-4, f"relative err {err:.1e}")

    merged_onnx = os.path.join(tmp, "merged.onnx")
    sh([sdc_bin, "merge", onnx_path, "--adapter", theirs, "-o", merged_onnx])
    err = norm_rel_err(ort_run(merged_onnx, {"input_ids": ids})["logits"], want)
    check("merge: ONNX Runtime on sdc merge's model gives PEFT's OSF logits (1e-4)", err <= 1e-4,
          f"relative err {err:.1e}")
    return ours, theirs


def bad_inputs(sdc_bin, sdrun, onnx_path, plan, ours, theirs, tmp):
    base = [sdc_bin, "compile", onnx_path, "--peft", "osft", "--target-modules", ",".join(TARGETS), "--shapes",
            f"input_ids={BATCH}x{SEQ}"]
    clean_error("bad input: --osft-preserved-ratio 1 is refused", base + ["--osft-preserved-ratio", "1", "--dry-run"],
                ["(0, 1)"])
    clean_error("bad input: a rank that leaves nothing trainable is refused",
                base + ["--osft-rank-pattern", "q_proj=64", "--dry-run"], ["leaves nothing trainable"])
    clean_error("bad input: a rank pattern that is not NAME=K|R is refused",
                base + ["--osft-rank-pattern", "q_proj=1.5", "--dry-run"], ["NAME=K"])
    clean_error("bad input: --peft osft without --target-modules is refused",
                [sdc_bin, "compile", onnx_path, "--peft", "osft", "--dry-run"], ["--target-modules"])
    ids = os.path.join(tmp, "ids.npy")
    np.save(ids, np.zeros((BATCH, SEQ), np.int64))
    infer = lambda adapter: [sdrun, "infer", plan, "--adapter", adapter, "--input", f"input_ids={ids}",
                             "--output-dir", os.path.join(tmp, "bad_out")]
    for field, value, why in [("init_weights", False, "init_weights"), ("modules_to_save", ["lm_head"], "modules_to_save")]:
        d = os.path.join(tmp, f"bad_{field}")
        shutil.copytree(theirs, d)
        cfg = json.load(open(os.path.join(d, "adapter_config.json")))
        cfg[field] = value
        json.dump(cfg, open(os.path.join(d, "adapter_config.json"), "w"))
        clean_error(f"bad input: an OSF config with {field}={value} is refused", infer(d), [why])
    # An adapter split from other base weights: a plan compiled from another seed.
    import export_hf
    other = os.path.join(tmp, "other.onnx")
    export_hf.export(export_hf.build("llama", seed=2), other, opset=17, batch=BATCH, seq=SEQ)
    other_plan = os.path.join(tmp, "other.sdp")
    sh([sdc_bin, "compile", other, "--peft", "osft", "--target-modules", ",".join(TARGETS), "--shapes",
        f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", other_plan])
    cmd = infer(ours)
    cmd[2] = other_plan
    clean_error("bad input: an adapter split from other base weights is refused (checksum)", cmd,
                ["different base weights"])
    lora = os.path.join(tmp, "lora_adapter")
    os.makedirs(lora)
    json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8}, open(os.path.join(lora, "adapter_config.json"), "w"))
    shutil.copy(os.path.join(ours, "adapter_model.safetensors"), lora)
    clean_error("bad input: a LoRA adapter on an OSF plan is refused", infer(lora), ["the adapter is LoRA", "--peft osft"])


def main():
    sdc_bin, sdrun = tool_paths()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(sdrun)), "python"))
    from transformers import AutoModelForCausalLM
    import export_hf

    tmp = tempfile.mkdtemp(prefix="sd_osft_")
    try:
        model = export_hf.build("llama", seed=1)
        hf_dir, onnx_path = os.path.join(tmp, "hf"), os.path.join(tmp, "model.onnx")
        model.save_pretrained(hf_dir)
        export_hf.export(model, onnx_path, opset=17, batch=BATCH, seq=SEQ)
        rng = np.random.default_rng(3)
        data = os.path.join(tmp, "train.jsonl")
        write_token_rows(data, rng, 256, 100, SEQ)
        ids = rng.integers(0, 256, (BATCH, SEQ)).astype(np.int64)
        plan = os.path.join(tmp, "osft.sdp")
        flags = ["--peft", "osft", "--target-modules", ",".join(TARGETS), "--osft-preserved-ratio", str(RATIO),
                 "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}"]
        sh([sdc_bin, "compile", onnx_path] + flags + ["--osft-strategy", "factored", "-o", plan])
        base = lambda: AutoModelForCausalLM.from_pretrained(hf_dir).eval()
        session, mods = check_split(plan, base())
        split = factors(session, mods)
        check_subspace(plan, data, mods, split)
        factored_losses = check_against_torch(plan, data, base(), split)
        dense = os.path.join(tmp, "dense.sdp")
        sh([sdc_bin, "compile", onnx_path] + flags + ["--osft-strategy", "dense", "-o", dense])
        _, _, dense_losses = train(dense, data, 10)
        err = max(abs(a - b) / abs(b) for a, b in zip(dense_losses, factored_losses))
        check("strategy: W rebuilt once per step trains like the factored layer (1e-5)", err <= 1e-5,
              f"worst relative loss err {err:.1e}")
        dry = sh([sdc_bin, "compile", onnx_path] + flags + ["--dry-run"])
        check("dry run: lists each module's k, trainable count and strategy",
              dry.count("k=") == len(mods) and dry.count("strategy=factored") + dry.count("strategy=dense") == len(mods),
              dry.strip().splitlines()[0])
        check_targets(sdc_bin, sdrun, onnx_path, hf_dir, data, ids, tmp)
        ours, theirs = check_peft(sdc_bin, sdrun, plan, onnx_path, hf_dir, data, ids, tmp)
        bad_inputs(sdc_bin, sdrun, onnx_path, plan, ours, theirs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("osft")


if __name__ == "__main__":
    sys.exit(main())
