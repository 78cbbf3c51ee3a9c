#!/usr/bin/env python3
"""Training a model exported in train mode, whose BatchNormalizations
normalize by each batch's statistics (ONNX training_mode=1): a CNN with
BatchNorm2d after its convolutions and BatchNorm1d after a linear layer,
`sdc compile --loss-output loss`, `sdrun train --data DIR`. Against PyTorch
on the same batches with the same AdamW: the losses, the trained weights and
the running statistics (ONNX's rule: running * momentum + batch * (1 -
momentum), with the batch's biased variance; PyTorch's own buffers use the
unbiased one, so the reference applies ONNX's rule); eval normalizes by the
running statistics (PyTorch's eval()); resume; the saved weights merged into
an eval-mode export served by ONNX Runtime; LoRA's note that an adapter does
not hold the statistics; two ranks (mpirun) normalizing by both ranks' batch
(SyncBatchNorm) as one rank of twice the batch."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import (batch_normed_cnn, export_batch_normed_cnn, losses_of, ort_run, report_checks, sh, tool_paths,
                      torch_train_on_images, write_image_data)

RESULTS = []
BATCH, STEPS, LR, WD, CLIP, ADAM_EPS = 4, 10, 3e-3, 0.01, 1.0, 1e-6


def check(name, ok, detail):
    RESULTS.append((name, bool(ok), detail))


def onnx_running_statistics(model):
    """Makes each BatchNorm update its running statistics by ONNX's rule
    (momentum 0.9 on the running value, the batch's biased variance)."""
    import torch
    F = torch.nn.functional

    def forward_of(bn):
        def forward(x):
            if not bn.training:
                return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
            axes = [0] + list(range(2, x.dim()))
            with torch.no_grad():
                bn.running_mean.mul_(0.9).add_(0.1 * x.mean(axes))
                bn.running_var.mul_(0.9).add_(0.1 * x.var(axes, unbiased=False))
            return F.batch_norm(x, None, None, bn.weight, bn.bias, True, 0.0, bn.eps)
        return forward

    for bn in (model.bn1, model.bn2, model.bn3):
        bn.forward = forward_of(bn)
    return model


def torch_run(onnx_path, folder, steps, accum):
    """The reference model trained in PyTorch as sdrun trains the plan
    (torch_train_on_images); returns (model, per-step mean losses). Its running statistics start
    from the train-mode export's: tracing ran one training forward, which moved them."""
    import onnx
    import torch
    from onnx import numpy_helper
    model = onnx_running_statistics(batch_normed_cnn()).train()
    exported = {t.name: numpy_helper.to_array(t) for t in onnx.load(onnx_path).graph.initializer}
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if "running_" in name:
                buffer.copy_(torch.tensor(exported[name]))
    return model, torch_train_on_images(model, folder, steps, accum, BATCH, LR, WD, CLIP, ADAM_EPS)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from safetensors.numpy import load_file
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "bn.onnx")
        export_batch_normed_cnn(onnx_path, BATCH, train=True)
        plan = os.path.join(tmp, "bn.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "none", "--loss-output", "loss", "--adam-epsilon", str(ADAM_EPS),
            "-o", plan])
        inspect = sh([sdrun, "inspect", plan])
        roles = [l.split()[-1] for l in inspect.splitlines() if "running_" in l]
        check("the six running statistics are `statistics` globals", roles == ["statistics"] * 6, f"{roles}")

        data = write_image_data(os.path.join(tmp, "data"), 18, seed=1)
        flags = ["--no-shuffle", "--threads", "2", "--lr", str(LR), "--weight-decay", str(WD), "--clip-norm", str(CLIP)]
        train = [sdrun, "train", plan, "--data", data] + flags
        trained = {}  # the PyTorch reference per --grad-accum, for the merge check below
        for accum in (1, 2):
            run = os.path.join(tmp, f"accum{accum}")
            sh(train + ["--steps", str(STEPS), "--grad-accum", str(accum), "--metrics", run + ".jsonl",
                        "--save-weights", run + ".safetensors"])
            ours = losses_of(run + ".jsonl")
            model, want = torch_run(onnx_path, data, STEPS, accum)
            trained[accum] = model
            rel = max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == len(want) else float("inf")
            check(f"--grad-accum {accum}: {STEPS} losses equal PyTorch's (batch statistics)", rel < 1e-4,
                  f"max relative diff {rel:.2e}; first {ours[0]:.5f} vs {want[0]:.5f}, last {ours[-1]:.5f} vs "
                  f"{want[-1]:.5f}")
            got = load_file(run + ".safetensors")
            state = {k: v.detach().numpy() for k, v in model.state_dict().items() if "num_batches" not in k}
            diffs = {k: float(np.max(np.abs(got[k] - v))) for k, v in state.items() if k in got}
            stats = [k for k in diffs if "running_" in k]
            check(f"--grad-accum {accum}: trained weights and running statistics equal PyTorch's",
                  len(diffs) == len(state) == len(got) and len(stats) == 6 and max(diffs.values()) < 1e-5,
                  f"{len(diffs)} of {len(state)} tensors ({len(stats)} running statistics) saved, max |diff| "
                  f"{max(diffs.values(), default=-1):.2e}, running statistics' {max(diffs[k] for k in stats):.2e}")

        # Eval normalizes by the running statistics, as PyTorch's eval() does.
        evald = write_image_data(os.path.join(tmp, "eval"), 8, seed=2)
        sh(train + ["--steps", "3", "--eval-data", evald, "--metrics", os.path.join(tmp, "eval.jsonl")])
        ev = [json.loads(l)["eval_loss"] for l in open(os.path.join(tmp, "eval.jsonl")) if "eval_loss" in l]
        model, _ = torch_run(onnx_path, data, 3, 1)
        model.eval()
        with torch.no_grad():
            images = torch.tensor(np.load(os.path.join(evald, "image.npy")))
            labels = torch.tensor(np.load(os.path.join(evald, "label.npy")))
            want = np.mean([float(model(images[i:i + BATCH], labels[i:i + BATCH])) for i in (0, 4)])
            batch_stats = np.mean([float(model.train()(images[i:i + BATCH], labels[i:i + BATCH])) for i in (0, 4)])
        check("eval after 3 steps equals PyTorch's in eval mode (the running statistics)",
              ev and abs(ev[-1] - want) < 1e-5 and abs(ev[-1] - batch_stats) > 1e-3,
              f"{ev[-1] if ev else None} vs {want:.6f} (by batch statistics it would be {batch_stats:.6f})")

        # Stop at step 4, resume to 8: the running statistics come back with the checkpoint.
        ck = os.path.join(tmp, "ck")
        whole, part = os.path.join(tmp, "whole"), os.path.join(tmp, "part")
        sh(train + ["--steps", "8", "--metrics", whole + ".jsonl", "--save-weights", whole + ".safetensors"])
        sh(train + ["--steps", "4", "--checkpoint-dir", ck, "--metrics", part + ".jsonl"])
        sh(train + ["--steps", "8", "--checkpoint-dir", ck, "--resume", "--metrics", part + ".jsonl", "--save-weights",
                    part + ".safetensors"])
        same = open(whole + ".safetensors", "rb").read() == open(part + ".safetensors", "rb").read()
        check("stopped at step 4 and resumed: the same losses, weights and running statistics bit for bit",
              losses_of(whole + ".jsonl") == losses_of(part + ".jsonl") and same,
              f"{len(losses_of(part + '.jsonl'))} losses, saved weights {'equal' if same else 'differ'}")

        # Serving: the eval-mode export takes the trained weights and statistics by name.
        plain, tuned = os.path.join(tmp, "logits.onnx"), os.path.join(tmp, "tuned.onnx")
        export_batch_normed_cnn(plain, BATCH, train=False)
        sh([sdc, "merge", plain, "--weights", os.path.join(tmp, "accum1.safetensors"), "-o", tuned])
        model = trained[1]
        images = np.load(os.path.join(evald, "image.npy"))[:BATCH]
        got = ort_run(tuned, {"image": images})["logits"]
        with torch.no_grad():
            want = model.eval()(torch.tensor(images)).numpy()
        err = float(np.max(np.abs(got - want)))
        check("weights and statistics merged into the eval-mode export: ONNX Runtime's logits equal PyTorch's",
              err < 1e-4, f"max |diff| {err:.2e}")

        # LoRA on the linear layers: the statistics still update (PyTorch's train()
        # does too), but an adapter does not hold them: said once at the start.
        lora = os.path.join(tmp, "bn-lora.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "fc,head", "--loss-output", "loss",
            "-o", lora])
        r = subprocess.run([sdrun, "train", lora, "--data", data, "--steps", "2"] + flags, capture_output=True,
                           text=True)
        check("LoRA on a train-mode BatchNorm model: trains, and says the adapter does not hold the statistics",
              r.returncode == 0 and "which a LoRA adapter does not hold" in r.stderr,
              f"exit {r.returncode}: {[l for l in r.stderr.splitlines() if 'statistics' in l][:1]}")

        # Two ranks normalize by both ranks' batch (SyncBatchNorm): they train as one
        # rank of twice the batch, running statistics included.
        plan8 = os.path.join(tmp, "bn8.sdp")
        export_batch_normed_cnn(os.path.join(tmp, "bn8.onnx"), 2 * BATCH, train=True)
        sh([sdc, "compile", os.path.join(tmp, "bn8.onnx"), "--peft", "none", "--loss-output", "loss", "--adam-epsilon",
            str(ADAM_EPS), "-o", plan8])
        one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
        sh([sdrun, "train", plan8, "--data", data, "--steps", "5", "--metrics", one + ".jsonl", "--save-weights",
            one + ".safetensors"] + flags)
        mpirun = shutil.which("mpirun")
        if not mpirun:
            check("two ranks (mpirun)", False, "mpirun not found (scripts/install-deps.sh installs openmpi-bin)")
        else:
            sh([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sdrun, "train", plan, "--data", data,
                "--steps", "5", "--metrics", two + ".jsonl", "--save-weights", two + ".safetensors"] + flags[:1] +
               ["--threads", "1"] + flags[3:])
            a, b = losses_of(one + ".jsonl"), losses_of(two + ".jsonl")
            rel = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) == 5 else float("inf")
            wa, wb = load_file(one + ".safetensors"), load_file(two + ".safetensors")
            diffs = {k: float(np.max(np.abs(wa[k] - wb[k]))) for k in wa} if wa.keys() == wb.keys() else {}
            diff = max(diffs.values(), default=float("inf"))
            stats = max((d for k, d in diffs.items() if "running_" in k), default=float("inf"))
            check("two ranks of batch 4 (mpirun -np 2) train as one rank of batch 8 (batch statistics over both ranks)",
                  rel < 1e-5 and diff < 5e-5, f"5 losses, max relative diff {rel:.1e}; {len(wa)} saved tensors, max "
                  f"|diff| {diff:.1e}, running statistics' {stats:.1e}")
    return report_checks("batch_norm_training", RESULTS)


if __name__ == "__main__":
    sys.exit(main())
