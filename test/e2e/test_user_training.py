#!/usr/bin/env python3
"""Models users write themselves and train with their own loss (`sdc compile
--peft none --loss-output loss`, `sdrun train --data DIR`), exported by
TorchScript and by torch.onnx.export's default (dynamo) exporter, against
PyTorch on the same batches with the same AdamW: per-step losses and every
trained parameter; and, in a build with the CUDA backend, every step of each
plan binds to a CUDA kernel.

  masked     a mean squared error over the rows a run-time mask keeps
             (pred[keep] - y[keep]: NonZero in the forward, its Gathers'
             gradients in the backward), with a one-output head's bias and a
             scalar temperature, one-element parameters that train too
  activations  LeakyReLU, ELU, Softplus, Mish, Hardswish, PReLU (its slope a
             parameter), Softsign and SELU, torch.maximum, an amax pooling
             and a logsumexp, under a smooth L1 loss (Abs)
  unet       a strided Conv, GroupNorm (InstanceNormalization), a
             ConvTranspose, a skip Concat, MSE; the dynamo exporter's own
             constants (InstanceNormalization's ones and zeros) stay frozen,
             its folded copies of GroupNorm's weight and bias train
  upsample   F.interpolate (bilinear up, nearest to a size: Resize's
             gradient), InstanceNorm2d with affine parameters, F.pad
  sequence   cumsum, torch.gather (GatherElements), repeat (Tile), F.pad, L1
  weighted   cross-entropy with class weights (a buffer, which stays
             frozen), per-sample weights over reduction='none', and
             nll_loss(log_softmax) with ignore_index
  routed     attention written with torch.einsum, causal by torch.tril of
             the scores (Trilu), a top-2 router (TopK's values), torch.flip (a
             Slice with step -1), an in-place row write (ScatterND in
             TorchScript's export) and a scatter (ScatterElements), atan, tan
  superres   reflect and replicate F.pad (Pad modes reflect and edge) around
             Convs, pixel_shuffle (DepthToSpace) and pixel_unshuffle
  spatial    a spatial transformer: F.affine_grid from a predicted theta,
             F.grid_sample with border padding (GridSampleGrad, AffineGrid's
             gradient)
  patches    F.unfold into overlapping blocks, a Linear per block, F.fold
             back (Col2Im's gradient)
  products   torch.prod (ReduceProd), vector_norm with p=3 (Pow with an
             integer exponent), the log of a sum
  bags       nn.EmbeddingBag, mean and sum (dynamo writes a Loop that
             inserts each bag's row into a sequence, then ConcatFromSequence)
  encoder    nn.TransformerEncoderLayer (dynamo's optimizer merges its two
             LayerNorms' ones and zeros: the import gives each its own again)
  merged     what torch.onnx.export's optimizer merges, drops or folds, undone
             by the import as each node's FX source tells it: zero biases of
             Conv, ConvTranspose and Linear restored, two LayerNorms' weights
             apart again, a LayerNorm without weight reading a frozen copy of
             the ones it shares with a parameter, a tied weight's transposed
             copy computed from it (both exporters fold that one); the
             trained weights merged back into the file (`sdc merge`) give
             PyTorch's loss in ONNX Runtime
  weight norm  weight_norm's g * v / |v|, folded by the optimizer into one
             initializer: sdc cannot derive it again and warns once
  token types  an embedding picked by a buffer of zeros (BERT's token
             types), folded into a constant of repeated rows: warned once
  trainnorm  a BatchNorm1d in train mode, dynamo export (written as an
             inference node; the FX source in its metadata says train mode),
             its running variance by PyTorch's rule (the unbiased batch's)
  mixednorms a train-mode BatchNorm1d and a LayerNorm whose fresh weights the
             optimizer merged: the BatchNorm reads its own again
  convnorm   a Conv then a BatchNorm2d in train mode: the default export's
             optimizer folds the norm into the Conv (refused in one line);
             with optimize=False it trains as PyTorch's
  frozennorm a fresh BatchNorm1d kept in eval mode (frozen statistics, as
             when fine-tuning a detector): the exporters keep one initializer
             per value, so its running mean is its zero bias and its running
             variance its unit scale (dynamo reads them directly, TorchScript
             through Identity nodes); the statistics must stay put while the
             parameters train
"""
import json
import os
import sys
import tempfile

import numpy as np

from e2e_util import losses_of, report_checks, sh, tool_paths

RESULTS = []
STEPS, LR = 4, 1e-2


def check(name, ok, detail):
    RESULTS.append((name, bool(ok), detail))


def models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.head, self.temperature = nn.Linear(4, 1), nn.Parameter(torch.tensor(1.5))

        def forward(self, x, y, weight):
            pred = self.head(x).squeeze(-1) * self.temperature
            keep = weight > 0.5
            return ((pred[keep] - y[keep]) ** 2).mean()

    class Activations(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(5, 16), nn.Linear(16, 16), nn.Linear(16, 1)
            self.prelu = nn.PReLU(16, init=0.2)

        def forward(self, x, y):
            h = self.a(x)
            h = F.leaky_relu(h, 0.1) + F.elu(h) + F.softplus(h) + F.mish(h) + F.hardswish(3 * h)
            h = self.prelu(self.b(h)) + F.softsign(h) + F.selu(h)
            h = torch.maximum(h, -h * 0.5) + h.amax(1, keepdim=True) + torch.logsumexp(h, 1, keepdim=True)
            return F.smooth_l1_loss(self.c(h).squeeze(-1), y)

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down, self.norm = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.GroupNorm(2, 8)
            self.up, self.out = nn.ConvTranspose2d(8, 4, 2, stride=2), nn.Conv2d(7, 3, 1)

        def forward(self, x, target):
            h = F.relu(self.norm(self.down(x)))
            return F.mse_loss(self.out(torch.cat([self.up(h), x], 1)), target)

    class Sequence(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(6, 6)

        def forward(self, x, index, target):
            c = torch.cumsum(self.linear(x), 1)
            picked = F.pad(torch.gather(c, 1, index), (1, 2), value=0.5)
            return (picked.repeat(1, 2) - target).abs().mean()

    class Weighted(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(6, 4)
            self.register_buffer("class_weight", torch.tensor([0.5, 2.0, 1.0, 1.5]))

        def forward(self, x, label, weight):
            logits = self.linear(x)
            per_sample = F.cross_entropy(logits, label, reduction="none") * weight
            return (F.cross_entropy(logits, label, weight=self.class_weight) + per_sample.mean()
                    + F.nll_loss(F.log_softmax(logits, 1), label, ignore_index=0))

    class Upsample(nn.Module):
        def __init__(self):
            super().__init__()
            # No bias before the norm: its gradient is 0 up to rounding, which AdamW turns into +-lr steps.
            self.a, self.b = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.Conv2d(4, 3, 3)
            self.norm = nn.InstanceNorm2d(4, affine=True)

        def forward(self, x, target):
            h = F.interpolate(self.norm(self.a(x)), scale_factor=2, mode="bilinear", align_corners=False)
            h = self.b(F.pad(h, (1, 1, 1, 1)))
            return F.mse_loss(F.interpolate(h, size=(12, 10), mode="nearest"), target)

    class Routed(nn.Module):
        def __init__(self):
            super().__init__()
            # No bias on k: it would shift each row's logits evenly, a zero
            # gradient up to rounding that AdamW turns into +-lr steps.
            self.q, self.k, self.router = nn.Linear(6, 6), nn.Linear(6, 6, bias=False), nn.Linear(6, 3)
            self.experts = nn.Linear(6, 18)

        def forward(self, x, target):
            scores = torch.einsum("btd,bsd->bts", self.q(x), self.k(x))
            scores = torch.tril(scores) - torch.triu(torch.full_like(scores, 1e4), 1)
            h = torch.einsum("bts,bsd->btd", scores.softmax(-1), x)
            gate, _ = self.router(h).softmax(-1).topk(2, -1)
            mixed = self.experts(h).reshape(*h.shape[:2], 3, 6)[:, :, :2] * gate.unsqueeze(-1)
            flipped = torch.flip(mixed.sum(2), [1])
            out = flipped.clone()
            out[:, 0] = torch.atan(flipped[:, 1]) + torch.tan(flipped[:, 0] * 0.3)
            out = out.scatter(2, torch.tensor([[[5], [0], [2], [1]]]).expand(out.shape[0], 4, 1), h[:, :, :1])
            return F.mse_loss(out, target)

    class SuperRes(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 12, 3), nn.Conv2d(3, 3, 3)

        def forward(self, x, target):
            h = F.pixel_shuffle(self.a(F.pad(x, (1, 1, 1, 1), mode="reflect")), 2)
            h = self.b(F.pad(h, (2, 0, 0, 2), mode="replicate"))
            return F.mse_loss(F.pixel_unshuffle(h, 2), target)

    class FrozenNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm = nn.Linear(6, 6), nn.BatchNorm1d(4)
            self.eval()

        def forward(self, x, target):
            return F.mse_loss(self.norm(self.linear(x)), target)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            # No biases: attention's key bias gets a zero gradient up to
            # rounding, which AdamW turns into +-lr steps.
            self.layer = nn.TransformerEncoderLayer(6, 2, 12, dropout=0.0, batch_first=True, bias=False)

        def forward(self, x, target):
            return F.mse_loss(self.layer(x), target)

    class Merged(nn.Module):
        # Fresh parameters of equal value, which torch.onnx.export's optimizer
        # merges or drops: zero biases (removed from Conv, ConvTranspose and
        # Gemm), two LayerNorms' ones and zeros (one pair read by both), a
        # LayerNorm without weight (its constant ones merged with a parameter
        # of ones), and a tied weight read directly and transposed (a folded copy).
        def __init__(self):
            super().__init__()
            self.conv, self.up = nn.Conv2d(2, 3, 3), nn.ConvTranspose2d(3, 2, 2)
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)
            self.ln1, self.ln2, self.plain = nn.LayerNorm(6), nn.LayerNorm(6), nn.LayerNorm(6, elementwise_affine=False)
            self.scale = nn.Parameter(torch.ones(6))
            for m in (self.conv, self.up, self.a, self.b):
                nn.init.zeros_(m.bias)

        def forward(self, x, y):
            h = self.up(self.conv(x)).flatten(1)[:, :6]
            h = self.plain(self.ln2(self.b(self.ln1(self.a(h)))))
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scale
            return F.mse_loss(h + y @ self.a.weight.T, y)

    class TokenTypes(nn.Module):
        # BERT's token type embedding, picked by a buffer of zeros: the
        # optimizer folds the gather into a constant whose rows repeat.
        def __init__(self):
            super().__init__()
            self.words, self.types, self.head = nn.Embedding(10, 6), nn.Embedding(2, 6), nn.Linear(6, 3)
            self.register_buffer("type_ids", torch.zeros(1, 4, dtype=torch.long))

        def forward(self, x, target):
            h = self.words((x[:, :, 0] > 0).long() * 3) + self.types(self.type_ids)
            return F.mse_loss(self.head(h.mean(1)), target[:, 0, :3])

    class WeightNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.utils.parametrizations.weight_norm(nn.Linear(6, 6)), nn.Linear(6, 6)

        def forward(self, x, target):
            return F.mse_loss(self.b(torch.tanh(self.a(x))), target)

    class Spatial(nn.Module):
        def __init__(self):
            super().__init__()
            self.localize, self.conv = nn.Linear(12, 6), nn.Conv2d(1, 2, 3, padding=1)

        def forward(self, x, target):
            theta = self.localize(x.flatten(1)).reshape(-1, 2, 3)
            grid = F.affine_grid(theta, [x.shape[0], 2, 3, 4], align_corners=False)
            warped = F.grid_sample(self.conv(x.unsqueeze(1)), grid, align_corners=False, padding_mode="border")
            return F.mse_loss(warped.mean(1), target)

    class Patches(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.mix = nn.Conv2d(1, 2, 1), nn.Linear(8, 8)

        def forward(self, x, target):
            columns = F.unfold(self.conv(x.unsqueeze(1)), 2, stride=1, padding=1)  # overlapping 2x2 blocks
            mixed = self.mix(columns.transpose(1, 2)).transpose(1, 2)
            return F.mse_loss(F.fold(mixed, (3, 4), 2, stride=1, padding=1).mean(1), target)

    class TrainNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm, self.head = nn.Linear(6, 6, bias=False), nn.BatchNorm1d(4), nn.Linear(6, 3)

        def forward(self, x, label):  # x [batch, 4 channels, 6]
            return F.cross_entropy(self.head(F.relu(self.norm(self.linear(x))).mean(1)), label)

    class MixedNorms(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm, self.ln = nn.Linear(6, 6, bias=False), nn.BatchNorm1d(6), nn.LayerNorm(6)
            self.head = nn.Linear(6, 3)

        def forward(self, x, label):  # x [batch, 6 channels, 6]
            return F.cross_entropy(self.head(self.ln(F.relu(self.norm(self.linear(x)))).mean(1)), label)

    class ConvNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm, self.head = nn.Conv2d(2, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.Linear(4, 3)

        def forward(self, x, label):  # x [batch, 2, 5, 5]
            return F.cross_entropy(self.head(F.relu(self.norm(self.conv(x))).mean((2, 3))), label)

    class Products(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(6, 6)

        def forward(self, x, target):
            h = self.linear(x)
            gates = torch.prod(torch.sigmoid(h).reshape(-1, 2, 3), -1)  # ReduceProd
            return (gates.mean() + torch.linalg.vector_norm(h - target, 3, -1).mean()  # Pow with an integer 3
                    + torch.log(torch.sigmoid(h).sum(-1)).mean())

    class Bags(nn.Module):
        def __init__(self):
            super().__init__()
            self.mean, self.sum = nn.EmbeddingBag(10, 6, mode="mean"), nn.EmbeddingBag(10, 6, mode="sum")
            self.head = nn.Linear(6, 3)

        def forward(self, ids, label):
            return F.cross_entropy(self.head(torch.tanh(self.mean(ids) + self.sum(ids))), label)

    return (Masked, Activations, UNet, Sequence, Weighted, Upsample, Routed, SuperRes, FrozenNorm, Encoder, Merged,
            WeightNorm, TokenTypes, Spatial, Patches, TrainNorm, MixedNorms, ConvNorm, Products, Bags)


def data_for(name, rng, n):
    if name == "Masked":
        x = rng.standard_normal((n, 4)).astype(np.float32)
        weight = rng.random(n).astype(np.float32)
        weight[:8] = 0.9  # the first batch keeps every row, the others some
        return {"x": x, "y": (x @ np.array([1, -2, 0.5, 3], np.float32)).astype(np.float32), "weight": weight}
    if name == "Activations":
        return {"x": rng.standard_normal((n, 5)).astype(np.float32), "y": rng.standard_normal(n).astype(np.float32)}
    if name == "UNet":
        return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32),
                "target": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)}
    if name == "Upsample":
        return {"x": rng.standard_normal((n, 3, 5, 4)).astype(np.float32),
                "target": rng.standard_normal((n, 3, 12, 10)).astype(np.float32)}
    if name in ("Spatial", "Patches"):
        return {"x": rng.standard_normal((n, 3, 4)).astype(np.float32),
                "target": rng.standard_normal((n, 3, 4)).astype(np.float32)}
    if name == "Bags":
        return {"ids": rng.integers(0, 10, (n, 3)), "label": rng.integers(0, 3, n)}
    if name == "Products":
        return {"x": rng.standard_normal((n, 6)).astype(np.float32), "target": rng.standard_normal((n, 6)).astype(np.float32)}
    if name == "Merged":
        return {"x": rng.standard_normal((n, 2, 5, 5)).astype(np.float32),
                "y": rng.standard_normal((n, 6)).astype(np.float32)}
    if name in ("Routed", "FrozenNorm", "Encoder", "WeightNorm", "TokenTypes"):
        return {"x": rng.standard_normal((n, 4, 6)).astype(np.float32),
                "target": rng.standard_normal((n, 4, 6)).astype(np.float32)}
    if name == "SuperRes":
        return {"x": rng.standard_normal((n, 3, 5, 4)).astype(np.float32),
                "target": rng.standard_normal((n, 12, 5, 4)).astype(np.float32)}
    if name == "TrainNorm":
        return {"x": rng.standard_normal((n, 4, 6)).astype(np.float32), "label": rng.integers(0, 3, n)}
    if name == "MixedNorms":
        return {"x": rng.standard_normal((n, 6, 6)).astype(np.float32), "label": rng.integers(0, 3, n)}
    if name == "ConvNorm":
        return {"x": rng.standard_normal((n, 2, 5, 5)).astype(np.float32), "label": rng.integers(0, 3, n)}
    if name == "Weighted":
        return {"x": rng.standard_normal((n, 6)).astype(np.float32), "label": rng.integers(0, 4, n).astype(np.int64),
                "weight": rng.random(n).astype(np.float32)}
    return {"x": rng.standard_normal((n, 6)).astype(np.float32), "index": rng.integers(0, 6, (n, 3)).astype(np.int64),
            "target": rng.standard_normal((n, 12)).astype(np.float32)}


def train_and_compare(sdc, sdrun, tmp, cls, dynamo, batch=8, merge=False, **export_options):
    import torch
    from safetensors.numpy import load_file
    how = "dynamo" if dynamo else "torchscript"
    tag = f"{cls.__name__}_{how}"
    data = data_for(cls.__name__, np.random.default_rng(5), batch * STEPS)
    torch.manual_seed(0)
    model = cls()
    path, plan = os.path.join(tmp, tag + ".onnx"), os.path.join(tmp, tag + ".sdp")
    example = tuple(torch.tensor(v[:batch]) for v in data.values())
    extra = dict({} if dynamo else {"opset_version": 17}, **export_options)
    torch.onnx.export(model, example, path, input_names=list(data), output_names=["loss"], dynamo=dynamo, **extra)
    compile_cmd = [sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", plan]
    sh(compile_cmd)
    listed = sh(compile_cmd + ["--dry-run"])
    folder = os.path.join(tmp, tag + "_data")
    os.makedirs(folder, exist_ok=True)
    for name, value in data.items():
        np.save(os.path.join(folder, f"{name}.npy"), value)
    metrics, weights = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag + ".safetensors")
    sh([sdrun, "train", plan, "--data", folder, "--steps", str(STEPS), "--lr", str(LR), "--no-shuffle",
        "--threads", "2", "--metrics", metrics, "--save-weights", weights])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0)
    want = []
    for step in range(STEPS):
        rows = slice(step * batch, step * batch + batch)
        loss = model(*(torch.tensor(v[rows]) for v in data.values()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    ours = losses_of(metrics)
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == len(want) else float("inf")
    got = load_file(weights)
    params = dict(model.named_parameters())
    diffs = {k: float(np.max(np.abs(got[k] - params[k].detach().numpy()))) for k in params if k in got}
    # A Linear on 3-D input exports as MatMul with a transposed copy of its
    # weight. The dynamo exporter's FX sources name the weight, which sdc
    # restores; TorchScript's copy keeps the exporter's name
    # (onnx::MatMul_N): the closest of the saved tensors shaped like that
    # copy stands for it.
    for k, p in params.items():
        v = p.detach().numpy()
        copies = [float(np.max(np.abs(a - v.T))) for a in got.values() if k not in got and v.ndim == 2
                  and a.shape == v.T.shape and not dynamo]
        if copies:
            diffs[k] = min(copies)
    trainable = int(listed.split("trainable parameters: ")[1].split()[0])
    # Running statistics (BatchNorm's, which trained along): saved under
    # PyTorch's buffer names, equal to its buffers. A dynamo export's norm
    # is PyTorch's, whose running variance takes the unbiased batch
    # variance; a TorchScript export's is ONNX's training_mode, the biased.
    for k, b in model.named_buffers():
        if (k.endswith("running_mean") or (dynamo and k.endswith("running_var"))) and k in got:
            diffs[k] = float(np.max(np.abs(got[k] - b.numpy())))
    merged_rel = None
    if merge:
        # The trained weights merged into the exported file (`sdc merge`,
        # which repairs the file as the training import did): ONNX Runtime's
        # loss on the first batch equals the trained PyTorch model's.
        import onnxruntime as ort
        merged = os.path.join(tmp, tag + "_merged.onnx")
        sh([sdc, "merge", path, "--weights", weights, "-o", merged])
        first = {k: v[:batch] for k, v in data.items()}
        theirs = ort.InferenceSession(merged, providers=["CPUExecutionProvider"]).run(None, first)[0]
        with torch.no_grad():
            want_loss = model(*(torch.tensor(v) for v in first.values())).item()
        merged_rel = abs(float(theirs) - want_loss) / abs(want_loss)
    return (rel, diffs, len(params), (trainable, sum(p.numel() for p in params.values())), cuda_bound(sdrun, plan),
            merged_rel)


def cuda_bound(sdrun, plan):
    """Whether every step of the plan's entries binds to a CUDA kernel
    (`sdrun inspect --kernels cuda`, no GPU needed); None in a build without
    the CUDA backend."""
    import subprocess
    r = subprocess.run([sdrun, "inspect", plan, "--kernels", "cuda"], capture_output=True, text=True)
    if "no backend 'cuda' in this build" in r.stderr:
        return None
    return r.returncode == 0 and "every step runs on 'cuda'" in r.stdout


def conv_norm_exports(sdc, tmp, cls):
    """cls (a Conv then a BatchNorm) exported with torch.onnx.export's
    defaults: in train mode refused for training in one line naming the
    folded norm and optimize=False, with no plan left; in eval mode warned."""
    import subprocess
    import torch
    from e2e_util import clean_error_problems
    data = data_for(cls.__name__, np.random.default_rng(5), 8)
    torch.manual_seed(0)
    path, plan = os.path.join(tmp, "conv_norm_default.onnx"), os.path.join(tmp, "conv_norm_default.sdp")
    torch.onnx.export(cls(), tuple(torch.tensor(v) for v in data.values()), path, input_names=list(data),
                      output_names=["loss"])
    problems, line = clean_error_problems([sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", plan],
                                          ["train-mode BatchNorm folded", "optimize=False"], [plan])
    check("a Conv then a train-mode BatchNorm2d, exported with the defaults (the optimizer folds the norm into the "
          "Conv): training is refused in one line naming optimize=False", not problems, "; ".join(problems) or line)
    # In eval mode the fold is exact, so LoRA's forward is PyTorch's; full
    # fine-tuning would freeze the Conv's product weight: warned.
    torch.onnx.export(cls().eval(), tuple(torch.tensor(v) for v in data.values()), path, input_names=list(data),
                      output_names=["loss"])
    r = subprocess.run([sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", plan],
                       capture_output=True, text=True)
    check("the same in eval mode (the norm folded into the Conv exactly): full fine-tuning compiles with a warning "
          "naming the Conv and optimize=False", r.returncode == 0 and "(Conv) holds PyTorch's eval-mode BatchNorm"
          in r.stderr and "optimize=False" in r.stderr, f"rc {r.returncode}: {r.stderr.strip()[-400:]}")


def trains_like_torch(sdc, sdrun, tmp, cls, dynamo, what, every_name=True, rel_tol=1e-4, statistics=(), merge=False,
                      whole=True, **export_options):
    """One check: cls exported one way trains in sdrun as in PyTorch, per-step
    losses within rel_tol, the trained weights within 1e-5 (every parameter
    found by name or as a transposed copy, or with every_name=False those
    found: exporters rename the copies they fold; the running statistics named in
    `statistics` too), and the trainable count is the model's parameter
    count (with whole=False less than that: the file holds only the rows of a
    parameter the model reads)."""
    how = ("dynamo" if dynamo else "torchscript") + "".join(f", {k}={v}" for k, v in export_options.items())
    rel, diffs, n, counted, cuda, merged_rel = train_and_compare(sdc, sdrun, tmp, cls, dynamo, merge=merge,
                                                                 **export_options)
    counted = counted[0] == counted[1] if whole else 0 < counted[0] < counted[1]
    named = len([k for k in diffs if not k.endswith(("running_mean", "running_var"))])
    found = (named == n if every_name else named > 0) and all(k in diffs for k in statistics)
    check(f"{what.format(how=how)}: {STEPS} losses and the weights equal PyTorch's; exactly the model's parameters "
          "train; every step has a CUDA kernel (where the build has the backend)",
          rel < rel_tol and found and max(diffs.values(), default=1) < 1e-5 and counted and cuda is not False
          and (not merge or merged_rel < rel_tol),
          f"max relative loss diff {rel:.2e}; {named} of {n} parameters by name or as a transposed copy"
          f"{f' and the running statistics {list(statistics)}' if statistics else ''}, max |diff| "
          f"{max(diffs.values(), default=-1):.2e}; trainable count right: {counted}; CUDA kernels for every step: "
          f"{'no CUDA backend in this build' if cuda is None else cuda}"
          f"{f'; merged into the file, ONNX Runtime loss rel diff {merged_rel:.2e}' if merge else ''}")


def main():
    sdc, sdrun = tool_paths()
    import torch
    torch.set_num_threads(1)
    (Masked, Activations, UNet, Sequence, Weighted, Upsample, Routed, SuperRes, FrozenNorm, Encoder,
     Merged, WeightNorm, TokenTypes, Spatial, Patches, TrainNorm, MixedNorms, ConvNorm, Products, Bags) = models()
    with tempfile.TemporaryDirectory() as tmp:
        run = lambda *args, **kw: trains_like_torch(sdc, sdrun, tmp, *args, **kw)
        both = (False, True)
        for dynamo in both:
            run(Masked, dynamo, "masked regression loss ({how}: the one-element bias and the scalar temperature "
                "train too)", rel_tol=1e-5)
        run(Activations, True, "activations ({how}: LeakyReLU, ELU, Softplus, Mish, Hardswish, PReLU, Softsign, "
            "SELU, maximum, amax, logsumexp, smooth L1; PReLU's slope restored from dynamo's reshaped copy)")
        for dynamo in both:
            # Both exporters fold GroupNorm's weight and bias into reshaped
            # copies. Dynamo's FX sources name them, and sdc restores them;
            # TorchScript's (onnx::Mul_N) train under those names.
            run(UNet, dynamo, "UNet-like ({how}: strided Conv, GroupNorm, ConvTranspose, Concat, MSE; not the "
                "exporter's InstanceNormalization ones and zeros)", every_name=dynamo)
        run(Sequence, True, "sequence ops ({how}: cumsum, gather, pad, repeat, L1)")
        for dynamo in both:
            run(Weighted, dynamo, "weighted losses ({how}: class-weighted cross-entropy, per-sample weights over "
                "reduction none, nll_loss with ignore_index; the class weights stay frozen)", rel_tol=1e-5)
            run(Upsample, dynamo, "upsampling ({how}: bilinear F.interpolate, nearest to a size, InstanceNorm2d "
                "affine, F.pad)")
            run(Routed, dynamo, "routed ({how}: einsum attention under a tril mask, a top-2 router, flip, a row "
                "write and a scatter, atan, tan)")
            run(SuperRes, dynamo, "super-resolution ({how}: reflect and replicate padding, pixel_shuffle, "
                "pixel_unshuffle)")
            run(FrozenNorm, dynamo, "frozen BatchNorm ({how}: eval mode, its running statistics merged by the "
                "exporter with its bias and scale, which train while the statistics stay)", rel_tol=1e-5)
            # Dynamo's optimizer merges the two LayerNorms' unit weights;
            # TorchScript splits the attention's in_proj_weight into renamed copies.
            run(Encoder, dynamo, "transformer encoder layer ({how}: multi-head attention, two LayerNorms the "
                "optimizer merged, ReLU MLP)")
            run(Merged, dynamo, "merged parameters ({how}: zero biases restored, merged LayerNorm weights untied, a "
                "LayerNorm without weight reading a frozen copy, a tied weight's transposed copy refolded; merged "
                "back into the file)", merge=True)
            # TorchScript exports affine_grid from opset 20 on, fold (Col2Im) from 18 on.
            run(Spatial, dynamo, "spatial transformer ({how}: a localization head's theta through AffineGrid into "
                "GridSample with border padding)", **({} if dynamo else {"opset_version": 20}))
            # Dynamo writes each bag as a Loop inserting into a sequence.
            run(Bags, dynamo, "embedding bags ({how}: nn.EmbeddingBag mean and sum)")
            run(Products, dynamo, "products and norms ({how}: torch.prod, vector_norm with p=3, log of a sum)")
            run(Patches, dynamo, "overlapping patches ({how}: F.unfold, a Linear over each patch, F.fold back: "
                "Col2Im's gradient)", **({} if dynamo else {"opset_version": 18}))
        # torch.onnx.export's default exporter writes a train-mode BatchNorm as
        # an inference node (and its optimizer merges the fresh statistics
        # with the norm's bias and scale); its FX source says train mode.
        for optimize in (True, False):
            run(TrainNorm, True, "train-mode BatchNorm1d ({how}: normalized by each batch, its running mean and "
                "variance updated as PyTorch's (the unbiased batch variance) and saved under their buffer names, "
                "where the optimizer merged them with the zero bias and unit scale too)",
                statistics=("norm.running_mean", "norm.running_var"), optimize=optimize)
        # A train-mode BatchNorm and a LayerNorm of equal fresh weights: the
        # optimizer keeps one initializer for both norms' scales and one for
        # their biases; the BatchNorm gets its own again.
        run(MixedNorms, True, "a train-mode BatchNorm1d and a LayerNorm of equal fresh weights ({how}: each norm's "
            "scale and bias its own again)", statistics=("norm.running_mean", "norm.running_var"))
        # A Conv before it: the optimizer folds the fresh norm (an inference
        # node of unit statistics) into the Conv, and the batch statistics
        # are lost; the training import refuses that export in one line.
        conv_norm_exports(sdc, tmp, ConvNorm)
        run(ConvNorm, True, "train-mode BatchNorm2d after a Conv ({how}: normalized by each batch, the running "
            "statistics as PyTorch's)", statistics=("norm.running_mean", "norm.running_var"), optimize=False)
        warned = folded_weight_warning(sdc, tmp, WeightNorm, "'a.parametrizations.weight.original0', "
                                       "'a.parametrizations.weight.original1' and trains as one tensor")
        check("weight_norm's parameters, which torch.onnx.export's optimizer folds into one weight (dynamo), get "
              "one warning naming them; with optimize=False (the parameters in the file) no warning comes",
              warned[0] and not warned[1], f"stderr: {warned[2]!r}; with optimize=False: {warned[3]!r}")
        # The optimizer folds the token type rows, picked for every position,
        # into a constant of repeated rows: sdc trains the row once (its
        # gradient summed over the positions, as PyTorch's), under the copy's
        # name + ".rows", and says so once.
        run(TokenTypes, True, "token types ({how}: an embedding gathered by a buffer of zeros, which the optimizer "
            "folds into repeated rows, trained once; merged back into the file)", every_name=False, whole=False,
            merge=True)
        warned = folded_weight_warning(sdc, tmp, TokenTypes, "holds the rows torch.onnx.export's optimizer gathered "
                                       "from the parameter 'types.weight' for every batch item or position")
        check("a token type embedding gathered by a buffer of zeros (dynamo) gets one warning saying under which name "
              "its rows train; with optimize=False no warning comes",
              warned[0] and not warned[1], f"stderr: {warned[2]!r}; with optimize=False: {warned[3]!r}")
    return report_checks("user_training", RESULTS)


def folded_weight_warning(sdc, tmp, cls, want):
    """(warned by default, warned with optimize=False, the two stderrs) of
    `sdc compile --peft none` on cls's dynamo exports."""
    import subprocess
    import torch
    stderrs = []
    for optimize in (True, False):
        path = os.path.join(tmp, f"folded_{cls.__name__}_{optimize}.onnx")
        example = (torch.zeros(2, 4, 6), torch.zeros(2, 4, 6))
        torch.onnx.export(cls(), example, path, input_names=["x", "target"], output_names=["loss"], dynamo=True,
                          optimize=optimize)
        r = subprocess.run([sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", path + ".sdp"],
                           capture_output=True, text=True)
        stderrs.append(r.stderr.strip() if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()}")
    return (stderrs[0].count("\n") == 0 and want in stderrs[0], "warning" in stderrs[1], *stderrs)


if __name__ == "__main__":
    sys.exit(main())
