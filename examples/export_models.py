#!/usr/bin/env python3
"""Exports the example models with PyTorch's TorchScript-based ONNX exporter
(`dynamo=False`; the project's .venv, see requirements.txt), plus a sample input and PyTorch's output for each:

  gpt.onnx  a GPT-style byte-level decoder (token + position embeddings,
            causal self-attention, GELU MLP, pre-LayerNorm, tied LM head),
            dynamic batch and sequence axes
  cnn.onnx  a small ResNet-style CNN (conv, batch norm, residual blocks,
            max pool, global average pool, linear head)

Usage: export_models.py --out DIR [--opset 17] [--d-model 128] [--layers 2]
       [--heads 4] [--seq 64] [--batch 2] [--seed 0]
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, block):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        hd = c // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, d, gelu="none"):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.gelu = gelu  # "none": the exact GELU; "tanh": GPT-2's gelu_new

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.gelu))


class Block(nn.Module):
    def __init__(self, d, heads, block, gelu="none"):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = Mlp(d, gelu)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=256, d=128, layers=2, heads=4, block=256, gelu="none"):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.blocks = nn.ModuleList([Block(d, heads, block, gelu) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(self, input_ids):
        t = input_ids.shape[1]
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class Cnn(nn.Module):
    def __init__(self, width=32, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.block1 = ResBlock(width)
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.block2 = ResBlock(2 * width)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.block1(x)
        x = self.pool(self.block2(F.relu(self.down(x))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class DepthwiseSeparable(nn.Module):
    """MobileNet-v2-style inverted residual: 1x1 expand, 3x3 depthwise
    (stride 1 or 2), 1x1 project; ReLU6 (Clip) and HardSwish activations,
    residual add when the shape allows."""

    def __init__(self, cin, cout, stride, expand=4):
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(mid, mid, 3, stride=stride, padding=1, groups=mid, bias=False),
                                       nn.BatchNorm2d(mid), nn.Hardswish())
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class MobileNet(nn.Module):
    """A small MobileNet-style classifier: a strided 3x3 stem, then
    depthwise-separable blocks at widths w, 2w, 4w with two stride-2 steps."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.Hardswish())
        self.blocks = nn.Sequential(DepthwiseSeparable(width, width, 1), DepthwiseSeparable(width, 2 * width, 2),
                                    DepthwiseSeparable(2 * width, 2 * width, 1),
                                    DepthwiseSeparable(2 * width, 4 * width, 2),
                                    DepthwiseSeparable(4 * width, 4 * width, 1))
        self.fc = nn.Linear(4 * width, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def export_gpt(gpt, path, ids, opset):
    # Training-mode export keeps every parameter its own initializer: in eval
    # mode the exporter merges initializers with equal values (all fresh
    # LayerNorm weights become one) and folds the tied head into a transposed
    # copy, which would untie weights that training must share.
    torch.onnx.export(gpt, (ids,), path, input_names=["input_ids"], output_names=["logits"], opset_version=opset,
                      dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}})


def randomize_batch_norm(model, gen):
    # Fresh BatchNorm statistics are identity; give them values so the test means something.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


def export_image_model(net, name, args, gen):
    """Eval-mode export with random BatchNorm statistics; saves NAME.onnx,
    the input image and PyTorch's logits for it."""
    randomize_batch_norm(net, gen)
    net.eval()
    img = torch.randn((args.batch, 3, args.image, args.image), generator=gen)
    torch.onnx.export(net, (img,), os.path.join(args.out, f"{name}.onnx"), input_names=["image"],
                      output_names=["logits"], opset_version=args.opset, dynamo=False,
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    with torch.no_grad():
        np.save(os.path.join(args.out, f"{name}_logits_torch.npy"), net(img).numpy())
    np.save(os.path.join(args.out, f"{name}_image.npy"), img.numpy())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--cnn-width", type=int, default=32)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=["gpt", "cnn", "mobilenet"], default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    if args.only in (None, "gpt"):
        gpt = Gpt(d=args.d_model, layers=args.layers, heads=args.heads, block=max(256, args.seq)).eval()
        ids = torch.randint(0, 256, (args.batch, args.seq), generator=gen)
        export_gpt(gpt, os.path.join(args.out, "gpt.onnx"), ids, args.opset)
        with torch.no_grad():
            np.save(os.path.join(args.out, "gpt_logits_torch.npy"), gpt(ids).numpy())
        np.save(os.path.join(args.out, "gpt_input_ids.npy"), ids.numpy())

    if args.only in (None, "cnn"):
        export_image_model(Cnn(width=args.cnn_width), "cnn", args, gen)
    if args.only == "mobilenet":  # not in the default set: the tests do not need it
        export_image_model(MobileNet(width=args.cnn_width), "mobilenet", args, gen)
    print(f"exported to {args.out}")


if __name__ == "__main__":
    main()
