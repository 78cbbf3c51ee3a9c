#!/usr/bin/env python3
"""Training against PyTorch: the same GPT-style model (examples/export_models.py),
the same batches and the same AdamW settings, trained by `sdrun train` on a
plan from `sdc compile --peft none` and by PyTorch. Per-step losses and
the final weights must agree. Covers full fine-tuning with weight decay and
clipping, gradient accumulation, and resume after a stop (bit-identical)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import clean_error_problems, ort_run, report_checks, sh, tool_paths

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
RESULTS = []
SEQ, BATCH, STEPS = 16, 2, 20
# Some gradients are zero in exact arithmetic (the attention key bias: softmax
# ignores a per-row constant) and rounding noise (~1e-9) in float32. With
# PyTorch's eps=1e-8 Adam turns that noise into full-size steps that differ
# between any two implementations; eps=1e-6 keeps the comparison about the math.
ADAM_EPS = 1e-6


def check(name, ok, detail):
    RESULTS.append((name, bool(ok), detail))


def report(test):
    """Prints every check; the exit status: 1 if any failed or none ran."""
    return report_checks(test, RESULTS)


def clean_error(name, cmd, must_contain=()):
    problems, line = clean_error_problems(cmd, must_contain, timeout=120)
    check(name, not problems, "; ".join(problems) or line)


def bad_input(sdc, sdrun, onnx_path, plan, tmp):
    def data(name, lines):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path
    good = json.dumps({"input_ids": [1, 2, 3, 4]})
    train = [sdrun, "train", plan, "--steps", "2", "--data"]
    clean_error("malformed JSON line", train + [data("bad_json.jsonl", [good, '{"input_ids": [1, 2,'])],
                ["bad_json.jsonl:2"])
    clean_error("token id >= vocab", train + [data("bad_id.jsonl", [good, good, json.dumps({"input_ids": [1, 300]})])],
                ["bad_id.jsonl:3", "300", "vocabulary"])
    clean_error("sequence longer than the largest bucket",
                train + [data("long.jsonl", [json.dumps({"input_ids": list(range(SEQ + 5))})])],
                ["long.jsonl:1", "--truncate"])
    clean_error("labels of the wrong length",
                train + [data("bad_labels.jsonl", [json.dumps({"input_ids": [1, 2, 3], "labels": [1, 2]})])],
                ["bad_labels.jsonl:1", "labels"])
    clean_error("missing data file", train + [os.path.join(tmp, "nope.jsonl")], ["nope.jsonl"])
    clean_error("--resume without a checkpoint",
                train + [data("ok.jsonl", [good]), "--checkpoint-dir", os.path.join(tmp, "empty_ck"), "--resume"],
                ["no valid checkpoint"])
    clean_error("--trainable matching nothing",
                [sdc, "compile", onnx_path, "--trainable", "nothing\\.here", "--shapes", f"input_ids={BATCH}x{SEQ}",
                 "-o", os.path.join(tmp, "never.sdp")], ["matches no floating-point weight"])
    check("--trainable matching nothing writes no plan", not os.path.exists(os.path.join(tmp, "never.sdp")), "")
    # A diverging run (absurd learning rate) stops at the first non-finite loss
    # and keeps the last good checkpoint.
    ck = os.path.join(tmp, "nan_ck")
    rows = [json.dumps({"input_ids": list(range(i, i + SEQ))}) for i in range(8)]
    r = subprocess.run([sdrun, "train", plan, "--data", data("nan.jsonl", rows), "--steps", "50", "--lr", "1000", "--weight-decay", "1000",
                        "--checkpoint-dir", ck, "--checkpoint-every", "1"], capture_output=True, text=True)
    kept = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
    stopped = r.returncode == 1 and "loss is" in r.stderr and "stopped" in r.stderr
    check("non-finite loss stops the run, keeps the last good checkpoint", stopped and kept,
          f"exit {r.returncode}, checkpoints {kept}, {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")


def crash_safety(sdrun, plan, data, tmp, rounds=8):
    """SIGKILL during checkpoint writes, repeatedly: --resume always finds a valid one."""
    import random
    import signal
    import time
    ck = os.path.join(tmp, "crash_ck")
    rng = random.Random(5)
    failures, resumed = [], []
    for i in range(rounds):
        p = subprocess.Popen([sdrun, "train", plan, "--data", data, "--steps", "100000", "--checkpoint-dir", ck,
                              "--checkpoint-every", "1", "--threads", "1"] + (["--resume"] if i else []),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.2 + rng.random() * 0.4)
        p.send_signal(signal.SIGKILL)
        p.wait()
        names = [n for n in os.listdir(ck) if n.startswith("checkpoint-")] if os.path.isdir(ck) else []
        if not names:
            failures.append(f"round {i}: no checkpoint")
            continue
        newest = max(int(n.split("-")[1]) for n in names)
        r = subprocess.run([sdrun, "train", plan, "--data", data, "--steps", str(newest + 1), "--checkpoint-dir", ck,
                            "--resume", "--threads", "1"], capture_output=True, text=True)
        if r.returncode != 0 or "skipped" in r.stderr:
            failures.append(f"round {i}: resume exit {r.returncode}: {r.stderr.strip()[-200:]}")
        resumed.append(newest)
    check(f"crash safety: {rounds} SIGKILLs during checkpointing, each time --resume finds a valid checkpoint",
          not failures, "; ".join(failures) or f"resumed at steps {resumed}")


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype={"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                                                          "U8": np.uint8}[v["dtype"]]).reshape(v["shape"])
    return out


def make_data(path, count, seed):
    rng = np.random.default_rng(seed)
    rows = []
    with open(path, "w") as f:
        for _ in range(count):
            ids = rng.integers(0, 256, size=int(rng.integers(6, SEQ + 1))).tolist()
            rows.append(ids)
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return rows


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for k, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def add_lora(model, targets, r, alpha, init, dropout=None):
    """Manual LoRA as PEFT computes it: base(x) + B(A(dropout(x))) * alpha / r,
    base frozen. dropout(x, layer) is applied to the adapter input when given."""
    import torch
    import torch.nn as nn

    class LoraLinear(nn.Module):
        def __init__(self, base, a, b):
            super().__init__()
            self.base = base
            self.lora_A = nn.Parameter(torch.tensor(a))
            self.lora_B = nn.Parameter(torch.tensor(b))

        def forward(self, x):
            xd = dropout(x, self) if dropout else x
            return self.base(x) + (xd @ self.lora_A.t()) @ self.lora_B.t() * (alpha / r)

    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in list(model.named_modules()):
        for child, sub in list(mod.named_children()):
            full = f"{name}.{child}" if name else child
            if isinstance(sub, nn.Linear) and any(full == t or full.endswith("." + t) for t in targets):
                setattr(mod, child, LoraLinear(sub, init[full][0], init[full][1]))
    return model


def export_base(tmp):
    """The small GPT both training tests start from, and its ONNX export."""
    import torch
    from export_models import Gpt, export_gpt
    torch.manual_seed(0)
    base = Gpt(d=64, layers=2, heads=4, block=SEQ)
    onnx_path = os.path.join(tmp, "gpt.onnx")
    export_gpt(base, onnx_path, torch.zeros((BATCH, SEQ), dtype=torch.long), opset=17)
    return base, onnx_path


def write_initial_adapter(base, targets, r, alpha, path, dropout=0.0):
    """A PEFT-layout adapter with random non-zero A and B on the matched
    linears of `base`, written to folder `path`; returns {module: (A, B)}."""
    import torch
    rng = np.random.default_rng(7)
    init, tensors = {}, {}
    for name, mod in base.named_modules():
        if isinstance(mod, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            a = (rng.standard_normal((r, mod.in_features)) * 0.2).astype(np.float32)
            b = (rng.standard_normal((mod.out_features, r)) * 0.2).astype(np.float32)
            init[name] = (a, b)
            tensors[f"base_model.model.{name}.lora_A.weight"] = a
            tensors[f"base_model.model.{name}.lora_B.weight"] = b
    os.makedirs(path)
    write_safetensors(os.path.join(path, "adapter_model.safetensors"), tensors)
    json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets, "lora_dropout": dropout,
               "bias": "none", "use_rslora": False}, open(os.path.join(path, "adapter_config.json"), "w"))
    return init


def adapter_diff(model, adapter_dir):
    """(max relative difference between the saved adapter and the model's
    trainable LoRA parameters, whether every one had its PEFT key, tensors saved)."""
    got = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    worst, keys_ok, count = 0.0, True, 0
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        count += 1
        key = "base_model.model." + name.replace(".lora_A", ".lora_A.weight").replace(".lora_B", ".lora_B.weight")
        if key not in got:
            keys_ok = False
            continue
        want = p.detach().numpy()
        worst = max(worst, float(np.max(np.abs(got[key] - want)) / (np.max(np.abs(want)) + 1e-12)))
    return worst, keys_ok and len(got) == count, len(got)


def padded_batch(batch):
    """Rows as sdrun pads them: ids padded with 0, labels with -100."""
    import torch
    ids = torch.zeros((len(batch), SEQ), dtype=torch.long)
    labels = torch.full((len(batch), SEQ), -100, dtype=torch.long)
    for r, seq in enumerate(batch):
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, :len(seq)] = torch.tensor(seq)
    return ids, labels


def adamw(model, lr, wd):
    """PyTorch AdamW over the trainable parameters with sdrun's weight-decay
    rule (rank >= 2 parameters only, as HF's Trainer) and ADAM_EPS."""
    import torch
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, eps=ADAM_EPS)


def torch_losses(model, rows, steps, accum, lr, wd, clip, autocast=None, scaler=None, scales=None):
    """Per-step losses of PyTorch training on the rows as sdrun batches them;
    autocast: a torch dtype to run the forward under torch.autocast("cpu").
    scaler: a torch.amp.GradScaler that scales the summed loss, as sdc's fp16
    plans do (the token count divides after unscale_); (skipped, scale after
    the step) is appended to `scales` per step."""
    import contextlib
    import torch
    import torch.nn.functional as F
    opt = adamw(model, lr, wd)
    losses, cursor = [], 0
    for _ in range(steps):
        opt.zero_grad()
        total_sum, total_tokens = 0.0, 0
        micro = []
        for _ in range(accum):
            batch = [rows[(cursor + i) % len(rows)] for i in range(BATCH)]
            cursor += BATCH
            ids, labels = padded_batch(batch)
            micro.append((ids, labels))
            total_tokens += int((labels[:, 1:] != -100).sum())
        for ids, labels in micro:
            with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
                logits = model(ids).float()
            loss_sum = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                       ignore_index=-100, reduction="sum")
            if scaler:
                scaler.scale(loss_sum).backward()
            else:
                (loss_sum / total_tokens).backward()
            total_sum += float(loss_sum)
        if scaler:
            scaler.unscale_(opt)
            for p in model.parameters():
                if p.grad is not None:
                    p.grad /= total_tokens
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            scales.append((scaler.get_scale() < before, scaler.get_scale()))  # a skipped step halves the scale
        else:
            opt.step()
        losses.append(total_sum / total_tokens)
    return losses


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_models import Gpt, export_gpt
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="sd_train_")
    try:
        base, onnx_path = export_base(tmp)
        data = os.path.join(tmp, "train.jsonl")
        rows = make_data(data, 9, seed=1)
        plan = os.path.join(tmp, "full.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "none", "--shapes", f"input_ids={BATCH}x{SEQ}",
            "--adam-epsilon", str(ADAM_EPS), "-o", plan])
        lr, wd, clip = 2e-3, 0.1, 1.0
        for accum in (1, 2):
            metrics = os.path.join(tmp, f"m{accum}.jsonl")
            weights = os.path.join(tmp, f"w{accum}.safetensors")
            sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--threads", "2",
                "--lr", str(lr), "--weight-decay", str(wd), "--clip-norm", str(clip), "--grad-accum", str(accum),
                "--metrics", metrics, "--save-weights", weights])
            ours = [json.loads(l)["loss"] for l in open(metrics)]
            model = Gpt(d=64, layers=2, heads=4, block=SEQ)
            model.load_state_dict(base.state_dict())
            ref = torch_losses(model, rows, STEPS, accum, lr, wd, clip)
            rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
            check(f"full fine-tuning, grad-accum {accum}: {STEPS} per-step losses", rel < 1e-4 and len(ours) == STEPS,
                  f"max rel diff {rel:.2e} (first {ref[0]:.4f}, last {ref[-1]:.4f})")
            got = read_safetensors(weights)
            state = dict(model.named_parameters())
            worst = 0.0
            for name, w in got.items():
                want = state[name].detach().numpy()
                worst = max(worst, float(np.max(np.abs(w - want)) / (np.max(np.abs(want)) + 1e-12)))
            check(f"full fine-tuning, grad-accum {accum}: final weights ({len(got)} tensors)",
                  worst < 1e-4 and len(got) == len(state), f"max rel diff {worst:.2e}")
            if accum == 1:  # sdc merge --weights: the trained model as plain ONNX
                merged = os.path.join(tmp, "full_merged.onnx")
                sh([sdc, "merge", onnx_path, "--weights", weights, "-o", merged])
                mplan = os.path.join(tmp, "full_merged.sdp")
                sh([sdc, "compile", merged, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", mplan])
                ids = np.array([rows[2][:SEQ] + [0] * (SEQ - len(rows[2]))] * BATCH, dtype=np.int64)
                np.save(os.path.join(tmp, "full_ids.npy"), ids)
                sh([sdrun, "infer", mplan, "--input", f"input_ids={os.path.join(tmp, 'full_ids.npy')}", "--output-dir",
                    os.path.join(tmp, "full_out"), "--output-format", "npy"])
                with torch.no_grad():
                    want = model(torch.tensor(ids)).numpy()
                err = float(np.max(np.abs(np.load(os.path.join(tmp, "full_out", "output_0.npy")) - want)))
                check("sdc merge --weights: the fully fine-tuned model as ONNX matches PyTorch", err < 1e-3,
                      f"max abs err {err:.2e}")

        # LoRA from an initial PEFT-layout adapter with non-zero B (tied head included).
        targets, r, alpha = ["qkv", "fc2", "head"], 4, 8.0
        lplan = os.path.join(tmp, "lora.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(targets), "--lora-r", str(r),
            "--lora-alpha", str(alpha), "--shapes", f"input_ids={BATCH}x{SEQ}", "--adam-epsilon", str(ADAM_EPS),
            "-o", lplan])
        init_dir, out_dir = os.path.join(tmp, "adapter0"), os.path.join(tmp, "adapter1")
        init = write_initial_adapter(base, targets, r, alpha, init_dir)
        metrics = os.path.join(tmp, "lora.jsonl")
        sh([sdrun, "train", lplan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--threads", "2",
            "--lr", str(lr), "--weight-decay", str(wd), "--clip-norm", str(clip), "--adapter", init_dir,
            "--save-adapter", out_dir, "--metrics", metrics])
        ours = [json.loads(l)["loss"] for l in open(metrics)]
        model = Gpt(d=64, layers=2, heads=4, block=SEQ)
        model.load_state_dict(base.state_dict())
        add_lora(model, targets, r, alpha, init)
        ref = torch_losses(model, rows, STEPS, 1, lr, wd, clip)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        check(f"LoRA r={r} on {','.join(targets)} from a PEFT adapter: {STEPS} per-step losses",
              rel < 1e-4 and len(ours) == STEPS, f"max rel diff {rel:.2e} (first {ref[0]:.4f}, last {ref[-1]:.4f})")
        worst, keys_ok, saved = adapter_diff(model, out_dir)
        cfg = json.load(open(os.path.join(out_dir, "adapter_config.json")))
        check("LoRA: saved adapter in PEFT layout matches PyTorch's adapter weights",
              keys_ok and worst < 1e-4 and cfg["r"] == r and cfg["peft_type"] == "LORA",
              f"{saved} tensors, max rel diff {worst:.2e}")

        # sdc merge folds the trained adapter into the ONNX model (untying the
        # head from the embedding); ONNX Runtime and sdrun run it and agree
        # with the PyTorch LoRA model.
        merged = os.path.join(tmp, "merged.onnx")
        sh([sdc, "merge", onnx_path, "--adapter", out_dir, "-o", merged])
        ids = np.array([rows[0][:SEQ] + [0] * (SEQ - len(rows[0])), rows[1][:SEQ] + [0] * (SEQ - len(rows[1]))],
                       dtype=np.int64)
        ids_path = os.path.join(tmp, "ids.npy")
        np.save(ids_path, ids)
        with torch.no_grad():
            want = model(torch.tensor(ids)).numpy()
        mplan = os.path.join(tmp, "merged.sdp")
        sh([sdc, "compile", merged, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", mplan])
        sh([sdrun, "infer", mplan, "--input", f"input_ids={ids_path}", "--output-dir", tmp, "--output-format", "npy"])
        got = np.load(os.path.join(tmp, "output_0.npy"))
        err = float(np.max(np.abs(got - want)))
        check("sdc merge: merged ONNX model (sdrun) matches the PyTorch LoRA model", err < 1e-3, f"max abs err {err:.2e}")
        got = ort_run(merged, {"input_ids": ids})["logits"]
        err = float(np.max(np.abs(got - want)))
        check("sdc merge: ONNX Runtime runs the merged model, matches PyTorch", err < 1e-3, f"max abs err {err:.2e}")
        import onnx
        names = [t.name for t in onnx.load(merged).graph.initializer]
        check("sdc merge: the tied embedding stays, the head gets its own merged weight",
              "wte.weight" in names and "head.weight" in names, f"{len(names)} initializers")

        # sdrun generate on the LoRA plan's batch-1 bucket with the trained adapter:
        # greedy decoding equals PyTorch's argmax continuation.
        prompt = "ab"
        gen = subprocess.run([sdrun, "generate", lplan, "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0",
                            "--adapter", out_dir], capture_output=True)
        toks = list(prompt.encode())
        with torch.no_grad():
            for _ in range(6):
                toks.append(int(model(torch.tensor([toks]))[0, -1].argmax()))
        check("sdrun generate: greedy continuation equals PyTorch's", gen.returncode == 0 and
              gen.stdout.rstrip(b"\n") == bytes(toks), f"{gen.stdout!r} vs {bytes(toks)!r}")

        # Adapters that do not fit the plan are refused before anything runs.
        bad_dir = os.path.join(tmp, "bad_adapter")
        os.makedirs(bad_dir)
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha}, open(os.path.join(bad_dir, "adapter_config.json"), "w"))
        tensors = read_safetensors(os.path.join(init_dir, "adapter_model.safetensors"))
        wrong = dict(tensors)
        wrong["base_model.model.blocks.0.attn.qkv.lora_A.weight"] = np.zeros((r, 7), np.float32)
        write_safetensors(os.path.join(bad_dir, "adapter_model.safetensors"), wrong)
        train = [sdrun, "train", lplan, "--data", data, "--steps", "1", "--adapter", bad_dir]
        clean_error("adapter with a wrong shape", train, ["blocks.0.attn.qkv.lora_A.weight", "4x7"])
        fewer = {k: v for k, v in tensors.items() if "fc2" not in k}
        write_safetensors(os.path.join(bad_dir, "adapter_model.safetensors"), fewer)
        clean_error("adapter missing a target module", train, ["blocks.0.mlp.fc2"])
        extra = dict(tensors)
        extra["base_model.model.blocks.0.mlp.fc1.lora_A.weight"] = np.zeros((r, 64), np.float32)
        write_safetensors(os.path.join(bad_dir, "adapter_model.safetensors"), extra)
        clean_error("adapter for a module the plan does not adapt", train, ["fc1"])
        json.dump({"peft_type": "LORA", "r": 8, "lora_alpha": alpha}, open(os.path.join(bad_dir, "adapter_config.json"), "w"))
        clean_error("adapter of another rank", train, ["r=8"])
        for bad in ("1", "1.5", "x"):
            clean_error(f"--lora-dropout {bad}",
                        [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "qkv", "--lora-dropout", bad,
                         "-o", os.path.join(tmp, "never.sdp")], ["--lora-dropout"])
        clean_error("--target-modules matching nothing",
                    [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "nope", "--dry-run"],
                    ["matches no linear module"])

        # Opset 14 exports decompose LayerNorm (ReduceMean, Sub, Pow, Sqrt, Div):
        # it trains through the elementwise rules and matches PyTorch too.
        onnx14 = os.path.join(tmp, "gpt14.onnx")
        export_gpt(base, onnx14, torch.zeros((BATCH, SEQ), dtype=torch.long), opset=14)
        plan14 = os.path.join(tmp, "full14.sdp")
        sh([sdc, "compile", onnx14, "--peft", "none", "--shapes", f"input_ids={BATCH}x{SEQ}", "--adam-epsilon",
            str(ADAM_EPS), "-o", plan14])
        metrics = os.path.join(tmp, "m14.jsonl")
        sh([sdrun, "train", plan14, "--data", data, "--steps", "10", "--no-shuffle", "--threads", "2", "--lr", str(lr),
            "--weight-decay", str(wd), "--clip-norm", str(clip), "--metrics", metrics])
        ours = [json.loads(l)["loss"] for l in open(metrics)]
        model = Gpt(d=64, layers=2, heads=4, block=SEQ)
        model.load_state_dict(base.state_dict())
        ref = torch_losses(model, rows, 10, 1, lr, wd, clip)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        check("opset 14 export (decomposed LayerNorm): 10 per-step losses", rel < 1e-4 and len(ours) == 10,
              f"max rel diff {rel:.2e}")

        # Resume: 2N straight vs N, stop, --resume, N more: identical bits.
        n = 6
        straight, ck = os.path.join(tmp, "straight.safetensors"), os.path.join(tmp, "ck")
        sh([sdrun, "train", plan, "--data", data, "--steps", str(2 * n), "--seed", "3", "--threads", "2",
            "--lr", str(lr), "--metrics", os.path.join(tmp, "s.jsonl"), "--save-weights", straight])
        sh([sdrun, "train", plan, "--data", data, "--steps", str(n), "--seed", "3", "--threads", "2",
            "--lr", str(lr), "--checkpoint-dir", ck, "--metrics", os.path.join(tmp, "r.jsonl")])
        resumed = os.path.join(tmp, "resumed.safetensors")
        sh([sdrun, "train", plan, "--data", data, "--steps", str(2 * n), "--seed", "3", "--threads", "2",
            "--lr", str(lr), "--checkpoint-dir", ck, "--resume", "--metrics", os.path.join(tmp, "r.jsonl"),
            "--save-weights", resumed])
        a = [json.loads(l)["loss"] for l in open(os.path.join(tmp, "s.jsonl"))]
        b = [json.loads(l)["loss"] for l in open(os.path.join(tmp, "r.jsonl"))]
        wa, wb = read_safetensors(straight), read_safetensors(resumed)
        same = a == b and all(np.array_equal(wa[k], wb[k]) for k in wa)
        check(f"resume: {2 * n} steps straight == {n} + --resume {n}, bit for bit", same,
              f"losses equal: {a == b}, weights equal: {all(np.array_equal(wa[k], wb[k]) for k in wa)}")

        # A corrupt newer checkpoint (an edited manifest: its checksum no
        # longer matches) and a folder whose step does not fit 64 bits are
        # skipped, not fatal.
        newest = max(int(d.split("-")[1]) for d in os.listdir(ck) if d.startswith("checkpoint-"))
        bad = os.path.join(ck, f"checkpoint-{newest + 100}")
        shutil.copytree(os.path.join(ck, f"checkpoint-{newest}"), bad)
        manifest = json.load(open(os.path.join(bad, "manifest.json")))
        manifest["step"] = newest + 100
        json.dump(manifest, open(os.path.join(bad, "manifest.json"), "w"))
        os.makedirs(os.path.join(ck, "checkpoint-" + "9" * 30))
        r = subprocess.run([sdrun, "train", plan, "--data", data, "--steps", str(newest + 1), "--seed", "3",
                            "--checkpoint-dir", ck, "--resume"], capture_output=True, text=True)
        check("resume skips a checkpoint with a corrupt manifest and an out-of-range step folder",
              r.returncode == 0 and "checksum" in r.stderr and f"from {ck}/checkpoint-{newest} " in r.stderr,
              r.stderr.strip().splitlines()[0] if r.stderr.strip() else f"exit {r.returncode}")

        # lora_alpha survives plan -> adapter_config.json -> plan at full precision.
        third = os.path.join(tmp, "third.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "qkv", "--lora-r", "3", "--lora-alpha",
            repr(1 / 3), "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", third])
        sh([sdrun, "train", third, "--data", data, "--steps", "1", "--save-adapter", os.path.join(tmp, "third")])
        r = subprocess.run([sdrun, "train", third, "--data", data, "--steps", "1", "--adapter",
                            os.path.join(tmp, "third")], capture_output=True, text=True)
        check("an adapter saved from a plan with lora_alpha=1/3 loads back into it", r.returncode == 0,
              r.stderr.strip()[-200:])
        bad_input(sdc, sdrun, onnx_path, plan, tmp)
        crash_safety(sdrun, plan, data, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_training")


if __name__ == "__main__":
    sys.exit(main())
