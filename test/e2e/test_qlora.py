#!/usr/bin/env python3
"""QLoRA (sdc compile --peft lora --quantize nf4) against bitsandbytes and
PEFT, on a tiny Llama built from a config with seeded random weights:

  codes      every linear weight but the head is stored as bitsandbytes'
             quantize_4bit (nf4, blocks of 64) stores it, codes and block
             absmax bit for bit, in 4.5 bits a value; the head stays f32, as
             transformers leaves lm_head
  training   sdrun train from PEFT's random LoRA start on the 4-bit model
             (transformers' BitsAndBytesConfig: load_in_4bit, nf4, compute in
             f32) gives PEFT's AdamW losses and adapter tensors step for step
             (bitsandbytes' bf16 CPU inference kernel turned off: its f32
             dequantize-and-multiply, as on CUDA)
  logits     sdrun infer --adapter with the trained adapter gives PEFT's
             logits on the quantized model
  memory     against the same LoRA plan in f32, the weights shrink by 3.4375
             bytes a quantized value (within 1%), and the arena grows by less than half
             the quantized weights' f32 size (each reader dequantizes just
             before it: without that the backward keeps them all alive)
  refusals   --quantize without an adapter method, with OSFT, or another
             format: one line, no plan
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import ROOT, clean_error_problems, peft_steps, rel_err, sdrun_logits, sh, tool_paths, write_token_rows
from test_peft_roundtrip import initializers
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, STEPS, R, ALPHA, LR = 2, 16, 8, 4, 8, 1e-3
TARGETS = ["q_proj", "v_proj"]


def quantized_model(folder):
    """The seeded tiny Llama loaded as transformers loads it for QLoRA."""
    import torch
    import transformers
    # dtype: else transformers loads the rest of a 4-bit model in bf16 (bitsandbytes' default).
    model = transformers.LlamaForCausalLM.from_pretrained(
        folder, device_map="cpu", dtype=torch.float32, quantization_config=transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32))
    # On a CPU with AVX512-BF16, bitsandbytes' Linear4bit repacks its weight at
    # the first forward without gradients and multiplies in bf16 (rounding the
    # products, 1.7e-3 on a 0.5 output here). Off, it dequantizes and multiplies
    # in f32, as its CUDA path does with bnb_4bit_compute_dtype=float32.
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    return model


def plan_globals(build, plan, want):
    """(name -> (dtype, shape)) of the plan's globals, and the values of those
    `want` picks, read through the sdc module."""
    code = ("import sys, json, numpy as np, sdc\n"
            "plan = sdc.Plan(sys.argv[1])\n"
            "names = {g[0]: (str(g[1]), list(g[2])) for g in plan.globals}\n"
            "json.dump(names, open(sys.argv[2] + '.json', 'w'))\n"
            "s = sdc.Session(plan)\n"
            "want = [n for n in names if any(n.endswith(w) for w in json.loads(sys.argv[3]))]\n"
            "np.savez(sys.argv[2], **{n: s.read_global(n) for n in want})\n")
    out = plan + ".globals.npz"
    subprocess.run([sys.executable, "-c", code, plan, out, json.dumps(want)], check=True,
                   env=dict(os.environ, PYTHONPATH=os.path.join(build, "python")))
    return json.load(open(out + ".json")), dict(np.load(out))


def codes_checks(build, plan, onnx_path, model):
    """The plan's codes and absmax against bitsandbytes' quantize_4bit of each PyTorch weight."""
    import bitsandbytes.functional as bnbf
    import torch
    names, values = plan_globals(build, plan, [".nf4", ".nf4_absmax"])
    init = initializers(onnx_path)
    linears = {n: m.weight.detach() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    matched, problems, bits = 0, [], 0.0
    for g in sorted(n for n in names if n.endswith(".nf4")):
        w = init[g[:-len(".nf4")]]
        module = next((n for n, t in linears.items() if t.shape == w.shape and np.array_equal(t.numpy(), w)), None) or \
            next((n for n, t in linears.items() if t.T.shape == w.shape and np.array_equal(t.T.numpy(), w)), None)
        if module is None:
            problems.append(f"{g}: no PyTorch weight has its values")
            continue
        if g[:-len(".nf4")] in names:
            problems.append(f"{module}: the f32 weight is still in the plan beside its codes")
        packed, state = bnbf.quantize_4bit(linears[module], blocksize=64, quant_type="nf4")
        ours_codes, ours_absmax = values[g], values[g + "_absmax"]
        if not np.array_equal(ours_codes, packed.numpy().reshape(-1)):
            problems.append(f"{module}: codes differ at {int(np.sum(ours_codes != packed.numpy().reshape(-1)))} bytes")
        elif not np.array_equal(ours_absmax, state.absmax.numpy()):
            problems.append(f"{module}: absmax differs")
        else:
            matched += 1
            bits = 8.0 * (ours_codes.nbytes + ours_absmax.nbytes) / w.size
    head = linears["lm_head"].numpy()
    head_f32 = [n for n, v in init.items() if n in names and (np.array_equal(v, head) or np.array_equal(v, head.T))]
    n_linear = sum(1 for n in linears if n != "lm_head")
    check(f"codes: all {n_linear} linear weights but the head are bitsandbytes' NF4 codes and absmax bit for bit "
          f"({bits} bits a value); the head stays f32",
          matched == n_linear and not problems and head_f32 and bits == 4.5,
          "; ".join(problems[:4]) or f"{matched} matched")
    return sum(2 * values[g].size for g in values if g.endswith(".nf4"))


def inspect_bytes(sdrun, plan):
    """(weights, arena) bytes as sdrun inspect reports them."""
    out = subprocess.run([sdrun, "inspect", plan], check=True, capture_output=True, text=True).stdout
    line = lambda key: next(l for l in out.splitlines() if l.startswith(key))
    return int(line("weights:").split()[1]), int(line("arena:").split()[1])


def memory_checks(sdc, sdrun, onnx_path, plan, quantized, tmp):
    f32 = os.path.join(tmp, "lora_f32.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R),
        "--lora-alpha", str(ALPHA), "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}",
        "-o", f32])
    (wq, aq), (wf, af) = inspect_bytes(sdrun, plan), inspect_bytes(sdrun, f32)
    check(f"memory: weights {wf} -> {wq} bytes ({quantized} values at 4.5 bits, not 32), arena {af} -> {aq} bytes "
          f"(under half the quantized weights' f32 {4 * quantized} bytes more)",
          # (the dequantizations' small constants, the NF4 table among them, are plan globals too)
          wf - wq >= 0.99 * (quantized * 4 - quantized * 9 / 16) and aq - af < 2 * quantized,
          f"weights {wf} -> {wq}, arena {af} -> {aq}")


def main():
    sdc, sdrun = tool_paths()
    build = os.path.dirname(os.path.dirname(sdc))
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
    from safetensors.numpy import load_file
    import export_hf
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    tmp = tempfile.mkdtemp(prefix="sd_qlora_")
    try:
        model = export_hf.build("llama", 0)
        hf, onnx_path, data = (os.path.join(tmp, n) for n in ("hf", "model.onnx", "train.jsonl"))
        model.save_pretrained(hf)
        export_hf.export(model, onnx_path, opset=17, batch=BATCH, seq=SEQ)
        write_token_rows(data, np.random.default_rng(3), 256, 2 * STEPS, SEQ)
        rows = [json.loads(l)["input_ids"] for l in open(data)]
        plan = os.path.join(tmp, "qlora.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R),
            "--lora-alpha", str(ALPHA), "--quantize", "nf4", "--shapes", f"input_ids={BATCH}x{SEQ}",
            "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
        quantized = codes_checks(build, plan, onnx_path, model)
        memory_checks(sdc, sdrun, onnx_path, plan, quantized, tmp)

        # Training from PEFT's random start on the 4-bit model, against PEFT's own steps.
        torch.manual_seed(11)
        pm = get_peft_model(quantized_model(hf), LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS,
                                                            init_lora_weights=False, task_type="CAUSAL_LM"))
        init, trained, metrics = (os.path.join(tmp, n) for n in ("init", "trained", "metrics.jsonl"))
        pm.save_pretrained(init)
        want = peft_steps(pm, rows, STEPS, BATCH, LR)
        sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
            "--lr-schedule", "constant", "--weight-decay", "0", "--threads", "2", "--adapter", init, "--metrics",
            metrics, "--save-adapter", trained])
        losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
        theirs = {k.replace(".default", ""): v.detach().numpy() for k, v in get_peft_model_state_dict(pm).items()}
        ours = load_file(os.path.join(trained, "adapter_model.safetensors"))
        gap = max(rel_err(ours[k], v) for k, v in theirs.items()) if set(ours) == set(theirs) else float("inf")
        check(f"training: {STEPS} steps from PEFT's random LoRA start on bitsandbytes' 4-bit model give PEFT's losses "
              f"and all {len(theirs)} adapter tensors (1e-4)", loss_err <= 1e-4 and gap <= 1e-4,
              f"losses {[round(l, 6) for l in losses[:3]]} vs PEFT {[round(l, 6) for l in want[:3]]}, worst loss err "
              f"{loss_err:.1e}, worst tensor err {gap:.1e}")

        # Inference with the trained adapter, against PEFT on the quantized model.
        loaded = PeftModel.from_pretrained(quantized_model(hf).eval(), trained).eval()
        ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
        with torch.no_grad():
            want_logits = loaded(torch.tensor(ids)).logits.numpy()
        err = rel_err(sdrun_logits(sdrun, plan, trained, ids, tmp, "qlora"), want_logits)
        check("logits: sdrun infer --adapter gives PEFT's logits on the 4-bit model (1e-4)", err <= 1e-4,
              f"relative err {err:.2e}")

        out = os.path.join(tmp, "refused.sdp")
        for what, flags, words in (
                ("--quantize nf4 without an adapter method", ["--peft", "none"], ["--quantize nf4", "--peft lora"]),
                ("--quantize nf4 with OSFT", ["--peft", "osft", "--target-modules", "q_proj"], ["OSFT"]),
                ("--quantize int3", ["--peft", "lora", "--target-modules", "q_proj", "--quantize", "int3"],
                 ["--quantize takes 'nf4'"])):
            quantize = [] if "int3" in flags else ["--quantize", "nf4"]
            problems, line = clean_error_problems([sdc, "compile", onnx_path, *flags, *quantize, "-o", out], words,
                                                  [out])
            check(f"refused: {what}", not problems, "; ".join(problems) or line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_qlora")


if __name__ == "__main__":
    sys.exit(main())
