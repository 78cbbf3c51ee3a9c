#!/usr/bin/env python3
"""LoRA adapters both ways between sdc and the real Hugging Face PEFT, on real
transformers architectures built from configs with seeded random weights:
GPT2LMHeadModel (Conv1D weights stored [in, out]: PEFT's fan_in_fan_out) and a
tiny LlamaForCausalLM with rsLoRA (the exporter renames its weights
onnx::MatMul_N; the module names come from node scopes). For each:

  sdc -> PEFT  sdc compile --peft lora, sdrun train, --save-adapter; PEFT's
               PeftModel.from_pretrained loads it with no missing or
               unexpected keys and no warnings; its logits equal sdrun infer
               --adapter's (1e-4 relative)
  PEFT -> sdc  get_peft_model, PyTorch AdamW steps, save_pretrained; sdrun
               infer --adapter gives PEFT's logits; sdrun train --adapter
               starts from PEFT's loss and trains on
  merging      sdc merge equals merge_and_unload() weight for weight, and ONNX
               Runtime on the merged model gives PEFT's logits
  configs      PEFT's fields that change semantics sdc lacks (use_dora, ...)
               are one-line errors naming the field
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import (ROOT, clean_error_problems, ort_run, rel_err, sdrun_logits, sh, tool_paths, train_peft_model,
                      write_token_rows)
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, R, ALPHA, STEPS = 2, 16, 4, 8, 3
TARGETS = {"gpt2": ["c_attn", "c_proj"], "llama": ["q_proj", "v_proj", "down_proj"]}


def peft_warnings(caught):
    """Warnings that come from loading the adapter (PEFT's own, or any about
    keys, adapters or fan_in_fan_out), not transformers' deprecation notes."""
    bad = []
    for w in caught:
        text = str(w.message)
        if "/peft/" in (w.filename or "") or any(k in text for k in ("adapter", "keys", "fan_in_fan_out", "LoRA")):
            bad.append(f"{w.category.__name__}: {text[:160]}")
    return bad


def first_batch(path):
    with open(path) as f:
        return np.array([json.loads(next(f))["input_ids"] for _ in range(BATCH)], dtype=np.int64)


def initializers(onnx_path):
    import onnx
    from onnx import numpy_helper
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(onnx_path).graph.initializer}


def onnx_weight_names(onnx_path, base_model, modules):
    """The ONNX initializer holding each adapted module's weight, and whether
    it is stored as PyTorch's weight or its transpose (exporters fold
    Linear's transpose into a renamed initializer)."""
    inits = initializers(onnx_path)
    found = {}
    for m in modules:
        w = base_model.get_submodule(m).weight.detach().numpy()
        for name, v in inits.items():
            if v.shape == w.shape and np.array_equal(v, w):
                found[m] = (name, False)
            elif v.shape == w.T.shape and np.array_equal(v, w.T):
                found[m] = (name, True)
    return found


def merged_weights_gap(onnx_path, merged_onnx, base_model, merged_model, modules):
    """How far sdc merge's weights are from a PEFT-merged model's, module by
    module: (worst relative error, how many modules' weights were found)."""
    names = onnx_weight_names(onnx_path, base_model, modules)
    got = initializers(merged_onnx)
    worst = 0.0
    for m in modules:
        name, transposed = names[m]
        w = merged_model.get_submodule(m).weight.detach().numpy()
        worst = max(worst, rel_err(got[name], w.T if transposed else w))
    return worst, len(names)


def roundtrip(arch, sdc, sdrun, tmp, rslora=False):
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM
    import export_hf

    d = os.path.join(tmp, arch)
    os.makedirs(d)
    model = export_hf.build(arch, seed=1)
    hf_dir, onnx_path = os.path.join(d, "hf"), os.path.join(d, "model.onnx")
    model.save_pretrained(hf_dir)
    export_hf.export(model, onnx_path, opset=17, batch=BATCH, seq=SEQ)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(3)
    data = os.path.join(d, "train.jsonl")
    write_token_rows(data, rng, vocab, 16, SEQ)
    ids = rng.integers(0, vocab, (BATCH, SEQ)).astype(np.int64)
    targets = TARGETS[arch]
    plan = os.path.join(d, "lora.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(targets), "--lora-r", str(R),
        "--lora-alpha", str(ALPHA), "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes",
        f"input_ids={BATCH}x{SEQ}", "-o", plan] + (["--use-rslora"] if rslora else []))
    base = lambda: AutoModelForCausalLM.from_pretrained(hf_dir).eval()

    # sdc -> PEFT
    ours = os.path.join(d, "sdc_adapter")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--lr", "1e-2", "--save-adapter", ours])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = PeftModel.from_pretrained(base(), ours).eval()
    saved = set(load_file(os.path.join(ours, "adapter_model.safetensors")))
    expected = {k.replace(".default", "") for k in get_peft_model_state_dict(pm)}
    expected = {k if k.startswith("base_model.model.") else "base_model.model." + k for k in expected}
    check(f"{arch} sdc->PEFT: adapter keys are exactly PEFT's", saved == expected,
          f"{len(saved)} keys; missing {sorted(expected - saved)[:3]}, unexpected {sorted(saved - expected)[:3]}")
    bad = peft_warnings(caught)
    check(f"{arch} sdc->PEFT: PeftModel.from_pretrained warns about nothing", not bad, "; ".join(bad) or "no warnings")
    written = json.load(open(os.path.join(ours, "adapter_config.json")))
    check(f"{arch} sdc->PEFT: fan_in_fan_out and use_rslora as compiled",
          written["fan_in_fan_out"] == (arch == "gpt2") and written["use_rslora"] == rslora,
          f"fan_in_fan_out {written['fan_in_fan_out']}, use_rslora {written['use_rslora']}")
    lora_b = [v for k, v in load_file(os.path.join(ours, "adapter_model.safetensors")).items() if "lora_B" in k]
    check(f"{arch} sdc->PEFT: training moved lora_B off zero", all(np.abs(b).max() > 0 for b in lora_b), "")
    with torch.no_grad():
        want = pm(torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plan, ours, ids, d, "ours"), want)
    check(f"{arch} sdc->PEFT: PEFT's logits equal sdrun infer --adapter", err <= 1e-4, f"relative err {err:.2e}")

    # PEFT -> sdc
    torch.manual_seed(7)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM",
                     fan_in_fan_out=arch == "gpt2", use_rslora=rslora)
    pm2 = train_peft_model(get_peft_model(base(), cfg), rng, vocab, STEPS, BATCH, SEQ)
    theirs = os.path.join(d, "peft_adapter")
    pm2.save_pretrained(theirs)
    with torch.no_grad():
        want = pm2(torch.tensor(ids)).logits.numpy()
        first = torch.tensor(first_batch(data))
        want_loss = float(pm2(input_ids=first, labels=first).loss)
    err = rel_err(sdrun_logits(sdrun, plan, theirs, ids, d, "theirs"), want)
    check(f"{arch} PEFT->sdc: sdrun infer --adapter gives PEFT's logits", err <= 1e-4, f"relative err {err:.2e}")
    metrics = os.path.join(d, "metrics.jsonl")
    on = os.path.join(d, "trained_on")
    sh([sdrun, "train", plan, "--data", data, "--no-shuffle", "--steps", "2", "--lr", "1e-2", "--adapter", theirs,
        "--metrics", metrics, "--save-adapter", on])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    check(f"{arch} PEFT->sdc: sdrun train --adapter starts from PEFT's loss", abs(losses[0] - want_loss) <= 1e-4 *
          abs(want_loss), f"sdrun {losses[0]:.6f}, PEFT {want_loss:.6f}")
    moved = max(float(np.abs(load_file(os.path.join(on, "adapter_model.safetensors"))[k] - v).max())
                for k, v in load_file(os.path.join(theirs, "adapter_model.safetensors")).items())
    check(f"{arch} PEFT->sdc: training on moves the adapter", moved > 0, f"max change {moved:.2e}")

    # Merging
    merged_onnx = os.path.join(d, "merged.onnx")
    sh([sdc, "merge", onnx_path, "--adapter", theirs, "-o", merged_onnx])
    merged = pm2.merge_and_unload()
    modules = sorted({k[len("base_model.model."):].rsplit(".lora_", 1)[0]
                      for k in load_file(os.path.join(theirs, "adapter_model.safetensors"))})
    worst, found = merged_weights_gap(onnx_path, merged_onnx, base(), merged, modules)
    check(f"{arch} merge: sdc merge equals PEFT's merge_and_unload on all {len(modules)} modules",
          found == len(modules) and worst <= 1e-6, f"worst relative err {worst:.2e}")
    err = rel_err(ort_run(merged_onnx, {"input_ids": ids})["logits"], want)
    check(f"{arch} merge: ONNX Runtime on the merged model gives PEFT's logits", err <= 1e-4,
          f"relative err {err:.2e}")
    return plan, theirs


def refusals(sdrun, plan, adapter, tmp):
    """PEFT configs whose semantics sdc lacks fail loudly, naming the field."""
    cases = [("use_dora", True), ("modules_to_save", ["lm_head"]), ("rank_pattern", {"q_proj": 8}),
             ("bias", "lora_only"), ("init_lora_weights", "pissa"),
             ("init_lora_weights", "corda")]
    ids = os.path.join(tmp, "refuse_ids.npy")
    np.save(ids, np.zeros((BATCH, SEQ), np.int64))
    for n, (field, value) in enumerate(cases):
        d = os.path.join(tmp, f"refuse_{n}_{field}")
        shutil.copytree(adapter, d)
        cfg = json.load(open(os.path.join(d, "adapter_config.json")))
        cfg[field] = value
        json.dump(cfg, open(os.path.join(d, "adapter_config.json"), "w"))
        out = os.path.join(tmp, f"refuse_{n}_{field}_out")
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", d, "--input", f"input_ids={ids}",
                                               "--output-dir", out], [field], [out])
        check(f"adapter_config.json with {field}={json.dumps(value)} is a clean error naming it", not problems,
              "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_peft_")
    try:
        roundtrip("gpt2", sdc, sdrun, tmp)
        plan, adapter = roundtrip("llama", sdc, sdrun, tmp, rslora=True)
        refusals(sdrun, plan, adapter, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_peft_roundtrip")


if __name__ == "__main__":
    sys.exit(main())
