#!/usr/bin/env python3
"""PEFT methods beyond plain LoRA against the real Hugging Face PEFT, on
transformers' GPT-2 (Conv1D weights stored [in, out], biases) and a tiny
Llama built from configs with seeded random weights:

  DoRA (--peft lora --use-dora, PEFT's use_dora), (IA)³ (--peft ia3,
  PEFT's IA3Config with feedforward_modules), VeRA (--peft vera: its shared
  projections drawn as PEFT draws them, bit for bit), LoHa (--peft loha)
  and LoKr (--peft lokr, by default and with decompose_both and
  decompose_factor 16, so every factor form is met: whole, and the rank-r
  products of W1 and of W2); LoHa and LoKr on Llama only, as PEFT's adapt
  nn.Linear, not GPT-2's Conv1D; and LoRA with PEFT's bias option (--bias
  all: every bias trains, LayerNorm's too; --bias lora_only: the adapted
  layers' own) on GPT-2, which has biases. For each method and model:

  training   sdrun train from PEFT's own random start (init_lora_weights,
             init_ia3_weights or init_weights False) gives PEFT's AdamW losses and adapter
             tensors step for step (1e-4 relative)
  sdc->PEFT  the saved adapter loads in PeftModel.from_pretrained with
             exactly PEFT's keys and no warnings; PEFT's logits equal sdrun
             infer --adapter's
  merging    sdc merge equals merge_and_unload() weight for weight (biases
             too), and ONNX Runtime on the merged model gives PEFT's logits
  refusals   an adapter of another method, or IA3 with other
             feedforward_modules, is a one-line error naming what differs

DoRA with lora_dropout and VeRA with vera_dropout train (their dropout
masks are ours, so their losses are not PEFT's) and their inference equals
PEFT's on the adapters they save.
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import (ROOT, clean_error_problems, ort_run, peft_steps, rel_err, sdrun_logits, sh, tool_paths,
                      write_token_rows)
from test_peft_roundtrip import initializers, merged_weights_gap, peft_warnings
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, STEPS, R, ALPHA, LR = 2, 16, 10, 4, 8, 1e-3
LORA_TARGETS = {"gpt2": ["c_attn", "c_proj"], "llama": ["q_proj", "v_proj", "down_proj"]}
METHOD_NAMES = {"dora": "DoRA", "ia3": "IA3", "loha": "LoHa", "lokr": "LoKr", "lokr_both": "LoKr decompose_both",
                "vera": "VeRA", "bias_all": "LoRA bias=all", "bias_lora_only": "LoRA bias=lora_only",
                "pissa": "LoRA init pissa", "olora": "LoRA init olora", "loftq": "LoRA init loftq"}
BIAS = {"bias_all": "all", "bias_lora_only": "lora_only"}  # PEFT's bias: the model's biases train beside LoRA
STARTS = ("pissa", "olora", "loftq")  # PEFT's init_lora_weights that rewrite the base weight (test_lora_starts.py)
IA3_TARGETS = {"gpt2": (["c_attn", "mlp.c_proj"], ["mlp.c_proj"]),
               "llama": (["k_proj", "v_proj", "down_proj"], ["down_proj"])}


def peft_config(method, arch, dropout=0.0):
    from peft import IA3Config, LoHaConfig, LoKrConfig, LoraConfig, VeraConfig
    if method == "vera":  # lambda_b ones, lambda_d random: a random start
        return VeraConfig(r=R, target_modules=LORA_TARGETS[arch], init_weights=False, fan_in_fan_out=arch == "gpt2",
                          task_type="CAUSAL_LM")
    if method == "loha":
        return LoHaConfig(r=R, alpha=ALPHA, target_modules=LORA_TARGETS[arch], init_weights=False, task_type="CAUSAL_LM")
    if method in ("lokr", "lokr_both"):
        both = method == "lokr_both"
        return LoKrConfig(r=R, alpha=ALPHA, target_modules=LORA_TARGETS[arch], init_weights=False, decompose_both=both,
                          decompose_factor=16 if both else -1, task_type="CAUSAL_LM")
    if method in BIAS:
        return LoraConfig(r=R, lora_alpha=ALPHA, target_modules=LORA_TARGETS[arch], init_lora_weights=False,
                          fan_in_fan_out=arch == "gpt2", task_type="CAUSAL_LM", bias=BIAS[method])
    if method in STARTS:
        from peft import LoftQConfig
        return LoraConfig(r=R, lora_alpha=ALPHA, target_modules=LORA_TARGETS[arch], init_lora_weights=method,
                          fan_in_fan_out=arch == "gpt2", task_type="CAUSAL_LM",
                          loftq_config=LoftQConfig(loftq_bits=4, loftq_iter=1) if method == "loftq" else {})
    if method == "ia3":
        targets, feedforward = IA3_TARGETS[arch]
        return IA3Config(target_modules=targets, feedforward_modules=feedforward, init_ia3_weights=False,
                         fan_in_fan_out=arch == "gpt2", task_type="CAUSAL_LM")
    return LoraConfig(r=R, lora_alpha=ALPHA, target_modules=LORA_TARGETS[arch], lora_dropout=dropout,
                      init_lora_weights=False, fan_in_fan_out=arch == "gpt2", task_type="CAUSAL_LM", use_dora=True)


def compile_flags(method, arch, dropout=0.0):
    if method == "vera":  # PEFT's projection_prng_key 0: sdc's --seed 0
        return ["--peft", "vera", "--target-modules", ",".join(LORA_TARGETS[arch]), "--lora-r", str(R)] + (
            ["--lora-dropout", str(dropout)] if dropout else [])
    if method == "loha":
        return ["--peft", "loha", "--target-modules", ",".join(LORA_TARGETS[arch]), "--lora-r", str(R), "--lora-alpha",
                str(ALPHA)]
    if method in ("lokr", "lokr_both"):
        return ["--peft", "lokr", "--target-modules", ",".join(LORA_TARGETS[arch]), "--lora-r", str(R), "--lora-alpha",
                str(ALPHA)] + (["--decompose-both", "--decompose-factor", "16"] if method == "lokr_both" else [])
    if method in BIAS:
        return ["--peft", "lora", "--target-modules", ",".join(LORA_TARGETS[arch]), "--lora-r", str(R), "--lora-alpha",
                str(ALPHA), "--bias", BIAS[method]]
    if method in STARTS:
        return ["--peft", "lora", "--target-modules", ",".join(LORA_TARGETS[arch]), "--lora-r", str(R), "--lora-alpha",
                str(ALPHA), "--lora-init", method]
    if method == "ia3":
        targets, feedforward = IA3_TARGETS[arch]
        return ["--peft", "ia3", "--target-modules", ",".join(targets), "--feedforward-modules", ",".join(feedforward)]
    return ["--peft", "lora", "--use-dora", "--target-modules", ",".join(LORA_TARGETS[arch]), "--lora-r", str(R),
            "--lora-alpha", str(ALPHA)] + (["--lora-dropout", str(dropout)] if dropout else [])


def tensor_gap(key, ours, theirs):
    """rel_err, except for the key third of GPT-2's fused q/k/v bias (trained
    with PEFT's bias option): its exact gradient is zero (softmax ignores a
    constant added to every key's score), so it holds rounding noise that
    AdamW scales up towards lr per step, differently in every summation
    order. That third must stay within what AdamW can move it (lr per step)
    and is left out of the relative comparison."""
    if not key.endswith("c_attn.base_layer.bias"):
        return rel_err(ours, theirs)
    third = theirs.shape[0] // 3
    key_part = slice(third, 2 * third)
    if np.max(np.abs(ours[key_part] - theirs[key_part])) > STEPS * LR:
        return float("inf")
    rest = np.ones(theirs.shape[0], bool)
    rest[key_part] = False
    return rel_err(ours[rest], theirs[rest])


def saved_key(key):
    """PEFT's state_dict key as its saved adapter names it."""
    key = key.replace(".default", "")
    return key[:-len(".weight")] if key.endswith("lora_magnitude_vector.weight") else key


def method_checks(method, arch, model_dir, sdc, sdrun):
    import torch
    from peft import PeftModel, get_peft_model, get_peft_model_state_dict
    from safetensors.numpy import load_file
    import export_hf

    name = f"{arch} {METHOD_NAMES[method]}"
    d = os.path.join(model_dir, method)
    os.makedirs(d)
    onnx_path, data = os.path.join(model_dir, "model.onnx"), os.path.join(model_dir, "train.jsonl")
    rows = [json.loads(l)["input_ids"] for l in open(data)]
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    plan = os.path.join(d, "plan.sdp")
    sh([sdc, "compile", onnx_path, *compile_flags(method, arch), "--shapes", f"input_ids={BATCH}x{SEQ}",
        "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])

    # Training from PEFT's random start, against PEFT's own steps.
    torch.manual_seed(11)
    pm = get_peft_model(export_hf.build(arch, 0), peft_config(method, arch))
    init, trained, metrics = (os.path.join(d, n) for n in ("init", "trained", "metrics.jsonl"))
    pm.save_pretrained(init)
    want = peft_steps(pm, rows, STEPS, BATCH, LR)  # in eval mode, as the plan has no dropout of GPT-2's own
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics,
        "--save-adapter", trained])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
    theirs = {saved_key(k): v.detach().numpy() for k, v in get_peft_model_state_dict(pm).items()}
    ours = load_file(os.path.join(trained, "adapter_model.safetensors"))
    errs = {k: tensor_gap(k, ours[k], v) for k, v in theirs.items() if k in ours}
    worst = max(errs, key=errs.get) if errs else "none"
    moved = min(float(np.abs(ours[k] - v).max()) for k, v in load_file(os.path.join(init, "adapter_model.safetensors")).items()
                if not k.startswith("base_model.vera_"))  # VeRA's shared projections are frozen
    check(f"{name}: {STEPS} steps from PEFT's random start give PEFT's losses and all {len(theirs)} adapter tensors "
          f"(1e-4), each trained one moved", set(ours) == set(theirs) and loss_err <= 1e-4 and
          errs.get(worst, 1) <= 1e-4 and moved > 0,
          f"losses {losses[:2]} vs PEFT {want[:2]}, worst loss err {loss_err:.1e}, worst tensor err "
          f"{errs.get(worst, float('inf')):.1e} ({worst}), least move {moved:.1e}, {len(ours)} tensors")

    # sdc -> PEFT: what sdrun saved loads in PEFT and computes PEFT's logits.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), trained).eval()
    expected = {saved_key(k) for k in get_peft_model_state_dict(loaded)}
    check(f"{name} sdc->PEFT: adapter keys are exactly PEFT's, loaded with no warnings",
          set(ours) == expected and not peft_warnings(caught),
          f"{len(ours)} keys, PEFT's {len(expected)}; " + ("; ".join(peft_warnings(caught)) or "no warnings"))
    with torch.no_grad():
        want_logits = loaded(torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plan, trained, ids, d, "ours"), want_logits)
    check(f"{name} sdc->PEFT: PEFT's logits equal sdrun infer --adapter (1e-4)", err <= 1e-4, f"relative err {err:.2e}")
    if method == "vera":  # save_projection=False: PEFT and sdc both draw the projections from the key
        bare = os.path.join(d, "no_projection")
        shutil.copytree(trained, bare)
        cfg = json.load(open(os.path.join(bare, "adapter_config.json")))
        cfg["save_projection"] = False
        json.dump(cfg, open(os.path.join(bare, "adapter_config.json"), "w"))
        from safetensors.numpy import save_file
        save_file({k: v for k, v in ours.items() if not k.startswith("base_model.vera_")},
                  os.path.join(bare, "adapter_model.safetensors"), metadata={"format": "pt"})
        with torch.no_grad():
            want_bare = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), bare).eval()(torch.tensor(ids)).logits
        err = rel_err(sdrun_logits(sdrun, plan, bare, ids, d, "bare"), want_bare.numpy())
        merged_bare = os.path.join(d, "merged_bare.onnx")
        sh([sdc, "merge", onnx_path, "--adapter", bare, "-o", merged_bare])
        merge_err = rel_err(ort_run(merged_bare, {"input_ids": ids})["logits"], want_bare.numpy())
        check(f"{name}: an adapter saved without its projections (save_projection false) loads and merges, with "
              f"PEFT's logits (1e-4)", err <= 1e-4 and merge_err <= 1e-4,
              f"sdrun relative err {err:.2e}, ONNX Runtime on the merged model {merge_err:.2e}")
        other_key = os.path.join(d, "other_key")
        shutil.copytree(trained, other_key)
        cfg = json.load(open(os.path.join(other_key, "adapter_config.json")))
        cfg["projection_prng_key"] = 1
        json.dump(cfg, open(os.path.join(other_key, "adapter_config.json"), "w"))
        out = os.path.join(d, "other_key_out")
        ids_file = os.path.join(d, "ids.npy")
        np.save(ids_file, ids)
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", other_key, "--input",
                                               f"input_ids={ids_file}", "--output-dir", out],
                                              ["projection_prng_key=1", "--seed"], [out])
        check(f"{name}: an adapter of another projection_prng_key is a one-line error", not problems,
              "; ".join(problems) or line)
    if method == "ia3":  # PEFT's other form of feedforward_modules: a regex (each vector's shape tells its side)
        regex = os.path.join(d, "regex_form")
        shutil.copytree(trained, regex)
        cfg = json.load(open(os.path.join(regex, "adapter_config.json")))
        cfg["feedforward_modules"] = ".*(" + "|".join(IA3_TARGETS[arch][1]) + ")"
        json.dump(cfg, open(os.path.join(regex, "adapter_config.json"), "w"))
        with torch.no_grad():
            want_regex = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), regex).eval()(torch.tensor(ids)).logits
        err = rel_err(sdrun_logits(sdrun, plan, regex, ids, d, "regex"), want_regex.numpy())
        check(f"{name}: an adapter whose feedforward_modules is a regex loads, with PEFT's logits (1e-4)", err <= 1e-4,
              f"relative err {err:.2e}")

    if method == "lokr":  # a factor missing, or larger than its layer's weight: one line, no merged file
        from safetensors.numpy import save_file
        w2 = next(k for k in sorted(ours) if k.endswith(".lokr_w2"))
        big = next(k for k in sorted(ours) if k.endswith(".lokr_w1"))
        for what, tensors, words in (
                ("a module without its W2", {k: v for k, v in ours.items() if k != w2},
                 ["lokr_w2", w2[len("base_model.model."):-len(".lokr_w2")]]),
                ("a W1 larger than its weight", {**ours, big: np.zeros((512, 512), np.float32)},
                 ["lokr_w1", "512x512", "larger"])):
            broken = os.path.join(d, "broken")
            shutil.rmtree(broken, ignore_errors=True)
            shutil.copytree(trained, broken)
            save_file(tensors, os.path.join(broken, "adapter_model.safetensors"), metadata={"format": "pt"})
            out = os.path.join(d, "broken_merged.onnx")
            problems, line = clean_error_problems([sdc, "merge", onnx_path, "--adapter", broken, "-o", out], words, [out])
            check(f"{name}: sdc merge of an adapter with {what} is a one-line error", not problems,
                  "; ".join(problems) or line)

    # Merging, against PEFT's merge_and_unload of the same adapter.
    merged_onnx = os.path.join(d, "merged.onnx")
    sh([sdc, "merge", onnx_path, "--adapter", trained, "-o", merged_onnx])
    merged = loaded.merge_and_unload()
    suffix = {"ia3": ".ia3_l", "dora": ".lora_A.weight", "loha": ".hada_w1_a", "lokr": ".lokr_w1",
              "lokr_both": ".lokr_w1_a", "vera": ".vera_lambda_b", "bias_all": ".lora_A.weight",
              "bias_lora_only": ".lora_A.weight", "pissa": ".lora_A.weight", "olora": ".lora_A.weight",
              "loftq": ".lora_A.weight"}[method]
    modules = sorted(k[len("base_model.model."):-len(suffix)] for k in ours if k.endswith(suffix))
    base = export_hf.build(arch, 0)
    worst, found = merged_weights_gap(onnx_path, merged_onnx, base, merged, modules)
    got = initializers(merged_onnx)
    biases = 0
    for m in modules:  # GPT-2's biases: IA3 scales those of output-side modules
        bias = base.get_submodule(m).bias
        if bias is None:
            continue
        b = bias.detach().numpy()
        same = [k for k, v in initializers(onnx_path).items() if v.shape == b.shape and np.array_equal(v, b)]
        if len(same) == 1:
            biases += 1
            worst = max(worst, rel_err(got[same[0]], merged.get_submodule(m).bias.detach().numpy()))
    # PiSSA: PEFT rebuilds the residual W - scale B A from a float32 SVD, whose factors are off the
    # fp64 ones sdc merge uses by ~1e-6 of W (1.6e-6 on a Llama q_proj), scale times that in the sum.
    tol = 2e-5 if method == "pissa" else 1e-6
    check(f"{name} merge: sdc merge equals merge_and_unload on {len(modules)} weights and {biases} biases ({tol:g})",
          found == len(modules) and worst <= tol, f"worst relative err {worst:.2e}")
    err = rel_err(ort_run(merged_onnx, {"input_ids": ids})["logits"], want_logits)
    check(f"{name} merge: ONNX Runtime on the merged model gives PEFT's logits (1e-4)", err <= 1e-4,
          f"relative err {err:.2e}")
    return plan, trained


def adapter_dropout(method, arch, model_dir, sdc, sdrun):
    """DoRA with lora_dropout (PEFT's forward there reads the dropped input in
    the magnitude's correction) and VeRA with vera_dropout: training runs,
    the saved config keeps the dropout, and inference (no dropout) equals
    PEFT's on the adapter sdrun saves."""
    import torch
    from peft import PeftModel
    import export_hf
    d = os.path.join(model_dir, method + "_dropout")
    os.makedirs(d)
    plan, trained, metrics = (os.path.join(d, n) for n in ("plan.sdp", "trained", "metrics.jsonl"))
    sh([sdc, "compile", os.path.join(model_dir, "model.onnx"), *compile_flags(method, arch, 0.2), "--shapes",
        f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    sh([sdrun, "train", plan, "--data", os.path.join(model_dir, "train.jsonl"), "--steps", "4", "--lr", "1e-2",
        "--threads", "2", "--metrics", metrics, "--save-adapter", trained])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    written = json.load(open(os.path.join(trained, "adapter_config.json")))
    loaded = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), trained).eval()
    ids = np.random.default_rng(6).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    with torch.no_grad():
        want = loaded(torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plan, trained, ids, d, "dropout"), want)
    field = "lora_dropout" if method == "dora" else "vera_dropout"
    check(f"{arch} {METHOD_NAMES[method]} with {field} 0.2: trains, saves the dropout, and infers as PEFT (1e-4)",
          len(losses) == 4 and all(np.isfinite(losses)) and written[field] == 0.2 and
          written.get("use_dora", method == "dora") == (method == "dora") and err <= 1e-4,
          f"losses {[round(l, 4) for l in losses]}, relative err {err:.2e}")


def refusals(arch, plans, adapters, tmp, sdrun):
    """An adapter of another method, or IA3 vectors on other sides, is a clean error."""
    ids = os.path.join(tmp, "refuse_ids.npy")
    np.save(ids, np.zeros((BATCH, SEQ), np.int64))
    feedforward = os.path.join(tmp, "ia3_other_side")
    shutil.copytree(adapters["ia3"], feedforward)
    cfg_path = os.path.join(feedforward, "adapter_config.json")
    cfg = json.load(open(cfg_path))
    cfg["feedforward_modules"] = []
    json.dump(cfg, open(cfg_path, "w"))
    plain = os.path.join(tmp, "plain_lora")
    shutil.copytree(adapters["dora"], plain)
    cfg_path = os.path.join(plain, "adapter_config.json")
    cfg = json.load(open(cfg_path))
    cfg["use_dora"] = False
    json.dump(cfg, open(cfg_path, "w"))
    cases = [("a DoRA adapter on the IA3 plan", plans["ia3"], adapters["dora"], ["DoRA", "IA3", "--peft ia3"]),
             ("an IA3 adapter on the DoRA plan", plans["dora"], adapters["ia3"], ["IA3", "DoRA", "--use-dora"]),
             ("a plain LoRA adapter on the DoRA plan", plans["dora"], plain, ["LoRA", "DoRA"]),
             ("IA3 with feedforward_modules emptied", plans["ia3"], feedforward, ["feedforward_modules", "input"])]
    if "loha" in plans:
        cases.append(("a LoHa adapter on the DoRA plan", plans["dora"], adapters["loha"], ["LoHa", "DoRA"]))
        other_rank = os.path.join(tmp, "loha_other_rank")
        shutil.copytree(adapters["loha"], other_rank)
        cfg_path = os.path.join(other_rank, "adapter_config.json")
        cfg = json.load(open(cfg_path))
        cfg["r"] = R + 1
        json.dump(cfg, open(cfg_path, "w"))
        cases.append(("a LoHa adapter of another rank", plans["loha"], other_rank, ["r=5", "r=4"]))
    if "lokr" in plans and "lokr_both" in plans:
        cases.append(("a LoKr adapter of other decompose settings", plans["lokr"], adapters["lokr_both"],
                      ["decompose_factor=16", "decompose_factor=-1", "--decompose-both"]))
        cases.append(("a LoHa adapter on the LoKr plan", plans["lokr"], adapters["loha"], ["LoHa", "LoKr", "--peft lokr"]))
    for what, plan, adapter, words in cases:
        out = os.path.join(tmp, "refused_out")
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", adapter, "--input",
                                               f"input_ids={ids}", "--output-dir", out], words, [out])
        check(f"{arch}: {what} is a one-line error naming what differs", not problems, "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    import torch
    import export_hf
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    tmp = tempfile.mkdtemp(prefix="sd_peft_methods_")
    try:
        for arch in ("gpt2", "llama"):
            model_dir = os.path.join(tmp, arch)
            os.makedirs(model_dir)
            export_hf.export(export_hf.build(arch, 0), os.path.join(model_dir, "model.onnx"), opset=17, batch=BATCH,
                             seq=SEQ)
            write_token_rows(os.path.join(model_dir, "train.jsonl"), np.random.default_rng(3), 256, 2 * STEPS, SEQ)
            plans, adapters = {}, {}
            # LoHa and LoKr on Llama only; GPT-2 has the biases PEFT's bias option trains.
            for method in ("dora", "ia3", "vera") + (("loha", "lokr", "lokr_both") if arch == "llama" else
                                                     ("bias_all", "bias_lora_only")):
                try:
                    plans[method], adapters[method] = method_checks(method, arch, model_dir, sdc, sdrun)
                except Exception as e:  # one failing method must not hide the other
                    check(f"{arch} {method} runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
            if "dora" in plans and "ia3" in plans:
                refusals(arch, plans, adapters, model_dir, sdrun)
            if arch == "llama":
                for method in ("dora", "vera"):
                    adapter_dropout(method, arch, model_dir, sdc, sdrun)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_peft_methods")


if __name__ == "__main__":
    sys.exit(main())
