#!/usr/bin/env python3
"""Decoder architectures users fine-tune, as the exporters they use write
them, against PyTorch, ONNX Runtime and PEFT. For tiny Llama (grouped-query
attention), Qwen2 (q/k/v biases), Mistral (one KV head), GPT-2 (learned
positions, Conv1D), Phi-2 (partial rotary, LayerNorm, parallel attention and
MLP), Phi-3 (fused qkv_proj and gate_up_proj) and Cohere (rotary on
interleaved pairs written out with strided slices), each exported by
torch.onnx.export in TorchScript mode (opset 17), in dynamo mode (its
default opset), in dynamo mode at opset 23 with SDPA attention (ONNX's own
Attention, RotaryEmbedding and RMSNormalization ops; dynamic batch and
sequence, so the KV cache applies too), and by Optimum's exporter (opset 18,
text-generation-with-past: past_key_values inputs, present outputs), and (but
GPT-2 and Phi-3) by onnxruntime-genai's model builder (com.microsoft
GroupQueryAttention with rotary, Skip(Simplified)LayerNormalization,
SimplifiedLayerNormalization; fused qkv_proj, so no LoRA check):

  logits  sdrun infer (a whole-sequence step: a with-past file's past inputs
          empty) equals PyTorch and ONNX Runtime on the same file (1e-4;
          only PyTorch at opset 23, whose file ONNX Runtime 1.32 refuses);
          only ONNX Runtime where the file is not PyTorch's model (Phi-2 from
          Optimum and genai, Cohere from Optimum: EXPORT_DIFFERS)
  LoRA    20 steps on every linear layer PEFT targets, starting from a
          randomly initialized PEFT adapter (`sdrun train --adapter`): losses
          and the saved adapter equal PyTorch+PEFT's AdamW run (1e-4)
  decode  a --kv-cache plan's greedy text equals transformers' generate (the
          with-past export's own cache inputs bound empty: the plan's cache
          takes over)

On Optimum's files the logits are also checked with a left-padded
attention_mask against ONNX Runtime, with the attention fused over that
run-time mask (queries that see no key give zeros, as the exported guard does).

Optimum's attention_mask, position_ids and past_key_values inputs are bound
(ones, 0..seq-1, empty) in the training entries, since the data gives tokens.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import (ROOT, ort_run, peft_match, peft_steps, plan_steps, rel_err, sdrun_logits, sh, tool_paths,
                      write_token_rows)
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, STEPS, R, ALPHA = 2, 16, 20, 4, 8
# AdamW at PyTorch's default epsilon. (At lr 5e-3 these random-weight models
# train chaotically: elements whose gradient is near zero take full-size
# steps of either sign, and 20 steps amplify float noise in either
# implementation to 1e-3..1e-1 apart; the gradients themselves agree to 1e-5.)
LR, EPS = 1e-3, 1e-8
TARGETS = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "gpt2": ["c_attn", "c_proj", "c_fc"]}
TARGETS["qwen2"] = TARGETS["mistral"] = TARGETS["llama"]
TARGETS["phi"] = ["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"]
TARGETS["phi3"] = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
TARGETS["cohere"] = TARGETS["llama"]
# Routes whose file is not transformers 5.23's model: ONNX Runtime on the same
# file differs from PyTorch by 2.4e-3 (genai) and 4.2e-3 (Optimum, which runs
# transformers 4.57) relative on Phi-2, 2.1e-3 on Cohere from Optimum. There
# sdrun is checked against ONNX Runtime on that file, and LoRA (whose
# reference is PEFT on PyTorch) is left out.
EXPORT_DIFFERS = {("phi", "optimum"), ("phi", "genai"), ("cohere", "optimum")}
# onnxruntime-genai's model builder does not build these (GPT-2, Cohere), or
# builds a graph whose ONNX Runtime logits are 0.64 relative from PyTorch's
# (Phi-3 at this size).
NO_GENAI = {"gpt2", "phi3", "cohere"}
# Cohere's TorchScript export fails in ONNX Runtime too (a Mul broadcasting 8
# by 16: the tracer baked the kv-head count into q's reshape).
NO_TORCHSCRIPT = {"cohere"}
# What PyTorch's opset-23 export of SDPA models writes as ONNX ops besides
# Attention: GPT-2 has learned positions and LayerNorm, Phi-2 LayerNorm,
# Cohere rotary on interleaved pairs written out with strided slices.
OPSET23_OPS = {"gpt2": ("Attention",), "phi": ("Attention", "RotaryEmbedding"),
               "cohere": ("Attention", "RMSNormalization")}
PROMPTS = ["In the beginning God created", "And"]
OPTIMUM_PYTHON = os.path.join(ROOT, ".venv-optimum", "bin", "python")


def export(model, path, route, d):
    import torch
    if route == "torchscript":
        import export_hf
        export_hf.export(model, path, 17, BATCH, SEQ)
    elif route in ("dynamo", "onnx23"):
        forward = type(model).forward
        model.forward = lambda ids: forward(model, input_ids=ids, use_cache=False).logits
        ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
        dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=128)},)
        opset = {}
        if route == "onnx23":  # SDPA exports as ONNX's own Attention (and RMSNormalization, RotaryEmbedding)
            model.set_attn_implementation("sdpa")
            opset = {"opset_version": 23}
        try:
            torch.onnx.export(model, (ids,), path, dynamo=True, input_names=["input_ids"], output_names=["logits"],
                              dynamic_shapes=dims, **opset)
        finally:
            del model.forward
            model.set_attn_implementation("eager")
    else:  # converters of a saved transformers folder, each writing a folder of its own
        hf, out = os.path.join(d, "hf"), os.path.join(d, route)
        model.save_pretrained(hf)
        if route == "optimum":  # its own environment: optimum-onnx pins transformers 4.57
            subprocess.run([OPTIMUM_PYTHON, "-m", "optimum.exporters.onnx", "--model", hf, "--task",
                            "text-generation-with-past", out], check=True, capture_output=True)
        else:  # onnxruntime-genai's model builder: contrib ops, weights in model.onnx.data beside the model
            byte_tokenizer(hf)
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf, "-i", hf, "-o", out,
                            "-p", "fp32", "-e", "cpu"], check=True, capture_output=True)
        for name in os.listdir(out):  # the model and its external data (model.onnx.data, model.onnx_data)
            if name.startswith("model.onnx"):
                shutil.move(os.path.join(out, name), path if name == "model.onnx" else os.path.join(d, name))


def byte_tokenizer(folder):
    """A 256-token tokenizer (one per byte), which the genai builder copies."""
    import transformers
    from tokenizers import Tokenizer, models
    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(256)}, unk_token="<0>"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<0>").save_pretrained(folder)


def peft_training(model, rows, targets, fan_in_fan_out, init_dir):
    """PEFT's LoRA with random A and B (init_lora_weights=False), saved before
    training; then STEPS AdamW steps on the rows as sdrun batches them."""
    import torch
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(11)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0, init_lora_weights=False,
                     fan_in_fan_out=fan_in_fan_out, task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg)
    pm.save_pretrained(init_dir)
    # in eval mode: the plan has no dropout (LoRA dropout 0, and GPT-2's own dropouts off)
    losses = peft_steps(pm, rows, STEPS, BATCH, LR, EPS)
    return pm.eval(), losses


def greedy(model, prompt, new):
    import torch
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([list(prompt.encode())]), max_new_tokens=new, do_sample=False,
                             pad_token_id=0, eos_token_id=None)[0].tolist()
    return bytes(out)


def check_decode(name, model, onnx_path, sdc, sdrun, d):
    kv = os.path.join(d, "kv.sdp")
    sh([sdc, "compile", onnx_path, "--kv-cache", "48", "--prefill-chunk", "8", "-o", kv])
    cmd = [sdrun, "generate", kv, "--temperature", "0", "--max-new-tokens", "12", "--threads", "2"]
    for p in PROMPTS:
        cmd += ["--prompt", p]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    expect = b"".join(greedy(model, p, 12) + b"\n" for p in PROMPTS)
    check(f"{name} decode: greedy through the KV cache equals transformers' generate", r.stdout == expect,
          f"{r.stdout!r} vs {expect!r} {r.stderr.decode()[-200:]}")


def with_past_inputs(onnx_path, ids, config):
    """The inputs of a whole-sequence step with nothing cached yet, for any
    export route: the tokens, and where the model takes them a mask of ones,
    positions 0..seq-1 and empty past keys/values (Optimum's and
    onnxruntime-genai's with-past exports); and the --dim flags that size
    what the tokens do not (the past length 0, genai's total length and head
    size)."""
    import onnx
    feeds, dims = {"input_ids": ids}, {}
    head = config.hidden_size // config.num_attention_heads
    for i in onnx.load(onnx_path, load_external_data=False).graph.input:
        shape = i.type.tensor_type.shape.dim
        if i.name == "attention_mask":
            feeds[i.name] = np.ones_like(ids)
            if shape[1].dim_param and "+" not in shape[1].dim_param:
                dims[shape[1].dim_param] = ids.shape[1]
        elif i.name == "position_ids":
            feeds[i.name] = np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1))
        elif i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((ids.shape[0], shape[1].dim_value, 0, head), np.float32)
            dims[shape[2].dim_param] = 0
            if shape[3].dim_param:
                dims[shape[3].dim_param] = head
    dims.pop("sequence_length", None)  # the tokens' own axis: --shapes sizes it
    return feeds, [flag for k, v in dims.items() for flag in ("--dim", f"{k}={v}")]


def check_arch(arch, route, sdc, sdrun, tmp):
    import torch
    import export_hf
    d = os.path.join(tmp, f"{arch}_{route}")
    os.makedirs(d)
    name = f"{arch} ({route})"
    model = export_hf.build(arch, 0)
    onnx_path = os.path.join(d, "model.onnx")
    export(model, onnx_path, route, d)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    plan = os.path.join(d, "infer.sdp")
    feeds, dims = with_past_inputs(onnx_path, ids, model.config)
    sh([sdc, "compile", onnx_path, "--shapes", f"input_ids={BATCH}x{SEQ}", *dims, "-o", plan])
    got = sdrun_logits(sdrun, plan, None, feeds, d, "base")
    steps = plan_steps(sdrun, plan)
    if arch != "gpt2":  # every exporter's rotary form (rotate-half, interleaved, the ops) is one fused step
        # (one for q and k together where attention reads a joined q|k|v projection: sd-qkv-attention)
        per_layer = 1 if steps.get("QkvAttention") else 2
        check(f"{name}: the rotary embeddings are fused (one Rotary step each for q and k, or one for both)",
              steps.get("Rotary") == per_layer * model.config.num_hidden_layers,
              f"Rotary steps: {steps.get('Rotary')}, QkvAttention steps: {steps.get('QkvAttention')}")
    # GPT-2's c_attn is one q|k|v projection: its attention reads it as it is (QkvAttention, no Split).
    fused = steps.get("Attention", 0) + steps.get("QkvAttention", 0)
    check(f"{name}: the attention is fused (one Attention or QkvAttention step per layer)",
          fused == model.config.num_hidden_layers and
          (arch != "gpt2" or route == "optimum" or (steps.get("QkvAttention") and not steps.get("Split"))),
          f"Attention steps: {steps.get('Attention')}, QkvAttention steps: {steps.get('QkvAttention')}, "
          f"Split steps: {steps.get('Split')}")
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits.numpy()
    differs = (arch, route) in EXPORT_DIFFERS
    if route == "onnx23":
        import onnx
        ops = [n.op_type for n in onnx.load(onnx_path, load_external_data=False).graph.node]
        want_ops = OPSET23_OPS.get(arch, ("Attention", "RMSNormalization", "RotaryEmbedding"))
        check(f"{name}: the export holds ONNX's {', '.join(want_ops)} ops", all(o in ops for o in want_ops),
              ", ".join(f"{ops.count(o)} {o}" for o in want_ops))  # ONNX Runtime's RotaryEmbedding refuses the exporter's [1, seq, W] cos/sin caches
        check(f"{name} logits: sdrun equals PyTorch (1e-4; ONNX Runtime cannot run this file)",
              rel_err(got, want) <= 1e-4, f"relative err {rel_err(got, want):.1e} vs PyTorch")
    else:
        ort = ort_run(onnx_path, feeds)["logits"]
        check(f"{name} logits: sdrun equals " + ("ONNX Runtime on the same file (the file is not PyTorch's model)"
                                               if differs else "PyTorch and ONNX Runtime") + " (1e-4)",
              (differs or rel_err(got, want) <= 1e-4) and rel_err(got, ort) <= 1e-4,
              f"relative err {rel_err(got, want):.1e} vs PyTorch, {rel_err(got, ort):.1e} vs ONNX Runtime")

    if route == "optimum":  # a real padding mask: row 1 left-padded, so its first queries see no key at all
        padded = dict(feeds, attention_mask=np.ones_like(ids))
        padded["attention_mask"][1, :5] = 0
        got = sdrun_logits(sdrun, plan, None, padded, d, "padded")
        ort = ort_run(onnx_path, padded)["logits"]
        fused = steps.get("Attention", 0) + steps.get("QkvAttention", 0)
        check(f"{name} with a left-padded attention_mask: attention fused over the run-time mask, logits equal ONNX "
              f"Runtime's (1e-4, the padding's fully masked queries included)",
              fused == model.config.num_hidden_layers and rel_err(got, ort) <= 1e-4,
              f"Attention steps {fused}, relative err {rel_err(got, ort):.1e}")
    check_decode(name, model, onnx_path, sdc, sdrun, d)
    if route == "genai" or differs:  # genai fuses q/k/v into one qkv_proj: PEFT's names do not apply
        return

    data = os.path.join(d, "train.jsonl")
    write_token_rows(data, rng, 256, 2 * STEPS, SEQ)
    rows = [json.loads(l)["input_ids"] for l in open(data)]
    lora = os.path.join(d, "lora.sdp")
    targets = TARGETS[arch]
    sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(targets), "--lora-r", str(R),
        "--lora-alpha", str(ALPHA), "--adam-epsilon", str(EPS), "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", lora])
    # Every route's attention reads q, k and v where the projections wrote
    # them in training (a KV-cache export's empty past and position ids
    # included): the step transposes no activation.
    moved = [l.split()[0] for l in sh([sdrun, "inspect", lora, "--traffic", "train_step"]).splitlines()
             if len(l.split()) > 2 and l.split()[2] == "steps"]
    check(f"{name} LoRA train_step: no Transpose step", "Transpose" not in moved, ", ".join(moved))
    init, trained, metrics = (os.path.join(d, n) for n in ("init_adapter", "trained_adapter", "metrics.jsonl"))
    pm, want_losses = peft_training(export_hf.build(arch, 0), rows, targets, arch == "gpt2", init)
    sh([sdrun, "train", lora, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics,
        "--save-adapter", trained])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    loss_err, weight_err, worst, problem = peft_match(pm, trained, losses, want_losses, STEPS)
    check(f"{name} LoRA on {len(targets)} module kinds: {STEPS} steps from PEFT's random adapter give PEFT's losses "
          f"and adapter weights (1e-4)", loss_err <= 1e-4 and weight_err <= 1e-4 and not problem,
          f"losses {losses[:3]} vs PEFT {want_losses[:3]}, worst loss err {loss_err:.1e}, worst weight err "
          f"{weight_err:.1e} ({worst}) {problem}")


def main():
    sdc, sdrun = tool_paths()
    import torch
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_archs_")
    try:
        for arch in ("llama", "qwen2", "mistral", "gpt2", "phi", "phi3", "cohere"):
            for route in ((() if arch in NO_TORCHSCRIPT else ("torchscript",)) + ("dynamo", "onnx23", "optimum") +
                          (() if arch in NO_GENAI else ("genai",))):
                try:
                    check_arch(arch, route, sdc, sdrun, tmp)
                except Exception as e:  # one failing route must not hide the others
                    check(f"{arch} ({route}) runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("llm_archs")


if __name__ == "__main__":
    sys.exit(main())
