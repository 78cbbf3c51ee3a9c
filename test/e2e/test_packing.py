#!/usr/bin/env python3
"""Sequence packing against PyTorch. A plan compiled with `sdc compile
--packing` takes position_ids, and `sdrun train` fills each [batch, seq] row
with several examples (in data order, while they fit). The reference is
PyTorch running every example on its own, unpadded: if positions restart per
example and attention stays inside each, the per-step losses and the trained
weights agree. Also: the eval loss equals the padded plan's, resume is bit
for bit, and --packing refuses what it cannot pack with one-line errors. A
rotary model (tiny Llama) packs too: its fused rotary embeddings read their
angles by each token's position in its own sequence."""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import embedding_model, sh, tool_paths
from test_training import ADAM_EPS, adamw, check, clean_error, read_safetensors, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
SEQ, BATCH, STEPS, EXAMPLES = 32, 2, 12, 30


def make_examples(path):
    """Short sequences (3..20 tokens); every third has a masked prompt."""
    rng = np.random.default_rng(3)
    rows = []
    with open(path, "w") as f:
        for i in range(EXAMPLES):
            ids = rng.integers(0, 256, size=int(rng.integers(3, 21))).tolist()
            labels = [-100 if i % 3 == 0 and j < 2 else t for j, t in enumerate(ids)]
            rows.append((ids, labels))
            f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
    return rows


def first_fit_decreasing(examples):
    """The rows of BATCH x SEQ that first-fit decreasing packs `examples`
    into (longest first, ties in data order), or None if they do not fit."""
    rows, used = [], []
    for ex in sorted(examples, key=lambda e: -len(e[0])):
        r = next((i for i, u in enumerate(used) if u + len(ex[0]) <= SEQ), len(rows))
        if r == len(rows):
            if r == BATCH:
                return None
            rows.append([])
            used.append(0)
        rows[r].append(ex)
        used[r] += len(ex[0])
    return rows


def packed_steps(rows, steps):
    """The examples of each step's rows, as sdrun packs them: the longest run
    of next examples (file order) that first-fit decreasing fits in the rows."""
    cursor, out = 0, []
    for _ in range(steps):
        taken, packed = [], None
        while True:
            trial = first_fit_decreasing(taken + [rows[cursor % len(rows)]])
            if trial is None:
                break
            taken.append(rows[cursor % len(rows)])
            packed = trial
            cursor += 1
        out.append(packed)
    return out


def torch_packed_losses(model, steps, lr, wd, clip):
    """Each example alone through the model; loss = sum over the step's
    examples / tokens counted, as the SFT recipe normalizes a micro-batch."""
    import torch
    import torch.nn.functional as F
    opt = adamw(model, lr, wd)
    losses = []
    for step in steps:
        opt.zero_grad()
        examples = [ex for row in step for ex in row]
        tokens = sum(sum(1 for t in labels[1:] if t != -100) for _, labels in examples)
        total = 0.0
        for ids, labels in examples:
            logits = model(torch.tensor([ids]))
            loss_sum = F.cross_entropy(logits[0, :-1], torch.tensor(labels[1:]), ignore_index=-100, reduction="sum")
            (loss_sum / tokens).backward()
            total += float(loss_sum)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(total / tokens)
    return losses


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_models import Gpt, export_gpt
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="sd_packing_")
    try:
        torch.manual_seed(0)
        base = Gpt(d=64, layers=2, heads=4, block=SEQ)
        onnx_path = os.path.join(tmp, "gpt.onnx")
        export_gpt(base, onnx_path, torch.zeros((BATCH, SEQ), dtype=torch.long), opset=17)
        data = os.path.join(tmp, "train.jsonl")
        rows = make_examples(data)
        shapes = ["--shapes", f"input_ids={BATCH}x{SEQ}", "--adam-epsilon", str(ADAM_EPS)]
        plan, padded = os.path.join(tmp, "packed.sdp"), os.path.join(tmp, "padded.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "none", "--packing", *shapes, "-o", plan])
        sh([sdc, "compile", onnx_path, "--peft", "none", *shapes, "-o", padded])
        lr, wd, clip = 2e-3, 0.1, 1.0

        def train(plan_path, metrics, steps, extra=()):
            sh([sdrun, "train", plan_path, "--data", data, *(["--steps", str(steps)] if steps else []),
                "--no-shuffle", "--threads", "2",
                "--lr", str(lr), "--weight-decay", str(wd), "--clip-norm", str(clip), "--metrics", metrics, *extra])
            lines = [json.loads(l) for l in open(metrics)]
            return [l["loss"] for l in lines if "loss" in l], [l["eval_loss"] for l in lines if "eval_loss" in l]

        weights = os.path.join(tmp, "w.safetensors")
        ours, _ = train(plan, os.path.join(tmp, "m.jsonl"), STEPS, ["--save-weights", weights])
        steps = packed_steps(rows, STEPS)
        per_row = np.mean([len(r) for s in steps for r in s])
        model = Gpt(d=64, layers=2, heads=4, block=SEQ)
        model.load_state_dict(base.state_dict())
        ref = torch_packed_losses(model, steps, lr, wd, clip)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        check(f"packing: {STEPS} per-step losses equal PyTorch running each example alone",
              rel < 1e-4 and len(ours) == STEPS and per_row > 1.5,
              f"max rel diff {rel:.2e}, {per_row:.2f} examples per row (first {ref[0]:.4f}, last {ref[-1]:.4f})")
        got = read_safetensors(weights)
        worst = max(float(np.max(np.abs(got[n] - p.detach().numpy())) / (np.max(np.abs(p.detach().numpy())) + 1e-12))
                    for n, p in model.named_parameters())
        check("packing: trained weights equal PyTorch's", worst < 1e-4 and len(got) == len(dict(model.named_parameters())),
              f"max rel diff {worst:.2e} over {len(got)} tensors")

        # Eval packs too, and must not change the loss of the same weights.
        evals = [train(p, os.path.join(tmp, f"e{i}.jsonl"), 1, ["--lr", "0", "--eval-data", data])[1][-1]
                 for i, p in enumerate((plan, padded))]
        check("packing: eval loss equals the padded plan's", abs(evals[0] - evals[1]) / evals[1] < 1e-5,
              f"packed {evals[0]:.7f}, padded {evals[1]:.7f}")

        # Resume: the data position is an example index, packing is a function of it.
        n, ck = STEPS // 2, os.path.join(tmp, "ck")
        wa, wb = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors")
        a, _ = train(plan, os.path.join(tmp, "s.jsonl"), 2 * n, ["--save-weights", wa])
        train(plan, os.path.join(tmp, "r.jsonl"), n, ["--checkpoint-dir", ck])
        b, _ = train(plan, os.path.join(tmp, "r.jsonl"), 2 * n, ["--checkpoint-dir", ck, "--resume", "--save-weights", wb])
        ta, tb = read_safetensors(wa), read_safetensors(wb)
        same = all(np.array_equal(ta[k], tb[k]) for k in ta)
        check(f"packing resume: {2 * n} steps straight == {n} + --resume {n}, bit for bit", a == b and same,
              f"losses equal: {a == b}, weights equal: {same}")

        # --epochs counts steps by packing: one epoch takes fewer steps than padding would.
        ep, _ = train(plan, os.path.join(tmp, "ep.jsonl"), 0, ["--epochs", "1"])
        consumed, count = 0, 0
        for s in packed_steps(rows, EXAMPLES):
            if consumed >= EXAMPLES:
                break
            consumed += sum(len(r) for r in s)
            count += 1
        check("packing: --epochs 1 runs as many steps as packing one epoch takes",
              len(ep) == count < (EXAMPLES + BATCH - 1) // BATCH,
              f"{len(ep)} steps (padding would take {(EXAMPLES + BATCH - 1) // BATCH})")

        # A rotary model (tiny Llama, as torch.onnx.export writes it): the
        # rotary embeddings are fused and read their angles by position_ids.
        from export_hf import build, export
        llama = build("llama", 0)
        llama_onnx = os.path.join(tmp, "llama.onnx")
        export(llama, llama_onnx, 17, BATCH, SEQ)
        llama_plan = os.path.join(tmp, "llama.sdp")
        sh([sdc, "compile", llama_onnx, "--peft", "none", "--packing", *shapes, "-o", llama_plan])
        ir = sh([sdc, "compile", llama_onnx, "--peft", "none", "--packing", *shapes, "--emit", "mlir"])
        rotary_steps = ir.count('sd.step "Rotary"')
        check("packing a rotary model: its rotary embeddings are fused, forward and backward",
              rotary_steps == 4 * (1 + 1 + 2 + 2),
              f"{rotary_steps} Rotary steps: q and k of 2 layers, forward in infer and eval_step, forward and "
              "backward in accumulate and train_step")
        ours, _ = train(llama_plan, os.path.join(tmp, "llama.jsonl"), STEPS)

        class Logits(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, ids):
                return self.m(input_ids=ids, use_cache=False).logits

        ref = torch_packed_losses(Logits(llama), steps, lr, wd, clip)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        check(f"packing a rotary model: {STEPS} per-step losses equal transformers running each example alone",
              rel < 1e-4 and len(ours) == STEPS, f"max rel diff {rel:.2e} (first {ref[0]:.4f}, last {ref[-1]:.4f})")

        never = os.path.join(tmp, "never.sdp")
        embed = os.path.join(tmp, "embed.onnx")
        embedding_model(embed)
        clean_error("--packing on a model without attention",
                    [sdc, "compile", embed, "--peft", "none", "--packing", "--shapes", "input_ids=2x8", "-o", never],
                    ["--packing", "attention"])
        clean_error("--packing without a training plan",
                    [sdc, "compile", onnx_path, "--packing", "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", never],
                    ["--packing", "--peft"])
        check("refused --packing writes no plan", not os.path.exists(never), "")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_packing")


if __name__ == "__main__":
    sys.exit(main())
