#!/usr/bin/env python3
"""Training a plan that computes its own loss (`sdc compile --loss-output`)
on tensor data: `sdrun train --data DIR` with one NumPy array per input
(image.npy, label.npy), against PyTorch on the same batches with the same
AdamW. A small CNN (convolutions, grouped and strided, max and average
pooling, a linear head, cross-entropy), so the steps are Conv's weight
gradient and the pools' gradients. Covers gradient accumulation, two ranks
(mpirun) against one rank of twice the batch, ReLU's fused gradient against
the unfused plan, eval on whole batches, resume after a stop
(bit-identical), serving the trained
weights merged into the model's labels-free export, `sdrun bench --data DIR`
and bad data folders."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import (clean_error_problems, export_tiny_cnn_classifier, losses_of, ort_run, report_checks, sh,
                      tool_paths, torch_train_on_images, write_image_data)

RESULTS = []
BATCH, STEPS, LR, WD, CLIP = 4, 12, 3e-3, 0.01, 1.0
ADAM_EPS = 1e-6  # as test_training: keeps the comparison about the math, not eps-sized noise


def check(name, ok, detail):
    RESULTS.append((name, bool(ok), detail))


def torch_run(model, folder, steps, accum):
    """`model` trained in PyTorch as sdrun trains the plan (torch_train_on_images); the per-step losses."""
    return torch_train_on_images(model, folder, steps, accum, BATCH, LR, WD, CLIP, ADAM_EPS)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from safetensors.numpy import load_file
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "cnn.onnx")
        export_tiny_cnn_classifier(onnx_path, BATCH)
        plan = os.path.join(tmp, "cnn.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "none", "--loss-output", "loss", "--adam-epsilon", str(ADAM_EPS),
            "-o", plan])
        data = write_image_data(os.path.join(tmp, "data"), 18, seed=1)
        flags = ["--no-shuffle", "--threads", "2", "--lr", str(LR), "--weight-decay", str(WD), "--clip-norm", str(CLIP)]
        train = [sdrun, "train", plan, "--data", data] + flags

        trained = {}  # the PyTorch reference per --grad-accum, for the merge check below
        for accum in (1, 2):
            run = os.path.join(tmp, f"accum{accum}")
            sh(train + ["--steps", str(STEPS), "--grad-accum", str(accum), "--metrics", run + ".jsonl",
                        "--save-weights", run + ".safetensors"])
            ours = losses_of(run + ".jsonl")
            model = export_tiny_cnn_classifier(os.path.join(tmp, "again.onnx"), BATCH)  # the same seeded weights
            want = torch_run(model, data, STEPS, accum)
            trained[accum] = model
            rel = max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == len(want) else float("inf")
            check(f"--grad-accum {accum}: {STEPS} losses equal PyTorch's (18 examples, so epochs wrap)", rel < 1e-4,
                  f"max relative diff {rel:.2e}; first {ours[0]:.5f} vs {want[0]:.5f}, last {ours[-1]:.5f} vs "
                  f"{want[-1]:.5f}")
            got = load_file(run + ".safetensors")
            diffs = {k: float(np.max(np.abs(got[k] - v.detach().numpy()))) for k, v in model.state_dict().items()
                     if k in got}
            check(f"--grad-accum {accum}: trained weights equal PyTorch's", len(diffs) == 6 and max(diffs.values()) < 1e-5,
                  f"{len(diffs)} of {len(got)} tensors matched by name, max |diff| {max(diffs.values(), default=-1):.2e}")

        # Serving: the same module exported without labels (image -> logits) takes the
        # trained weights by name (sdc merge); ONNX Runtime's logits equal PyTorch's.
        plain = os.path.join(tmp, "logits.onnx")
        export_tiny_cnn_classifier(plain, BATCH, logits=True)
        tuned = os.path.join(tmp, "tuned.onnx")
        sh([sdc, "merge", plain, "--weights", os.path.join(tmp, "accum1.safetensors"), "-o", tuned])
        model = trained[1]
        images = np.load(os.path.join(data, "image.npy"))[:BATCH]
        got = ort_run(tuned, {"image": images})["logits"]
        with torch.no_grad():
            want = model(torch.tensor(images)).numpy()
        err = float(np.max(np.abs(got - want)))
        check("the trained weights merged into the logits export: ONNX Runtime's logits equal PyTorch's", err < 1e-4,
              f"max |diff| {err:.2e}")

        # Eval: whole batches only (the model's loss is a mean: a filler row would count), said once.
        evald = write_image_data(os.path.join(tmp, "eval"), 10, seed=2)
        # Two ranks of the plan's batch train as one rank of twice the batch (mpirun, MPI).
        plan8 = os.path.join(tmp, "cnn8.sdp")
        export_tiny_cnn_classifier(os.path.join(tmp, "cnn8.onnx"), 2 * BATCH)
        sh([sdc, "compile", os.path.join(tmp, "cnn8.onnx"), "--peft", "none", "--loss-output", "loss", "--adam-epsilon",
            str(ADAM_EPS), "-o", plan8])
        sh([sdrun, "train", plan8, "--data", data, "--steps", "5", "--metrics", os.path.join(tmp, "one.jsonl")] + flags)
        mpirun = shutil.which("mpirun")
        if not mpirun:
            check("two ranks (mpirun)", False, "mpirun not found (scripts/install-deps.sh installs openmpi-bin)")
        else:
            sh([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sdrun, "train", plan, "--data", data,
                "--steps", "5", "--metrics", os.path.join(tmp, "two.jsonl")] + flags[:1] + ["--threads", "1"] + flags[3:])
            one, two = losses_of(os.path.join(tmp, "one.jsonl")), losses_of(os.path.join(tmp, "two.jsonl"))
            rel = max(abs(a - b) / abs(a) for a, b in zip(one, two)) if len(one) == len(two) == 5 else float("inf")
            check("two ranks of batch 4 (mpirun -np 2) train as one rank of batch 8", rel < 1e-5,
                  f"5 losses, max relative diff {rel:.1e}")

        # ReLU's gradient, Where(Greater(x, 0), dy, 0), fused (sd-fuse-elementwise's
        # ReluGrad): the same losses and weights bit for bit as the unfused plan.
        unfused = os.path.join(tmp, "cnn-unfused.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "none", "--loss-output", "loss", "--adam-epsilon", str(ADAM_EPS),
            "--no-fuse", "elementwise", "-o", unfused])
        runs = {}
        for label, p in (("fused", plan), ("unfused", unfused)):
            sh([sdrun, "train", p, "--data", data, "--steps", "4", "--metrics", os.path.join(tmp, f"{label}.jsonl"),
                "--save-weights", os.path.join(tmp, f"{label}.safetensors")] + flags)
            runs[label] = (losses_of(os.path.join(tmp, f"{label}.jsonl")),
                           open(os.path.join(tmp, f"{label}.safetensors"), "rb").read())
        kernels = subprocess.run([sdrun, "inspect", plan, "--kernels", "cpu"], capture_output=True, text=True).stdout
        check("ReLU's gradient fused: the unfused plan's losses and weights bit for bit",
              runs["fused"] == runs["unfused"] and "FusedElementwise" in kernels and "Where" not in kernels,
              f"losses {runs['fused'][0]} vs {runs['unfused'][0]}; the plan has FusedElementwise steps and no Where")

        r = subprocess.run(train + ["--steps", "1", "--eval-data", evald, "--metrics", os.path.join(tmp, "eval.jsonl")],
                           capture_output=True, text=True, check=True)
        ev = [json.loads(l)["eval_loss"] for l in open(os.path.join(tmp, "eval.jsonl")) if "eval_loss" in l]
        model = export_tiny_cnn_classifier(os.path.join(tmp, "again.onnx"), BATCH)
        torch_run(model, data, 1, 1)
        with torch.no_grad():
            images = torch.tensor(np.load(os.path.join(evald, "image.npy")))
            labels = torch.tensor(np.load(os.path.join(evald, "label.npy")))
            want = np.mean([float(model(images[i:i + BATCH], labels[i:i + BATCH])) for i in (0, 4)])
        check("eval over the first 8 of 10 examples equals PyTorch's, with a note", ev and abs(ev[0] - want) < 1e-5 and
              "eval uses the first 8 of the 10 eval examples" in r.stderr, f"{ev} vs {want:.6f}")

        # Stop at step 5, resume to STEPS: the same losses, bit for bit.
        ck = os.path.join(tmp, "ck")
        sh(train + ["--steps", str(STEPS), "--metrics", os.path.join(tmp, "whole.jsonl")])
        sh(train + ["--steps", "5", "--checkpoint-dir", ck, "--metrics", os.path.join(tmp, "part.jsonl")])
        sh(train + ["--steps", str(STEPS), "--checkpoint-dir", ck, "--resume", "--metrics", os.path.join(tmp, "part.jsonl")])
        whole, part = losses_of(os.path.join(tmp, "whole.jsonl")), losses_of(os.path.join(tmp, "part.jsonl"))
        check("stopped at step 5 and resumed: the same losses bit for bit", whole == part and len(whole) == STEPS,
              f"{len(part)} losses")

        out = sh([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--iterations", "2", "--warmup", "0"])
        check("sdrun bench --entry train_step --data DIR", '"median_ms"' in out, out.strip()[-120:])

        # Bad data: one line naming the file and what is wrong, exit 1.
        def bad(name, files, must):
            folder = os.path.join(tmp, name.replace(" ", "_"))
            os.makedirs(folder)
            for f, a in files.items():
                np.save(os.path.join(folder, f), a)
            problems, line = clean_error_problems([sdrun, "train", plan, "--data", folder, "--steps", "1"] + flags, must)
            check(f"bad data: {name}", not problems, "; ".join(problems) or line)

        img, lab = np.zeros((6, 3, 16, 16), np.float32), np.zeros(6, np.int64)
        bad("missing label array", {"image.npy": img}, ["label.npy"])
        bad("image of the wrong shape", {"image.npy": np.zeros((6, 3, 8, 8), np.float32), "label.npy": lab},
            ["image.npy", "f32[6x3x8x8]", "f32[Nx3x16x16]"])
        bad("labels of the wrong type", {"image.npy": img, "label.npy": lab.astype(np.int32)}, ["label.npy", "i32", "i64"])
        bad("arrays of different lengths", {"image.npy": img, "label.npy": np.zeros(5, np.int64)}, ["5 examples", "6"])
        bad("no examples", {"image.npy": img[:0], "label.npy": lab[:0]}, ["no examples"])
        jsonl = os.path.join(tmp, "text.jsonl")
        open(jsonl, "w").write('{"text": "a"}\n')
        # A --loss-output the model lacks (a TorchScript export names outputs by node number): its outputs listed.
        problems, line = clean_error_problems([sdc, "compile", onnx_path, "--peft", "none", "--loss-output",
                                               "cross_entropy_loss", "-o", os.path.join(tmp, "never.sdp")],
                                              ["--loss-output 'cross_entropy_loss'", "the model's outputs: 'loss'"],
                                              [os.path.join(tmp, "never.sdp")])
        check("bad --loss-output: one line listing the model's outputs, no plan", not problems,
              "; ".join(problems) or line)
        for name, args, must in [("a JSON Lines file", ["--data", jsonl], ["folder holding image.npy", "label.npy"]),
                                 ("--batch other than the plan's", ["--data", data, "--batch", "2"], ["--batch 2", "4 rows"]),
                                 ("eval data under one batch", ["--data", data, "--eval-data",
                                                                write_image_data(os.path.join(tmp, "tiny"), 3, 3)],
                                  ["--eval-data", "3 examples"])]:
            problems, line = clean_error_problems([sdrun, "train", plan, "--steps", "1"] + flags + args, must)
            check(f"bad data: {name}", not problems, "; ".join(problems) or line)

    return report_checks("tensor_training", RESULTS)


if __name__ == "__main__":
    sys.exit(main())
