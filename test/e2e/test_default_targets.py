#!/usr/bin/env python3
"""`sdc compile model.onnx --peft lora -o plan.sdp` with nothing else, then
`sdrun train plan.sdp --data train.jsonl`, the product's first command, on
an export folder (model.onnx beside its config.json, as Optimum writes it):
the plan adapts PEFT's default modules and trains in a default bucket (8
rows of min(512, max_position_embeddings) tokens), both said on stderr.

sdc compile --peft M without --target-modules adapts the layers PEFT's
config M adapts when target_modules is not given: PEFT's default for the
model's transformers model_type, read from the config.json beside the ONNX
model (Optimum's export folder) or given as --model-type.

For GPT-2, Llama, Qwen2, Mistral, Phi and BERT (transformers configs, seeded
random weights) and the methods LoRA, LoHa, LoKr, VeRA, AdaLoRA, IA3
(targets and feedforward modules) and OSF, the plan's modules (sdc compile
--dry-run) are exactly those get_peft_model wraps (DyLoRA takes LoRA's;
LoHa, LoKr and OSF leave GPT-2 out: PEFT's refuse or skip its Conv1D
layers; OSF falls back to all linear layers, as PEFT's, for BERT);
where PEFT has no default (it raises), sdc refuses in one line naming the
model_type, and --model-type overrides a config.json. Every (method,
model_type) pair of PEFT's mappings is checked against sdc's tables too.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

from e2e_util import ROOT, clean_error_problems, tool_paths
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ = 1, 8
METHODS = ("lora", "loha", "lokr", "dylora", "vera", "adalora", "ia3", "osft")


def bert():
    import torch
    import transformers
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, attn_implementation="eager")).eval()


def export(arch, folder):
    """The model exported beside its config.json; returns the model."""
    import torch
    import export_hf
    os.makedirs(folder)
    onnx_path = os.path.join(folder, "model.onnx")
    if arch == "bert":
        model = bert()
        forward = type(model).forward
        model.forward = lambda ids: tuple(forward(model, input_ids=ids)[:2])  # the pooler too: every layer PEFT sees
        try:
            torch.onnx.export(model, (torch.zeros(BATCH, SEQ, dtype=torch.int64),), onnx_path,
                              input_names=["input_ids"], output_names=["hidden", "pooled"], opset_version=17,
                              dynamo=False)
        finally:
            del model.forward
    else:
        model = export_hf.build(arch, 0)
        export_hf.export(model, onnx_path, opset=17, batch=BATCH, seq=SEQ)
    model.config.to_json_file(os.path.join(folder, "config.json"))
    return model


def peft_choice(method, model):
    """(targets, feedforward) PEFT's config for `method` wraps on `model`, or
    None when PEFT refuses (no default for the model_type)."""
    import peft
    from peft.tuners.tuners_utils import BaseTunerLayer
    configs = {"lora": lambda: peft.LoraConfig(), "dylora": lambda: peft.LoraConfig(),
               "loha": lambda: peft.LoHaConfig(), "lokr": lambda: peft.LoKrConfig(), "vera": lambda: peft.VeraConfig(),
               "adalora": lambda: peft.AdaLoraConfig(total_step=10), "ia3": lambda: peft.IA3Config(),
               "osft": lambda: peft.OSFConfig()}
    import copy
    try:
        pm = peft.get_peft_model(copy.deepcopy(model), configs[method]())
    except ValueError:
        return None
    targets, feedforward = set(), set()
    for name, m in pm.named_modules():
        if isinstance(m, BaseTunerLayer):
            plain = name.removeprefix("base_model.model.")
            targets.add(plain)
            if method == "ia3" and getattr(m, "is_feedforward", False):
                feedforward.add(plain)
    return targets, feedforward


def sdc_choice(sdc, onnx_path, method, extra=()):
    """(targets, feedforward, stderr note) of sdc compile --dry-run, or None with the error line."""
    flags = ["--total-step", "10"] if method == "adalora" else []
    r = subprocess.run([sdc, "compile", onnx_path, "--peft", method, *flags, *extra, "--dry-run"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr.strip()
    targets, feedforward = set(), set()
    listing = False
    for line in r.stdout.splitlines():
        if re.match(r"^(LoRA|LoHa|LoKr|DyLoRA|VeRA|AdaLoRA|IA3|OSFT)\b", line):
            listing = True
            continue
        if listing and line.startswith("  "):
            name = line.split()[0]
            targets.add(name)
            if "feedforward" in line:
                feedforward.add(name)
        elif listing:
            listing = False
    return (targets, feedforward), r.stderr.strip()


def table_checks(sdc, tmp):
    """Every model_type of PEFT's mappings, for every method: the note sdc
    prints (before it reads the model, here one that is not there) names
    PEFT's modules, and a model_type PEFT has no entry for is refused."""
    from peft.utils import constants as c
    tables = {"lora": c.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING,
              "loha": c.TRANSFORMERS_MODELS_TO_LOHA_TARGET_MODULES_MAPPING,
              "lokr": c.TRANSFORMERS_MODELS_TO_LOKR_TARGET_MODULES_MAPPING,
              "dylora": c.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING,
              "vera": c.TRANSFORMERS_MODELS_TO_VERA_TARGET_MODULES_MAPPING,
              "adalora": c.TRANSFORMERS_MODELS_TO_ADALORA_TARGET_MODULES_MAPPING,
              "ia3": c.TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING,
              "osft": c.TRANSFORMERS_MODELS_TO_OSF_TARGET_MODULES_MAPPING}
    ia3_ff = c.TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING
    absent = os.path.join(tmp, "absent", "model.onnx")
    text = lambda v: v if isinstance(v, str) else ",".join(v)
    bad, count = [], 0
    for method, table in tables.items():
        for model_type in sorted(set(table) | set(ia3_ff) | {"no_such_model"}):
            extra = ["--total-step", "10"] if method == "adalora" else []
            r = subprocess.run([sdc, "compile", absent, "--peft", method, "--model-type", model_type, *extra, "-o",
                                os.path.join(tmp, "x.sdp")], capture_output=True, text=True, timeout=60)
            first = r.stderr.splitlines()[0] if r.stderr else ""
            want = table.get(model_type)
            if method == "osft" and want is None:
                want = "all-linear"  # OSF's fallback
            if method == "ia3" and model_type not in ia3_ff:
                want = None  # PEFT's IA3 needs both tables
            count += 1
            if want is None:
                if "PEFT has no default target_modules" not in first:
                    bad.append(f"{method}/{model_type}: {first}")
                continue
            note = f"sdc: --target-modules {text(want)}"
            if method == "ia3" and ia3_ff[model_type]:
                note += f" --feedforward-modules {text(ia3_ff[model_type])}"
            if not first.startswith(note + ":"):
                bad.append(f"{method}/{model_type}: {first!r}, want {note!r}")
    check(f"all {count} (method, model_type) pairs: sdc's default target_modules are PEFT's mappings, and a "
          "model_type PEFT does not list is refused", not bad, "; ".join(bad[:3]) or f"{count} pairs")


def first_command(sdc, sdrun, folder):
    """The headline flow on an export folder: no flag but --peft lora."""
    from e2e_util import write_token_rows
    import numpy as np
    plan, data = os.path.join(folder, "plan.sdp"), os.path.join(folder, "train.jsonl")
    r = subprocess.run([sdc, "compile", os.path.join(folder, "model.onnx"), "--peft", "lora", "-o", plan],
                       capture_output=True, text=True, timeout=300)
    write_token_rows(data, np.random.default_rng(1), 256, 16, 12)
    t = subprocess.run([sdrun, "train", plan, "--data", data, "--steps", "2", "--threads", "2"],
                       capture_output=True, text=True, timeout=300) if r.returncode == 0 else None
    inspect = subprocess.run([sdrun, "inspect", plan], capture_output=True, text=True).stdout if t else ""
    notes = r.stderr.strip().splitlines()
    check("sdc compile model.onnx --peft lora -o plan.sdp on an export folder (config.json beside it): PEFT's "
          "q_proj,v_proj and a default bucket of 8 x 128 tokens (max_position_embeddings 128), said on stderr; "
          "sdrun train --data then trains",
          r.returncode == 0 and len(notes) == 2 and "q_proj,v_proj" in notes[0] and
          "--dim batch=8 --dim seq=128" in notes[1] and t is not None and t.returncode == 0 and
          "input_ids: i64[8x128]" in inspect,
          "; ".join(notes) + (f"; train exit {t.returncode}: {t.stderr.strip()[-200:]}" if t else ""))
    carried_tokenizer(sdc, sdrun, folder)


def carried_tokenizer(sdc, sdrun, folder):
    """An export folder with its tokenizer (Optimum writes tokenizer.json, tokenizer_config.json and
    generation_config.json beside model.onnx): the plan carries it, so `sdrun train --data` reads text lines and
    `sdrun generate --chat` chats with no --tokenizer, exactly as with --tokenizer DIR on a plan without one."""
    import json
    from test_tokenizer import small_tokenizer
    lines = subprocess.run(["bible", "Gen1:1-Gen9:29"], capture_output=True, text=True, check=True).stdout.splitlines()
    with_tok = folder + "_with_tokenizer"
    shutil.copytree(folder, with_tok)
    small_tokenizer(lines, with_tok)
    with open(os.path.join(with_tok, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 2}, f)
    data = os.path.join(with_tok, "text.jsonl")
    with open(data, "w") as f:
        for line in lines[:24]:
            f.write(json.dumps({"text": line[:100]}) + "\n")
    plan, bare = os.path.join(with_tok, "plan.sdp"), os.path.join(with_tok, "bare.sdp")
    r = subprocess.run([sdc, "compile", os.path.join(with_tok, "model.onnx"), "--peft", "lora", "--dim", "batch=2",
                        "--dim", "seq=64", "--kv-cache", "96", "-o", plan], capture_output=True, text=True, timeout=300)
    b = subprocess.run([sdc, "compile", os.path.join(with_tok, "model.onnx"), "--peft", "lora", "--dim", "batch=2",
                        "--dim", "seq=64", "--kv-cache", "96", "--no-tokenizer", "-o", bare], capture_output=True,
                       text=True, timeout=300)
    carried = subprocess.run([sdrun, "inspect", plan], capture_output=True, text=True).stdout

    def losses(p, *flags):
        m = os.path.join(with_tok, "m.jsonl")
        t = subprocess.run([sdrun, "train", p, "--data", data, "--steps", "3", "--no-shuffle", "--threads", "2",
                            "--metrics", m, *flags], capture_output=True, text=True, timeout=300)
        if t.returncode:
            return t.stderr.strip()[-200:]
        return [json.loads(l)["loss"] for l in open(m) if "loss" in json.loads(l)]
    ours, want = losses(plan), losses(bare, "--tokenizer", with_tok)
    check("a tokenizer beside the model travels in the plan (tokenizer.json, tokenizer_config.json, "
          "generation_config.json; said on stderr; --no-tokenizer leaves it out): sdrun train reads text lines "
          "without --tokenizer, loss for loss as with --tokenizer DIR",
          r.returncode == 0 and "carries the tokenizer" in r.stderr and "carries: generation_config.json" in carried
          and b.returncode == 0 and isinstance(ours, list) and len(ours) == 3 and ours == want,
          f"{ours} vs {want}; {r.stderr.strip()[-200:]}")

    def chat(p, *flags):
        g = subprocess.run([sdrun, "generate", p, "--chat", "--prompt", "Who made the light?", "--max-new-tokens",
                            "8", "--temperature", "0", "--threads", "2", *flags], capture_output=True, text=True,
                           timeout=120)
        return g.stdout if g.returncode == 0 else "error: " + g.stderr.strip()
    check("sdrun generate --chat with the plan's own tokenizer and chat template equals --tokenizer DIR's",
          chat(plan) == chat(bare, "--tokenizer", with_tok) and not chat(plan).startswith("error"),
          f"{chat(plan)!r} vs {chat(bare, '--tokenizer', with_tok)!r}")
    g = subprocess.run([sdrun, "generate", bare, "--chat", "--prompt", "x"], capture_output=True, text=True, timeout=60)
    check("bad input: --chat on a plan with no tokenizer and no --tokenizer is a one-line error",
          g.returncode == 1 and len(g.stderr.strip().splitlines()) == 1 and "--chat needs" in g.stderr,
          g.stderr.strip())
    broken = folder + "_broken_tokenizer"
    shutil.copytree(folder, broken)
    with open(os.path.join(broken, "tokenizer.json"), "w") as f:
        f.write("{not json")
    r = subprocess.run([sdc, "compile", os.path.join(broken, "model.onnx"), "--peft", "lora", "--dim", "batch=2",
                        "--dim", "seq=64", "-o", os.path.join(broken, "plan.sdp")], capture_output=True, text=True,
                       timeout=300)
    check("a broken tokenizer.json beside the model: the plan compiles without it, with a warning naming it",
          r.returncode == 0 and "warning: the plan carries no tokenizer" in r.stderr and "tokenizer.json" in r.stderr,
          r.stderr.strip()[-300:])
    r = subprocess.run([sdc, "compile", os.path.join(broken, "model.onnx"), "--peft", "lora", "--target-modules",
                        "q_proj", "--dim", "batch=2", "--dim", "seq=64", "--tokenizer", broken,
                        "-o", os.path.join(broken, "named.sdp")], capture_output=True, text=True, timeout=300)
    check("bad input: --tokenizer naming a broken tokenizer is a one-line error and writes no plan",
          r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "--tokenizer" in r.stderr and
          not os.path.exists(os.path.join(broken, "named.sdp")), r.stderr.strip())


def main():
    sdc, sdrun = tool_paths()
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_default_targets_")
    try:
        for arch in ("gpt2", "llama", "qwen2", "mistral", "phi", "bert"):
            d = os.path.join(tmp, arch)
            model = export(arch, d)
            onnx_path = os.path.join(d, "model.onnx")
            model_type = model.config.model_type
            for method in METHODS:
                if arch == "gpt2" and method in ("loha", "lokr", "osft"):
                    continue  # PEFT's LoHa and LoKr refuse GPT-2's Conv1D layers, its OSF skips them (wraps none)
                want = peft_choice(method, model)
                got, note = sdc_choice(sdc, onnx_path, method)
                if want is None:
                    line = note.splitlines()[-1] if note else ""
                    check(f"{arch} --peft {method}: PEFT has no default target_modules for model_type "
                          f"'{model_type}', and sdc refuses in one line naming it",
                          got is None and note.count("\n") == 0 and f"'{model_type}'" in line and
                          "--target-modules" in line, line)
                    continue
                ok = got is not None and got[0] == want[0] and got[1] == want[1] and f"'{model_type}'" in note
                check(f"{arch} --peft {method}: without --target-modules the plan adapts PEFT's {len(want[0])} "
                      f"modules" + (f" ({len(want[1])} feedforward)" if method == "ia3" else "") +
                      f" for model_type '{model_type}', and says so",
                      ok, note if got is None else
                      f"{note}; sdc only {sorted(got[0] - want[0])[:3]}, PEFT only {sorted(want[0] - got[0])[:3]}, "
                      f"feedforward sdc {sorted(got[1])[:2]} PEFT {sorted(want[1])[:2]}")
        table_checks(sdc, tmp)
        first_command(sdc, sdrun, os.path.join(tmp, "llama"))
        # --model-type overrides config.json: Llama's layout read as Mistral's (the same names).
        onnx_path = os.path.join(tmp, "llama", "model.onnx")
        got, note = sdc_choice(sdc, onnx_path, "osft", ["--model-type", "mistral"])
        check("--model-type mistral overrides the config.json's llama, and the note says where it came from",
              got is not None and len(got[0]) == 14 and "'mistral' (--model-type)" in note, note)
        bare = os.path.join(tmp, "bare")
        os.makedirs(bare)
        shutil.copy(onnx_path, bare)
        out = os.path.join(tmp, "refused.sdp")
        for what, cmd, words in (
                ("a model without config.json and no --model-type",
                 [sdc, "compile", os.path.join(bare, "model.onnx"), "--peft", "lora", "-o", out],
                 ["--target-modules", "--model-type"]),
                ("--model-type without an adapter method", [sdc, "compile", onnx_path, "--peft", "none",
                                                             "--model-type", "llama", "-o", out],
                 ["--model-type", "needs an adapter method"])):
            problems, line = clean_error_problems(cmd, words, [out])
            check(f"refused: {what}", not problems, "; ".join(problems) or line)
        with open(os.path.join(bare, "config.json"), "w") as f:
            f.write("{not json")
        problems, line = clean_error_problems([sdc, "compile", os.path.join(bare, "model.onnx"), "--peft", "lora",
                                               "-o", out], ["config.json"], [out])
        check("refused: a config.json that is not JSON, naming it", not problems, "; ".join(problems) or line)
        r = subprocess.run([sdc, "compile", os.path.join(bare, "model.onnx"), "--peft", "lora", "--target-modules",
                            "q_proj", "--dry-run"], capture_output=True, text=True, timeout=120)
        check("a broken config.json is not read when --target-modules is given", r.returncode == 0,
              f"exit {r.returncode}: {r.stderr.strip()[-200:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_default_targets")


if __name__ == "__main__":
    sys.exit(main())
