#!/usr/bin/env python3
"""A BERT-class encoder (a tiny transformers BertModel, seeded random weights)
as each exporter users take writes it: torch.onnx.export in TorchScript mode
(opset 17), in dynamo mode (its default opset) and in dynamo mode at opset 23
with SDPA (ONNX's own Attention op, the padding mask given at run time), and Optimum's
feature-extraction export (opset 18, with token_type_ids), against PyTorch,
ONNX Runtime and PEFT:

  hidden  sdrun infer's last_hidden_state on rows padded and masked through
          attention_mask equals PyTorch and ONNX Runtime on the same file (1e-4)
  LoRA    `--recipe classify`: 20 steps of LoRA on every linear layer (query,
          key, value, dense) with a new classification head on the masked mean
          of the hidden states, from a randomly initialized PEFT adapter:
          losses, adapter and head equal PyTorch+PEFT's AdamW run (1e-4)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import ROOT, ort_run, peft_match, plan_steps, rel_err, sh, tool_paths
from test_training import check, report

BATCH, SEQ, STEPS, R, ALPHA, LABELS, LR = 4, 16, 20, 4, 8, 3, 1e-3
TARGETS = ["query", "key", "value", "dense"]
OPTIMUM_PYTHON = os.path.join(ROOT, ".venv-optimum", "bin", "python")


def config():
    import transformers
    return transformers.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)


def build_encoder():
    """The BertModel users export (no pooler: the features are the hidden states)."""
    import torch
    import transformers
    torch.manual_seed(0)
    return transformers.BertModel(config(), add_pooling_layer=False).eval()


def build_classifier(encoder, seed):
    """The encoder's weights under the same module names, with a linear head
    `classifier` on the masked mean of the hidden states (what the plan's
    --pooling mean computes)."""
    import torch
    import transformers

    class BertClassifier(transformers.BertModel):
        def __init__(self, cfg):
            super().__init__(cfg, add_pooling_layer=False)
            torch.manual_seed(seed)
            self.classifier = torch.nn.Linear(cfg.hidden_size, LABELS)

        def forward(self, input_ids, attention_mask):
            h = super().forward(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return self.classifier((h * m).sum(1) / m.sum(1).clamp(min=1e-9))

    model = BertClassifier(encoder.config)
    missing, unexpected = model.load_state_dict(encoder.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("classifier.") for k in missing), (missing, unexpected)
    return model.eval()


def export(model, path, route, d):
    import torch
    ids = torch.randint(0, 256, (BATCH, SEQ))
    mask = torch.ones_like(ids)
    if route == "torchscript":
        # The tracer passes inputs positionally and transformers' output
        # capturing adds use_cache: an instance forward takes the two inputs
        # (module names, hence PEFT's, stay the model's own).
        forward = type(model).forward
        model.forward = lambda i, m: forward(model, input_ids=i, attention_mask=m).last_hidden_state
        try:
            torch.onnx.export(model, (ids, mask), path, input_names=["input_ids", "attention_mask"],
                              output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                              dynamic_axes={n: {0: "batch", 1: "seq"} for n in
                                            ("input_ids", "attention_mask", "last_hidden_state")})
        finally:
            del model.forward
    elif route in ("dynamo", "onnx23"):
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)
        opset = {}
        if route == "onnx23":  # SDPA exports as ONNX's own Attention op
            model.set_attn_implementation("sdpa")
            opset = {"opset_version": 23}
        try:
            torch.onnx.export(model, (ids, mask), path, dynamo=True, input_names=["input_ids", "attention_mask"],
                              output_names=["last_hidden_state"],
                              dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}), **opset)
        finally:
            model.set_attn_implementation("eager")
    else:  # optimum-onnx in its own environment (it pins transformers 4.57)
        hf, out = os.path.join(d, "hf"), os.path.join(d, "optimum")
        model.save_pretrained(hf)
        subprocess.run([OPTIMUM_PYTHON, "-m", "optimum.exporters.onnx", "--model", hf, "--task", "feature-extraction",
                        out], check=True, capture_output=True)
        shutil.move(os.path.join(out, "model.onnx"), path)


def rows_and_masks(rng, n):
    """n rows of random bytes, 5..SEQ long, with their labels."""
    lengths = rng.integers(5, SEQ + 1, n)
    return [(rng.integers(0, 256, int(k)).tolist(), int(rng.integers(0, LABELS))) for k in lengths]


def padded(rows):
    ids, mask = np.zeros((len(rows), SEQ), np.int64), np.zeros((len(rows), SEQ), np.int64)
    for i, (toks, _) in enumerate(rows):
        ids[i, :len(toks)], mask[i, :len(toks)] = toks, 1
    return ids, mask, np.array([label for _, label in rows])


def check_hidden(name, encoder, onnx_path, sdc, sdrun, d, feeds):
    import torch
    plan = os.path.join(d, "infer.sdp")
    sh([sdc, "compile", onnx_path, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    cmd = [sdrun, "infer", plan, "--output-dir", os.path.join(d, "out"), "--output-format", "npy"]
    for k, v in feeds.items():
        np.save(os.path.join(d, f"{k}.npy"), v)
        cmd += ["--input", f"{k}={os.path.join(d, k)}.npy"]
    sh(cmd)
    got = np.load(os.path.join(d, "out", "output_0.npy"))
    with torch.no_grad():
        want = encoder(input_ids=torch.tensor(feeds["input_ids"]),
                       attention_mask=torch.tensor(feeds["attention_mask"])).last_hidden_state.numpy()
    ort = ort_run(onnx_path, feeds)["last_hidden_state"]
    check(f"BertModel ({name}): last_hidden_state on masked, padded rows equals PyTorch and ONNX Runtime (1e-4)",
          rel_err(got, want) <= 1e-4 and rel_err(got, ort) <= 1e-4,
          f"relative err {rel_err(got, want):.1e} vs PyTorch, {rel_err(got, ort):.1e} vs ONNX Runtime")


def check_lora(name, encoder, onnx_path, sdc, sdrun, d, rows):
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    plan = os.path.join(d, "cls.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R),
        "--lora-alpha", str(ALPHA), "--recipe", "classify", "--num-labels", str(LABELS), "--shapes",
        f"input_ids={BATCH}x{SEQ}", "-o", plan])
    # Every route's attention is one fused step per layer reading the
    # projections' layout, the padding mask included (Optimum's, built from
    # attention_mask as Where(Cast(1 - mask to bool), min, 1 - mask)); where
    # sd-fuse-projections joined query/key/value, sd-join-lora makes their
    # adapters one and the attention reads the joined projection
    # (QkvAttention).
    steps = plan_steps(sdrun, plan)
    layers = config().num_hidden_layers
    grads = steps.get("AttentionGrad", 0) + steps.get("QkvAttentionGrad", 0)
    check(f"BertModel ({name}) LoRA plan: attention fused in every entry, no Transpose or Softmax step",
          grads >= layers and not steps.get("Softmax") and not steps.get("Transpose"),
          f"{steps.get('Attention')} Attention, {steps.get('AttentionGrad')} AttentionGrad, "
          f"{steps.get('QkvAttention')} QkvAttention, {steps.get('QkvAttentionGrad')} QkvAttentionGrad, "
          f"{steps.get('Softmax')} Softmax, {steps.get('Transpose')} Transpose steps")
    data, init, trained, metrics = (os.path.join(d, n) for n in ("train.jsonl", "init", "trained", "metrics.jsonl"))
    with open(data, "w") as f:
        for toks, label in rows:
            f.write(json.dumps({"input_ids": toks, "label": label}) + "\n")
    torch.manual_seed(5)
    pm = get_peft_model(build_classifier(encoder, 9),
                        LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0,
                                   init_lora_weights=False, modules_to_save=["classifier"]))
    pm.save_pretrained(init)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=LR, eps=1e-8, weight_decay=0.0)
    want = []
    for step in range(STEPS):
        ids, mask, labels = padded([rows[(step * BATCH + i) % len(rows)] for i in range(BATCH)])
        loss = F.cross_entropy(pm(torch.tensor(ids), torch.tensor(mask)), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics,
        "--save-adapter", trained], timeout=600)
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    loss_err, weight_err, worst, problem = peft_match(pm, trained, losses, want, STEPS)
    check(f"BertModel ({name}): {STEPS} LoRA steps on query/key/value/dense with a classification head give PEFT's "
          f"losses, adapter and head (1e-4)", loss_err <= 1e-4 and weight_err <= 1e-4 and not problem,
          f"losses {losses[:2]} vs PEFT {want[:2]}, worst loss err {loss_err:.1e}, worst weight err "
          f"{weight_err:.1e} ({worst}) {problem}")


def main():
    sdc, sdrun = tool_paths()
    import torch
    torch.set_num_threads(2)
    rng = np.random.default_rng(3)
    rows = rows_and_masks(rng, 2 * BATCH + 2)  # steps cross the data's end mid-batch
    ids, mask, _ = padded(rows[:BATCH])
    tmp = tempfile.mkdtemp(prefix="sd_encoders_")
    try:
        for route in ("torchscript", "dynamo", "onnx23", "optimum"):
            try:
                d = os.path.join(tmp, route)
                os.makedirs(d)
                encoder = build_encoder()
                onnx_path = os.path.join(d, "model.onnx")
                export(encoder, onnx_path, route, d)
                feeds = {"input_ids": ids, "attention_mask": mask}
                if route == "optimum":
                    feeds["token_type_ids"] = np.zeros_like(ids)
                if route == "onnx23":
                    import onnx
                    ops = [n.op_type for n in onnx.load(onnx_path, load_external_data=False).graph.node]
                    check("BertModel (onnx23): the export holds ONNX's Attention op", "Attention" in ops,
                          f"{ops.count('Attention')} Attention")
                check_hidden(route, encoder, onnx_path, sdc, sdrun, d, feeds)
                check_lora(route, encoder, onnx_path, sdc, sdrun, d, rows)
            except Exception as e:  # one failing route must not hide the others
                check(f"BertModel ({route}) runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("encoder_routes")


if __name__ == "__main__":
    sys.exit(main())
