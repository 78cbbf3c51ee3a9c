#!/usr/bin/env python3
"""Fusions that change how a plan computes, not what: GEMM epilogues
(sd-fuse-gemm-epilogues: the tiny GPT's MLP, Linear then GELU, compiles to
LinearGelu forward and GemmDGelu backward, the GELU's gradient and its bias
gradient folded into the next layer's input-gradient GEMM) and elementwise
chains (sd-fuse-elementwise: a LoRA branch's scaling and sum, gradient sums,
in one FusedElementwise step; in a bf16 plan with the half casts around
them) and half steps (sd-half-elementwise: a bf16 Llama's SwiGLU, its
rotary embeddings, cross-entropy on the logits and their gradients run on the
bf16 values the casts around them widened and rounded).
On the CPU the fused kernels compute the same
operations in the same order as the unfused plan (`sdc compile --no-fuse
all`), so full fine-tuning (GemmDGelu with the bias gradient) and LoRA on the
attention (the MLP frozen: GemmDGelu without it), in f32 and bf16, train to
the same losses and weights bit for bit, and inference gives the same
logits. Attention on token-major operands (sd-attention-layout) is in that
set for the GPT; a Llama's grouped key/value heads get their gradients
summed in f32 and rounded once (the unfused plan rounds each query head's
share first), so its Llama runs compare within a tolerance, and the plan
runs attention without the transposes and repeated heads around it. A
norm's input gradient is added to the residual gradient by the norm's
backward step (sd-norm-grad-sum), bit for bit as by the Add. LoRA's
backward products take a power-of-two scale as their alpha
(sd-scale-into-gemm), bit for bit as the scaled copies they read before.
The GPT's attention reads its fused q|k|v projection as it is
(sd-qkv-attention), bit for bit as from the Split's copies. Sums of
matrix products (sd-accumulate-into-gemm: LoRA's base + scale * adapter,
the residual a projection joins, the input gradient's two products) are
accumulated by the GEMMs onto their C: that adds in another order, so it is
left out of the bit-for-bit comparisons and checked within rounding. So are
a bf16 plan's GEMM epilogues, whose GELU reads the unrounded product.
Hugging Face's GPT-2 export (Conv1D on flattened rows) gets the epilogues
too."""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import ROOT, export_tiny_gpt, plan_steps, sh, tool_paths

# sd-accumulate-into-gemm adds in another order, and a half plan's GEMM epilogues apply the GELU to the
# unrounded product: the bit-for-bit comparisons run without both.
KEEP_ROUNDING = ["--no-fuse", "gemm-accumulate,half-epilogues"]
NO_HALF_EPILOGUES = ["--no-fuse", "half-epilogues"]


def export_tiny_llama(folder):
    """examples/export_hf.py's tiny Llama (SwiGLU MLP), exported into folder/llama."""
    out = os.path.join(folder, "llama")
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_hf.py"), "--arch", "llama", "--out", out],
                   check=True, capture_output=True)
    return os.path.join(out, "model.onnx")


def export_tiny_hf_gpt2(folder):
    """examples/export_hf.py's tiny Hugging Face GPT-2 (Conv1D layers on flattened rows), in folder/hf-gpt2."""
    out = os.path.join(folder, "hf-gpt2")
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_hf.py"), "--arch", "gpt2", "--out", out],
                   check=True, capture_output=True)
    return os.path.join(out, "model.onnx")


def check_hf_gpt2_epilogues(check, sdc, sdrun, data, tmp):
    """Hugging Face's GPT-2 exports each Conv1D on flattened rows and reshapes
    the product back before the GELU: the epilogues still form (f32 and bf16,
    full and LoRA), and f32 full fine-tuning trains to the same losses and
    weights bit for bit as with --no-fuse gemm-epilogues."""
    model = export_tiny_hf_gpt2(tmp)
    for precision, peft in (("fp32", ["--peft", "none"]), ("bf16", ["--peft", "lora", "--target-modules", "all-linear"])):
        runs = {}
        for fused in (True, False):
            plan = os.path.join(tmp, f"hf-gpt2-{precision}-{fused}.sdp")
            sh([sdc, "compile", model, "-o", plan, "--shapes", "input_ids=4x8", "--precision", precision] + peft +
               ([] if fused else ["--no-fuse", "gemm-epilogues"]))
            steps = plan_steps(sdrun, plan)
            if fused:
                check(steps.get("LinearGelu", 0) > 0 and steps.get("GemmDGelu", 0) > 0,
                      f"HF GPT-2 {precision} {peft[1]}: {steps.get('LinearGelu', 0)} LinearGelu and "
                      f"{steps.get('GemmDGelu', 0)} GemmDGelu steps")
            runs[fused] = train_run(sdrun, plan, data, tmp, f"hf-gpt2-{precision}-{fused}", 6)
        if precision == "fp32":
            check(runs[True] == runs[False] and runs[True][0][0] != runs[True][0][-1],
                  "HF GPT-2 fp32 full: the same 6 losses and weights bit for bit with --no-fuse gemm-epilogues")


def train_run(sdrun, plan, data, tmp, tag, steps):
    """(losses, trained weights' bytes) of `steps` training steps of a plan, the data in order."""
    metrics, weights = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag + ".safetensors")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(steps), "--lr", "1e-2", "--no-shuffle", "--truncate",
        "--metrics", metrics, "--save-weights", weights])
    with open(metrics) as f, open(weights, "rb") as w:
        return [json.loads(line)["loss"] for line in f if '"loss"' in line], w.read()


def check_attention_layout(check, sdc, sdrun, llama, data, tmp):
    """The tiny Llama (grouped key/value heads, rotary) with and without
    sd-attention-layout: no Transpose or Expand step around its attention,
    and the same training within a tolerance (f32 and bf16)."""
    for precision in ("fp32", "bf16"):
        runs = {}
        for layout in (True, False):
            plan = os.path.join(tmp, f"llama-layout-{precision}-{layout}.sdp")
            flags = ["--peft", "none", "--shapes", "input_ids=4x8", "--precision", precision] + \
                ([] if layout else ["--no-fuse", "attention-layout"])
            sh([sdc, "compile", llama, "-o", plan] + flags)
            ir = sh([sdc, "compile", llama, "--emit", "mlir"] + flags)
            moved = sum(1 for line in ir.splitlines() if 'sd.step "Transpose"' in line or 'sd.step "Expand"' in line)
            token_major = sum(1 for line in ir.splitlines() if 'layout = "bshd"' in line and "sd.step \"Attention" in line)
            if layout:
                check(moved == 0 and token_major >= 3,
                      f"{precision} Llama: attention on token-major q, k, v ({token_major} steps), "
                      f"{moved} Transpose/Expand steps")
            else:
                check(moved > 0 and token_major == 0, f"{precision} Llama: --no-fuse attention-layout keeps "
                      f"the transposes ({moved} Transpose/Expand steps)")
            runs[layout] = train_run(sdrun, plan, data, tmp, f"llama-layout-{precision}-{layout}", 8)[0]
        tol = 1e-5 if precision == "fp32" else 1e-2  # bf16: within one rounding (2^-7)
        gap = max(abs(a - b) / abs(b) for a, b in zip(runs[True], runs[False]))
        check(len(runs[True]) == 8 and gap <= tol,
              f"{precision} Llama: 8 losses with and without the attention layout within {tol} (largest "
              f"relative difference {gap:.2e})")


def check_packed_swiglu(check, sdc, sdrun, llama, data, tmp):
    """LoRA on the tiny Llama's attention leaves gate/up frozen, so
    sd-fuse-projections joins them: SwiGLU reads the joined projection
    (SwiGLUPacked, no Split or Concat of its halves) and trains to the same
    losses and weights bit for bit as with --no-fuse swiglu (f32 and bf16)."""
    for precision in ("fp32", "bf16"):
        runs = {}
        for packed in (True, False):
            plan = os.path.join(tmp, f"llama-swiglu-{precision}-{packed}.sdp")
            flags = ["--peft", "lora", "--target-modules", "q_proj,v_proj", "--shapes", "input_ids=4x8",
                     "--precision", precision] + ([] if packed else ["--no-fuse", "swiglu"])
            sh([sdc, "compile", llama, "-o", plan] + flags)
            steps = plan_steps(sdrun, plan)
            if packed:
                check(steps.get("SwiGLUPacked", 0) > 0 and steps.get("SwiGLUPackedGrad", 0) > 0 and
                      "SwiGLU" not in steps, f"{precision} Llama LoRA: SwiGLU on the joined gate/up projection "
                      f"({steps.get('SwiGLUPacked', 0)} SwiGLUPacked steps, {steps.get('Split', 0)} Split steps)")
            runs[packed] = train_run(sdrun, plan, data, tmp, f"sw-{precision}-{packed}", 6)
        check(runs[True] == runs[False] and len(runs[True][0]) == 6,
              f"{precision} Llama LoRA: the same 6 losses and weights bit for bit with --no-fuse swiglu")


def check_qkv_attention(check, sdc, sdrun, model, data, tmp):
    """The tiny GPT's attention reads its fused q|k|v projection as it is
    (QkvAttention and its gradient: no Split forward, no Concat backward) and
    trains to the same losses and weights bit for bit as with --no-fuse
    qkv-attention: LoRA on qkv in f32, full fine-tuning in bf16, and LoRA
    over packed sequences (the positions reach the fused step)."""
    for name, flags in (("f32 LoRA", ["--peft", "lora", "--target-modules", "qkv,proj"]),
                        ("bf16 full", ["--peft", "none", "--precision", "bf16"]),
                        ("f32 LoRA, packed sequences", ["--peft", "lora", "--target-modules", "qkv", "--packing"])):
        runs = {}
        for fused in (True, False):
            plan = os.path.join(tmp, f"qkv-{len(flags)}-{fused}.sdp")
            sh([sdc, "compile", model, "-o", plan, "--shapes", "input_ids=4x8"] + flags +
               ([] if fused else ["--no-fuse", "qkv-attention"]))
            ir = sh([sdc, "compile", model, "--emit", "mlir", "--shapes", "input_ids=4x8"] + flags +
                    ([] if fused else ["--no-fuse", "qkv-attention"]))
            train = ir.split("@train_step")[1].split("func.func")[0]
            ops = {op: train.count(f'sd.step "{op}"') for op in ("QkvAttention", "QkvAttentionGrad", "Split", "Concat")}
            packed_rows = "--packing" not in flags or 'sd.step "QkvAttention"' not in train or \
                all("memref<4x8xi64>" in line for line in train.splitlines() if 'sd.step "QkvAttention' in line)
            # sd-attention-stats: the gradient reads the forward's y and row statistics (dy, qkv, mask,
            # positions when packed, y, lse).
            grad = next((line for line in train.splitlines() if 'sd.step "QkvAttentionGrad"' in line), "")
            takes_stats = grad.split(" ins(")[-1].split(" outs(")[0].count("memref<") == 5 + ("--packing" in flags)
            if fused:
                check(ops["QkvAttention"] == 1 and ops["QkvAttentionGrad"] == 1 and not ops["Split"] and
                      not ops["Concat"] and packed_rows and takes_stats,
                      f"GPT {name}: attention on the fused q|k|v projection, its gradient on the forward's statistics, "
                      f"no Split or Concat step ({ops})")
            else:
                check(ops["Split"] == 1 and ops["Concat"] == 1 and not ops["QkvAttention"],
                      f"GPT {name}: --no-fuse qkv-attention splits q, k and v apart ({ops})")
            runs[fused] = train_run(sdrun, plan, data, tmp, f"qkv-{len(flags)}-{fused}", 6)
        check(runs[True] == runs[False] and len(runs[True][0]) == 6,
              f"GPT {name}: the same 6 losses and weights bit for bit with --no-fuse qkv-attention")


def check_qkv_rotary(check, sdc, sdrun, llama, data, tmp):
    """The tiny Llama with LoRA on its MLP only: sd-fuse-projections joins its
    frozen q, k and v projections, and their rotated parts become one Rotary
    over the joined output (its q and k heads; the v heads pass through) and a
    QkvAttention: no Split, half the Rotary steps, the same losses and weights
    bit for bit as with --no-fuse qkv-attention (f32 and bf16)."""
    for precision in ("fp32", "bf16"):
        runs, counts = {}, {}
        for fused in (True, False):
            plan = os.path.join(tmp, f"llama-qkv-{precision}-{fused}.sdp")
            sh([sdc, "compile", llama, "-o", plan, "--shapes", "input_ids=4x8", "--peft", "lora", "--target-modules",
                "gate_proj,up_proj,down_proj", "--precision", precision] + ([] if fused else ["--no-fuse", "qkv-attention"]))
            steps = plan_steps(sdrun, plan)
            counts[fused] = {op: steps.get(op, 0) for op in ("QkvAttention", "Attention", "Rotary", "Split")}
            runs[fused] = train_run(sdrun, plan, data, tmp, f"llama-qkv-{precision}-{fused}", 6)
        check(counts[True]["QkvAttention"] > 0 and not counts[True]["Attention"] and
              2 * counts[True]["Rotary"] == counts[False]["Rotary"] and counts[True]["Split"] < counts[False]["Split"],
              f"{precision} Llama LoRA on the MLP: attention and one Rotary on the joined q|k|v projection "
              f"({counts[True]}; with --no-fuse qkv-attention {counts[False]})")
        check(runs[True] == runs[False] and len(runs[True][0]) == 6,
              f"{precision} Llama LoRA on the MLP: the same 6 losses and weights bit for bit with --no-fuse qkv-attention")


def check_joined_lora(check, sdc, sdrun, llama, data, tmp):
    """LoRA on parts of a projection that sd-fuse-projections joined (q and v:
    PEFT's default for Llama; q, k, v and o; gate and up) as one adapter on the
    whole before its Split (sd-join-lora): the attention reads the joined q|k|v
    as it is (QkvAttention) and SwiGLU the joined gate|up (SwiGLUPacked),
    no more steps, and the training of --no-fuse joined-lora within rounding
    (x's gradient is one product over the joined rank instead of one per part
    added up), f32 and bf16."""
    for targets, reads in (("q_proj,v_proj", "QkvAttention"), ("q_proj,k_proj,v_proj,o_proj", "QkvAttention"),
                           ("gate_proj,up_proj", "SwiGLUPacked")):
        for precision, rtol in (("fp32", 1e-5), ("bf16", 2e-2)):
            runs, counts, total = {}, {}, {}
            for joined in (True, False):
                tag = f"llama-join-{targets.replace(',', '-')}-{precision}-{joined}"
                plan = os.path.join(tmp, tag + ".sdp")
                sh([sdc, "compile", llama, "-o", plan, "--shapes", "input_ids=4x8", "--peft", "lora", "--target-modules",
                    targets, "--precision", precision] + KEEP_ROUNDING + ([] if joined else ["--no-fuse", "joined-lora"]))
                steps = plan_steps(sdrun, plan)
                counts[joined], total[joined] = steps.get(reads, 0), train_step_count(sdrun, plan)
                runs[joined] = train_run(sdrun, plan, data, tmp, tag, 6)
            name = f"{precision} Llama LoRA on {targets}"
            # Steps: the adapters' 2n products become two, the Split's and
            # Concat's copies go; the block-diagonal B's small Concats come.
            check(counts[True] > 0 and not counts[False] and total[True] <= total[False],
                  f"{name}: {reads} on the joined projection, train_step {total[True]} steps "
                  f"({total[False]} with --no-fuse joined-lora)")
            la, rel, same_tensors, wdiff = run_gap(runs[True], runs[False])
            check(len(la) == 6 and rel <= rtol and same_tensors and wdiff <= 10 * rtol,
                  f"{name}: 6 losses within {rtol:g} of --no-fuse joined-lora's (max relative diff {rel:.2g}), "
                  f"the same adapter tensors, weights within {wdiff:.2g}")


def run_gap(ours, theirs):
    """Two train_run results: our losses, the largest relative loss difference,
    whether both saved the same tensors, and the largest weight difference."""
    from safetensors.numpy import load
    (la, wa), (lb, wb) = ours, theirs
    rel = max(abs(a - b) / abs(b) for a, b in zip(la, lb))
    ta, tb = load(wa), load(wb)
    wdiff = max(float(np.abs(ta[k].astype(np.float64) - tb[k].astype(np.float64)).max()) for k in tb)
    return la, rel, set(ta) == set(tb), wdiff


def train_step_count(sdrun, plan):
    """How many steps train_step runs, as `sdrun inspect` counts them."""
    line = next(l for l in sh([sdrun, "inspect", plan]).splitlines() if l.strip().startswith("train_step"))
    return int(line.split(": ")[1].split(" steps")[0])


def train_step_traffic(sdrun, plan):
    """Bytes train_step's steps read and write, as `sdrun inspect` counts them."""
    line = next(l for l in sh([sdrun, "inspect", plan]).splitlines() if l.strip().startswith("train_step"))
    read, write = line.split("steps read ")[1].split(" bytes")[0].split(" and write ")
    return int(read) + int(write)


def traffic_by_op(sdrun, plan):
    """`sdrun inspect --traffic train_step`: (train_step's steps and MB, [(op, steps, MB read + written)])."""
    out = sh([sdrun, "inspect", plan, "--traffic", "train_step"])
    entry = next(l for l in out.splitlines() if l.strip().startswith("train_step"))
    table = out.split("traffic of train_step by op")[1].splitlines()
    total = float(table[0].split("share of ")[1].split(" MB")[0])
    rows = []
    for line in table[1:]:
        if not line.startswith("  ") or " steps " not in line:
            break
        op, steps, rest = line.split()[0], int(line.split()[1]), line.split(" steps ")[1].split()
        rows.append((op, steps, float(rest[0]) + float(rest[2])))
    small = int(out.split("cost more than their bytes): ")[1].split(":")[0].split()[0])
    return int(entry.split(": ")[1].split(" steps")[0]), total, rows, small


MEMREF_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i64": 8, "i32": 4, "i8": 1, "i1": 1}


def small_steps(ir, entry):
    """Steps of `entry` in `sdc --emit mlir` whose operands and results (each once) add up to under 1 MB."""
    body = ir.split(f"func.func @{entry}(")[1].split("func.func @")[0]
    small = 0
    for line in body.splitlines():
        if "sd.step " not in line:
            continue
        total = 0
        for dims, t in re.findall(r"memref<((?:\d+x)*)([a-z]+\d+)", line):
            total += int(np.prod([int(d) for d in dims.split("x") if d])) * MEMREF_BYTES[t]
        small += total < 1000000
    return small


def norm_grad_sums(ir):
    """(steps with an accumulate operand, steps reading dy as several summands, steps writing a half copy of dx,
    steps not computing their parameters' gradients) among the norm gradient steps of a plan's train_step
    (sd-norm-grad-sum; the last sd-autodiff's, for frozen norms)."""
    body = ir.split('sd.entry = "train_step"')[1].split("func.func")[0]
    accumulating = summing = narrowing = frozen = 0
    for line in body.splitlines():
        if 'sd.step "LayerNormalizationGrad"' in line or 'sd.step "RMSNormalizationGrad"' in line:
            types = line.split("ins(")[1].split(" : ")[1].split(")")[0].split(", ")
            accumulating += len(types) > 3 and types[3] != "none"
            summing += len(types) > 4
            narrowing += "narrow_type" in line
            frozen += "param_grads = 0" in line
    return accumulating, summing, narrowing, frozen


def fused_programs(ir):
    """(opcodes, output type) of each FusedElementwise step of a compiled plan's IR."""
    found = []
    for line in ir.splitlines():
        if 'sd.step "FusedElementwise"' in line:
            code = [int(x) for x in line.split("program = array<i64: ")[1].split(">")[0].split(", ")]
            found.append((code[0::3], line.rsplit(": ", 1)[1].rstrip(")")))
    return found


def gemm_alphas(sdc, model, flags):
    """The alpha of each Gemm step in the compiled plan that has one."""
    ir = sh([sdc, "compile", model, "--emit", "mlir", *flags])
    return [line.split("alpha = ")[1].split(" : f32")[0] for line in ir.splitlines()
            if 'sd.step "Gemm"' in line and "alpha = " in line]


def check_gemm_scale(check, sdc, sdrun, model, data, tmp):
    """LoRA's scale (lora_alpha / r = 4) in the backward: lora_B's products
    take it as their alpha (sd-scale-into-gemm) instead of reading a scaled,
    rounded copy of the gradient, so the plan has fewer steps and trains to
    the same losses and weights bit for bit as with --no-fuse gemm-scale (f32
    and bf16, LoRA on every linear layer, the MLP's GELU gradient included).
    A scale that is not a power of two (1.5) keeps its copy."""
    lora = ["--peft", "lora", "--target-modules", "qkv,proj,fc1,fc2", "--lora-r", "8", "--shapes", "input_ids=4x8"]
    for precision in ("fp32", "bf16"):
        runs, counts = {}, {}
        for scaled in (True, False):
            flags = lora + ["--lora-alpha", "32", "--precision", precision] + KEEP_ROUNDING + ([] if scaled else
                                                                                          ["--no-fuse", "gemm-scale"])
            plan = os.path.join(tmp, f"gpt-scale-{precision}-{scaled}.sdp")
            sh([sdc, "compile", model, "-o", plan] + flags)
            counts[scaled] = sum(plan_steps(sdrun, plan).values())
            alphas = gemm_alphas(sdc, model, flags)
            # Two LoRA layers per block (lora_B's input and weight gradients) in each of 4 modules, 2 blocks.
            check(len(alphas) == 16 and set(alphas) == {"4.000000e+00"} if scaled else not alphas,
                  f"{precision} GPT LoRA, scale 4: {len(alphas)} Gemm steps with alpha {sorted(set(alphas))}"
                  + ("" if scaled else " with --no-fuse gemm-scale"))
            runs[scaled] = train_run(sdrun, plan, data, tmp, f"gs-{precision}-{scaled}", 6)
        check(counts[True] < counts[False],
              f"{precision} GPT LoRA: steps in the plan (all entries) {counts[False]} -> {counts[True]}")
        check(runs[True] == runs[False] and len(runs[True][0]) == 6 and runs[True][0][0] != runs[True][0][-1],
              f"{precision} GPT LoRA, scale 4: the same 6 losses and weights bit for bit with --no-fuse gemm-scale")
    odd = gemm_alphas(sdc, model, lora + ["--lora-alpha", "12", "--precision", "bf16"] + KEEP_ROUNDING)
    check(not odd, f"bf16 GPT LoRA, scale 1.5: no Gemm takes it as alpha ({odd})")


def check_gemm_accumulate(check, sdc, sdrun, model, data, tmp):
    """Sums of matrix products computed by the GEMMs (sd-accumulate-into-gemm):
    the GPT with LoRA on every linear layer (base + 2 * adapter, with the
    residual where proj and fc2 join it) and fully fine-tuned (the residual
    a projection joins; the input gradients' products), f32; and LoRA in
    bf16, where autocast's f32 sums of the widened bf16 products become
    bf16 GEMM sums (q|k|v's, and fc1's before the GELU). The plan runs
    LinearAdd and Gemm steps with a C, moves fewer bytes, and trains within
    rounding of --no-fuse gemm-accumulate (the additions in another order;
    bf16: within a bf16 rounding). SGD: AdamW's normalized step would turn a
    rounding-level difference in a near-zero gradient (whose sign can flip)
    into a whole learning-rate step, which says nothing about the sums."""
    for peft, precision, rtol, wtol in (("lora", "fp32", 1e-5, 1e-5), ("none", "fp32", 1e-5, 1e-5),
                                        ("lora", "bf16", 1e-2, 1e-3)):
        flags = ["--peft", peft, "--shapes", "input_ids=4x8", "--optimizer", "sgd", "--precision", precision] + (
            ["--target-modules", "qkv,proj,fc1,fc2", "--lora-r", "8", "--lora-alpha", "16"] if peft == "lora" else [])
        runs, steps, traffic = {}, {}, {}
        for summed in (True, False):
            plan = os.path.join(tmp, f"gpt-acc-{peft}-{precision}-{summed}.sdp")
            sh([sdc, "compile", model, "-o", plan] + flags + (NO_HALF_EPILOGUES if summed else KEEP_ROUNDING))
            steps[summed], traffic[summed] = plan_steps(sdrun, plan), train_step_traffic(sdrun, plan)
            runs[summed] = train_run(sdrun, plan, data, tmp, f"acc-{peft}-{precision}-{summed}", 6)
        ir = sh([sdc, "compile", model, "--emit", "mlir"] + flags + NO_HALF_EPILOGUES)
        with_c = [l for l in ir.splitlines() if 'sd.step "Gemm"' in l and "beta = 1.000000e+00" in l]
        name = f"{precision} GPT {peft}"
        check(steps[True].get("LinearAdd", 0) > 0 and (with_c or precision == "bf16") and
              "LinearAdd" not in steps[False] and traffic[True] < traffic[False],
              f"{name}: {steps[True].get('LinearAdd', 0)} LinearAdd steps, {len(with_c)} Gemm steps with "
              f"a C; train_step moves {traffic[True]} bytes ({traffic[False]} with --no-fuse gemm-accumulate)")
        la, rel, same_tensors, wdiff = run_gap(runs[True], runs[False])
        check(len(la) == 6 and la[0] != la[-1] and rel <= rtol and same_tensors and wdiff <= wtol,
              f"{name}, SGD: 6 losses within {rtol:g} of --no-fuse gemm-accumulate's (max relative diff {rel:.2g}), "
              f"weights within {wdiff:.2g}")


def check_half_epilogues(check, sdc, sdrun, model, data, tmp):
    """bf16 GEMM epilogues (sd-fuse-gemm-epilogues on autocast's
    Cast16(Gelu(Cast32(product))) and its gradient): the GPT with LoRA on
    every linear layer (fc1's LinearAdd becomes a LinearGelu with an addend,
    and fc2's input-gradient Gemm with a C a GemmDGelu with a c) and fully
    fine-tuned (GemmDGelu with the bias gradient) runs bf16 LinearGelu and
    GemmDGelu steps, moves fewer bytes, and trains within a bf16 rounding of
    --no-fuse half-epilogues (the GELU now reads the f32 accumulator). SGD,
    as in check_gemm_accumulate."""
    for peft in ("lora", "none"):
        flags = ["--peft", peft, "--shapes", "input_ids=4x8", "--optimizer", "sgd", "--precision", "bf16"] + (
            ["--target-modules", "qkv,proj,fc1,fc2", "--lora-r", "8", "--lora-alpha", "16"] if peft == "lora" else [])
        runs, steps, traffic = {}, {}, {}
        for fused in (True, False):
            plan = os.path.join(tmp, f"gpt-half-epi-{peft}-{fused}.sdp")
            sh([sdc, "compile", model, "-o", plan] + flags + ([] if fused else NO_HALF_EPILOGUES))
            steps[fused], traffic[fused] = plan_steps(sdrun, plan), train_step_traffic(sdrun, plan)
            runs[fused] = train_run(sdrun, plan, data, tmp, f"half-epi-{peft}-{fused}", 6)
        ir = sh([sdc, "compile", model, "--emit", "mlir"] + flags).splitlines()
        fused_lines = [l for l in ir if 'sd.step "LinearGelu"' in l or 'sd.step "GemmDGelu"' in l]
        # The operand types between " : " and ") outs(": a trailing none is an absent addend / c.
        accumulating = [l for l in fused_lines if not l.split(" outs(")[0].rstrip(") ").endswith("none")]
        name = f"bf16 GPT {peft}"
        check(len(fused_lines) >= 4 and all("xbf16>" in l.split(" outs(")[1] for l in fused_lines) and
              (len(accumulating) >= 2 if peft == "lora" else True) and
              not any(op in steps[False] for op in ("LinearGelu", "GemmDGelu")) and traffic[True] < traffic[False],
              f"{name}: {len(fused_lines)} bf16 LinearGelu/GemmDGelu steps ({len(accumulating)} with an addend or c); "
              f"train_step moves {traffic[True]} bytes ({traffic[False]} with --no-fuse half-epilogues)")
        la, rel, same_tensors, wdiff = run_gap(runs[True], runs[False])
        check(len(la) == 6 and la[0] != la[-1] and rel <= 1e-2 and same_tensors and wdiff <= 1e-3,
              f"{name}, SGD: 6 losses within 1e-2 of --no-fuse half-epilogues' (max relative diff {rel:.2g}), "
              f"weights within {wdiff:.2g}")


def half_steps(sdc, model, flags):
    """{op: steps} of the compiled plan's SwiGLU(Grad) steps on bf16 operands only,
    cross-entropy (and gradient) steps on bf16 logits, rotary on bf16 x, RMSNorm
    rounding its result to bf16 and its gradient reading a bf16 dy."""
    ir = sh([sdc, "compile", model, "--emit", "mlir", *flags])
    counts = {}
    for line in ir.splitlines():
        op = line.split('sd.step "')[1].split('"')[0] if 'sd.step "' in line else ""
        operands = line.split(" ins(")[1].split(" outs(")[0] if op else ""
        if (op.startswith("SwiGLU") and "xf32>" not in line) or \
                (op.startswith("SoftmaxCrossEntropyLoss") and "xbf16>" in operands) or \
                (op == "Rotary" and operands.split(" : ")[-1].split(",")[0].endswith("xbf16>")) or \
                (op == "RMSNormalization" and "out_type = 16" in line) or \
                (op == "RMSNormalizationGrad" and operands.split(" : ")[-1].split(",")[0].endswith("xbf16>")):
            counts[op] = counts.get(op, 0) + 1
    return counts


def main():
    sdc, sdrun = tool_paths()
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        model = export_tiny_gpt(tmp)
        data = os.path.join(tmp, "train.jsonl")
        rng = np.random.default_rng(3)
        with open(data, "w") as f:
            for _ in range(24):
                f.write(json.dumps({"input_ids": rng.integers(0, 256, size=int(rng.integers(4, 9))).tolist()}) + "\n")
        llama = export_tiny_llama(tmp)
        # bf16 full fine-tuning of the GPT: its GELU and the GELU's gradient both read the bf16 product
        # (a widening several chains take in, each for itself).
        # bf16 LoRA on the MLP too: the GELU and its gradient each compute LoRA's sum again from the two bf16
        # products (no f32 sum written for the backward).
        for peft, precision, arch, targets in (("none", "fp32", "gpt", ""), ("lora", "fp32", "gpt", "qkv,proj"),
                                               ("lora", "bf16", "gpt", "qkv,proj"), ("none", "bf16", "gpt", ""),
                                               ("lora", "bf16", "gpt", "qkv,proj,fc1,fc2"),
                                               ("none", "bf16", "llama", "")):
            runs, traffic = {}, {}
            for fused in (True, False):
                tag = f"{arch}-{peft}-{precision}-{targets.count(',')}-{'fused' if fused else 'plain'}"
                plan = os.path.join(tmp, tag + ".sdp")
                # The Llama's bit-for-bit comparison keeps the attention layout (checked apart, below).
                plain = ("gemm-epilogues,elementwise,casts,half-steps,norm-grad-sum,grouped-updates,grouped-casts"
                         if arch == "llama" else "all")
                flags = ["--peft", peft, "--shapes", "input_ids=4x8", "--precision", precision] + \
                    (["--target-modules", targets] if peft == "lora" else []) + ([] if fused else ["--no-fuse", plain]) + \
                    KEEP_ROUNDING
                sh([sdc, "compile", llama if arch == "llama" else model, "-o", plan] + flags)
                steps = plan_steps(sdrun, plan)
                # An autocast plan's GELU runs in f32 on a cast of the half product: not an epilogue (yet).
                fused_ops = ("FusedElementwise",) if precision == "bf16" else ("LinearGelu", "GemmDGelu",
                                                                                 "FusedElementwise")
                if arch == "llama":
                    halves = half_steps(sdc, llama, flags)
                    ops = ("SwiGLU", "SwiGLUGrad", "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad", "Rotary",
                           "RMSNormalization", "RMSNormalizationGrad")
                    check(all(halves.get(op, 0) >= 2 for op in ops) if fused else not halves,
                          f"bf16 Llama: SwiGLU, rotary, cross-entropy, RMSNorm and their gradients on the bf16 values "
                          f"({halves})"
                          if fused else f"bf16 Llama: none on bf16 values with --no-fuse all ({halves})")
                    if fused:
                        # (sd-norm-grad-sum's norm gradients read the bf16 gradients they sum as they are too.)
                        kept = half_steps(sdc, llama, flags + ["--no-fuse", "half-steps,norm-grad-sum"])
                        check(not kept, "bf16 Llama: none on bf16 values with --no-fuse half-steps,norm-grad-sum "
                              f"({kept})")
                elif fused and "fc1" in targets:
                    programs = fused_programs(sh([sdc, "compile", model, "--emit", "mlir"] + flags))
                    width = 4 * 32  # export_tiny_gpt's d_model is 32; its MLP 4 times as wide
                    sums = [out for _, out in programs if out == f"memref<4x8x{width}xf32>"]  # activations, not grads
                    # GELU's gradient (opcode 11 or 12) after LoRA's scale and sum (Mul 2, Add 0).
                    recomputed = [ops for ops, _ in programs if ops[-1] in (11, 12) and ops[:2] == [2, 0]]
                    check(not sums and len(recomputed) >= 2,
                          f"bf16 GPT LoRA on the MLP: no fused step writes an f32 [4, 8, {width}] activation ({sums}); "
                          f"{len(recomputed)} GELU-gradient steps compute LoRA's sum themselves")
                elif fused and precision == "bf16":
                    check(steps.get("FusedElementwise", 0) >= 20,
                          f"bf16 {peft}: chains with their half casts fused ({steps.get('FusedElementwise', 0)} steps, "
                          f"{steps.get('Cast', 0)} Cast steps left)")
                elif fused:
                    check(all(steps.get(op, 0) > 0 for op in fused_ops) and "Gelu" not in steps and
                          "GeluGrad" not in steps,
                          f"{precision} {peft}: the fused plan runs {', '.join(fused_ops)}, no Gelu or GeluGrad step "
                          f"({steps})")
                else:
                    check(not any(op in steps for op in fused_ops) and steps.get("Gelu", 0) > 0,
                          f"{precision} {peft}: --no-fuse all keeps Linear, Gelu, GeluGrad, Add and Mul")
                # sd-group-updates: one GroupedAdamW per optimizer entry (apply, train_step), no AdamW left.
                check(steps.get("GroupedAdamW") == 2 and "AdamW" not in steps if fused else
                      "GroupedAdamW" not in steps and steps.get("AdamW", 0) > 2,
                      f"{arch} {peft} {precision}: {steps.get('GroupedAdamW', 0)} GroupedAdamW and "
                      f"{steps.get('AdamW', 0)} AdamW steps" + ("" if fused else " with --no-fuse"))
                # sd-group-weight-casts: bf16 copies of the small weights (LoRA's factors, biases) made in one
                # step per entry that reads them.
                check(steps.get("GroupedCast", 0) >= 3 if fused and precision == "bf16" else "GroupedCast" not in steps,
                      f"{arch} {peft} {precision}: {steps.get('GroupedCast', 0)} GroupedCast steps, "
                      f"{steps.get('Cast', 0)} Cast steps" + ("" if fused else " with --no-fuse"))
                summed, summing, narrowing, frozen = norm_grad_sums(sh([sdc, "compile", llama if arch == "llama" else model, "--emit",
                                                     "mlir"] + flags))
                # One block: LoRA needs no input gradient of the first norm (the embedding is frozen).
                check(summed >= (1 if peft == "lora" else 2) if fused else summed == 0,
                      f"{arch} {peft} {precision}: {summed} norm gradient steps add the residual gradient themselves"
                      + ("" if fused else " with --no-fuse"))
                # A normalized value several products read (LoRA's base and adapter; the Llama's q, k and v):
                # its norm's gradient reads the products' input gradients as they are, summing them itself.
                # (The tiny GPT has one block: only LoRA on fc1 makes a norm gradient, LN2's, sum its dy.)
                several = "fc1" in targets or arch == "llama"
                check(summing >= 1 if fused and several else summing == 0,
                      f"{arch} {peft} {precision}: {summing} norm gradient steps sum their dy themselves"
                      + ("" if fused else " with --no-fuse"))
                # bf16: the residual stream's gradient, narrowed for the products before the norm, written in
                # bf16 by the norm gradient too (no Cast reading it back).
                # LoRA freezes the norms: their gradients compute dx only (no column pass over dy and x).
                check(frozen >= 1 if peft == "lora" else frozen == 0,
                      f"{arch} {peft} {precision}: {frozen} norm gradient steps leave the norm's parameter gradients unwritten")
                check(narrowing >= 1 if fused and precision == "bf16" else narrowing == 0,
                      f"{arch} {peft} {precision}: {narrowing} norm gradient steps write a bf16 copy of dx"
                      + ("" if fused else " with --no-fuse"))
                traffic[fused] = train_step_traffic(sdrun, plan)
                if fused and arch == "llama":
                    steps_total, mb, rows, small = traffic_by_op(sdrun, plan)
                    want = small_steps(sh([sdc, "compile", llama, "--emit", "mlir"] + flags), "train_step")
                    check(small == want and 0 < small < steps_total,
                          f"inspect --traffic: {small} of {steps_total} steps under 1 MB (the IR's operand types: {want})")
                    # (MB to 3 decimals: each row's read and written rounded apart.)
                    check(sum(r[1] for r in rows) == steps_total and
                          abs(sum(r[2] for r in rows) - mb) < 0.001 * len(rows) and abs(mb - traffic[fused] / 1e6) < 0.001 and
                          all(a[2] >= b[2] - 0.002 for a, b in zip(rows, rows[1:])),
                          f"inspect --traffic train_step: {len(rows)} ops, largest first ({rows[0][0]}), add up to "
                          f"its {steps_total} steps and {mb} MB")
                runs[fused] = train_run(sdrun, plan, data, tmp, tag, 8)
            check(traffic[True] < traffic[False], f"{arch} {peft} {precision} on {targets or 'all weights'}: "
                  f"train_step's steps read and write {traffic[True]} bytes, {traffic[False]} without the fusions")
            name = f"{precision} {peft}" + (" Llama" if arch == "llama" else "") + (f" on {targets}" if targets else "")
            check(len(runs[True][0]) == 8 and runs[True][0] == runs[False][0],
                  f"{name}: 8 losses equal with and without the fusions ({runs[True][0][-1]:.6f})")
            check(runs[True][1] == runs[False][1], f"{name}: trained weights equal bit for bit")
            check(runs[True][0][0] != runs[True][0][-1], f"{name}: training moved the loss")
        check_attention_layout(check, sdc, sdrun, llama, data, tmp)
        check_packed_swiglu(check, sdc, sdrun, llama, data, tmp)
        check_qkv_attention(check, sdc, sdrun, model, data, tmp)
        check_qkv_rotary(check, sdc, sdrun, llama, data, tmp)
        check_joined_lora(check, sdc, sdrun, llama, data, tmp)
        check_gemm_scale(check, sdc, sdrun, model, data, tmp)
        check_gemm_accumulate(check, sdc, sdrun, model, data, tmp)
        check_half_epilogues(check, sdc, sdrun, model, data, tmp)
        check_hf_gpt2_epilogues(check, sdc, sdrun, data, tmp)
        # Inference: the infer entry's fused steps (LinearGelu keeps no product) give the unfused logits.
        ids = os.path.join(tmp, "ids.npy")
        np.save(ids, rng.integers(0, 256, size=(1, 8)).astype(np.int64))
        logits = {}
        for fused in (True, False):
            plan = os.path.join(tmp, f"infer-{fused}.sdp")
            sh([sdc, "compile", model, "--shapes", "input_ids=1x8", "-o", plan] +
               ([] if fused else ["--no-fuse", "all"]) + KEEP_ROUNDING)
            out = os.path.join(tmp, f"out-{fused}")
            sh([sdrun, "infer", plan, "--input", f"input_ids={ids}", "--output-dir", out, "--output-format", "npy"])
            logits[fused] = np.load(os.path.join(out, "output_0.npy"))
        check(plan_steps(sdrun, os.path.join(tmp, "infer-True.sdp")).get("LinearGelu", 0) > 0,
              "inference plan runs LinearGelu")
        check(np.array_equal(logits[True], logits[False]), "inference logits equal bit for bit")
    print(f"fusion: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
