#!/usr/bin/env python3
"""Times one training step of an image classifier that computes its own loss
(`sdc compile --loss-output`, `sdrun bench --entry train_step --data DIR`)
against PyTorch eager (.venv's torch) on the same model, batch and thread
count, in one run, with each process's peak memory (max RSS).

The model is examples/export_models.py's small ResNet-style CNN (stem, two
residual blocks of 3x3 convolutions with BatchNorm, a strided conv, max and
average pooling, a linear head) with cross-entropy on its logits; full
fine-tuning with AdamW. --batch-norm eval (the default) trains with
BatchNorm's running statistics frozen on both sides (the model exported in
eval mode); --batch-norm train normalizes by each batch's statistics and
updates the running ones on both sides (exported in train mode, PyTorch's
model.train()), as training a ResNet from scratch does.

  bench/cnn_train_bench.py [--threads N] [--iterations N] [--configs c32-b16,c64-b32] [--batch-norm eval|train]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

CONFIGS = {  # width, image size, batch
    "c32-b16": (32, 32, 16),
    "c64-b32": (64, 32, 32),
}
CLASSES = 10


def classifier(width, batch_norm="eval"):
    """The CNN with its loss: forward(image, label) -> mean cross-entropy, in
    eval mode (BatchNorm frozen) or train mode (batch statistics)."""
    import torch
    from export_models import Cnn, randomize_batch_norm

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Cnn(width=width, classes=CLASSES)

        def forward(self, image, label):
            return torch.nn.functional.cross_entropy(self.net(image), label)

    torch.manual_seed(0)
    model = WithLoss()
    randomize_batch_norm(model, torch.Generator().manual_seed(0))
    return model.train() if batch_norm == "train" else model.eval()


def torch_child(args):
    import torch
    torch.set_num_threads(args.threads)
    width, size, batch = CONFIGS[args.config]
    model = classifier(width, args.batch_norm)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    image = torch.randn(batch, 3, size, size)
    label = torch.randint(0, CLASSES, (batch,))
    times = []
    for i in range(args.warmup + args.iterations):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(image, label).backward()
        opt.step()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    print(json.dumps({"median_ms": times[len(times) // 2]}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--configs", default="c32-b16,c64-b32")
    ap.add_argument("--batch-norm", choices=["eval", "train"], default="eval",
                    help="BatchNorm's statistics: the running ones frozen (eval) or each batch's (train)")
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_child:
        return torch_child(args)
    import numpy as np
    import torch
    from peers import cpu_model
    from train_bench import measure
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)  # see bench/run_bench.sh
    sdc, sdrun = os.path.join(args.build, "tools", "sdc"), os.path.join(args.build, "tools", "sdrun")
    print(f"CPU: {cpu_model()}; {args.threads} threads; torch {torch.__version__}; median of {args.iterations} steps "
          f"after {args.warmup}; BatchNorm in {args.batch_norm} mode")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sd_cnn_train_bench_") as tmp:
        for name in args.configs.split(","):
            width, size, batch = CONFIGS[name]
            onnx_path = os.path.join(tmp, f"{name}.onnx")
            mode = {"training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": False} \
                if args.batch_norm == "train" else {}
            torch.onnx.export(classifier(width, args.batch_norm), (torch.zeros(batch, 3, size, size),
                                                                   torch.zeros(batch, dtype=torch.long)), onnx_path,
                              input_names=["image", "label"], output_names=["loss"], opset_version=17, dynamo=False,
                              **mode)
            data = os.path.join(tmp, f"{name}-data")
            os.makedirs(data)
            rng = np.random.default_rng(0)
            np.save(os.path.join(data, "image.npy"), rng.standard_normal((batch, 3, size, size)).astype(np.float32))
            np.save(os.path.join(data, "label.npy"), rng.integers(0, CLASSES, batch).astype(np.int64))
            plan = os.path.join(tmp, f"{name}.sdp")
            subprocess.run([sdc, "compile", onnx_path, "--peft", "none", "--loss-output", "loss", "-o", plan],
                           check=True, capture_output=True)
            out, sd_rss = measure([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads",
                                   str(args.threads), "--iterations", str(args.iterations), "--warmup",
                                   str(args.warmup)], env)
            sd_ms = json.loads(out.strip().splitlines()[-1])["median_ms"]
            out, pt_rss = measure([sys.executable, __file__, "--torch-child", "--config", name, "--threads",
                                   str(args.threads), "--iterations", str(args.iterations), "--warmup",
                                   str(args.warmup), "--batch-norm", args.batch_norm], env)
            pt_ms = json.loads(out.strip().splitlines()[-1])["median_ms"]
            rows.append((name, width, size, batch, sd_ms, pt_ms, sd_rss, pt_rss))
    print("| config | width | image | batch | sdrun ms/step | PyTorch eager ms/step | speed-up | sdrun MiB | PyTorch MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, width, size, batch, sd_ms, pt_ms, sd_rss, pt_rss in rows:
        print(f"| {name} | {width} | {size}x{size} | {batch} | {sd_ms:.2f} | {pt_ms:.2f} | {pt_ms / sd_ms:.2f}x | "
              f"{sd_rss:.0f} | {pt_rss:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
