#!/usr/bin/env python3
"""Dropout against PyTorch: LoRA's, and a model's own nn.Dropout exported in
train mode. For LoRA: sdrun's masks come from a counter-based
generator (kernels/include/sd/ops/counter_rng.h: SplitMix64 keyed by the run's
seed, the micro-batch counter and the adapted layer's stream); this test
rebuilds the same masks in NumPy and applies them in a PyTorch LoRA model, so
per-step losses and the trained adapter must agree. Also: eval has no dropout,
the seed changes the masks, adapter_config.json records lora_dropout, and a
resumed run reproduces the straight one bit for bit (the counter is
checkpointed). For a user's model exported by torch.onnx.export's defaults
while in train() (its Dropouts written with training_mode true, Dropout2d as
RandomUniformLike < keep, torch.randn_like as RandomNormalLike): full
fine-tuning draws with the k-th Dropout or random node drawing stream 2^32 +
k, so the losses and weights equal PyTorch's with those draws, and eval has
no dropout and takes the noise's mean."""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import clean_error_problems, sh, tool_paths
from test_training import (ADAM_EPS, BATCH, SEQ, adapter_diff, add_lora, check, export_base, make_data, padded_batch,
                           read_safetensors, report, torch_losses, write_initial_adapter)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
STEPS, P, SEED = 20, 0.1, 5
GAMMA = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


def mix(z):
    """SplitMix64's output function on uint64 arrays."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def draw_bits(seed, counter, stream, n):
    """The 64 random bits of elements 0..n-1 (counterRngKey, counterRngBits)."""
    with np.errstate(over="ignore"):
        k = mix(np.array([((seed ^ (stream * 0xD1B54A32D192ED03 & MASK64)) + GAMMA) & MASK64], np.uint64))
        k = mix(np.array([((int(k[0]) ^ counter) + GAMMA) & MASK64], np.uint64))
        states = k + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(GAMMA)
        return mix(states)


def keep_mask(seed, counter, stream, n, p):
    bits = draw_bits(seed, counter, stream, n)
    return (bits >> np.uint64(40)).astype(np.uint32) >= np.uint32(int(p * (1 << 24)))


def uniform(seed, counter, stream, n):
    """counterUniform: the top 24 bits in [0, 1)."""
    return (draw_bits(seed, counter, stream, n) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def normal(seed, counter, stream, n):
    """counterNormal: Box-Muller on the top 24 bits (moved into (0, 1]) and the next 24."""
    bits = draw_bits(seed, counter, stream, n)
    u1 = ((bits >> np.uint64(40)) + np.uint64(1)).astype(np.float32) * np.float32(2.0 ** -24)
    u2 = ((bits >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(2.0 ** -24)
    return np.sqrt(np.float32(-2) * np.log(u1)) * np.cos(np.float32(6.2831853071795865) * u2)


class Dropout:
    """Counter-based dropout as sdrun applies it: streams are the adapted
    layers in forward order, the counter advances once per micro-batch."""

    def __init__(self, seed, p):
        self.seed, self.p, self.counter, self.streams, self.active = seed, p, -1, {}, True

    def next_micro_batch(self):
        self.counter += 1

    def __call__(self, x, layer):
        import torch
        if not self.active:
            return x
        stream = self.streams.setdefault(id(layer), len(self.streams))
        keep = keep_mask(self.seed, self.counter, stream, x.numel(), self.p).reshape(tuple(x.shape))
        return x * torch.tensor(keep, dtype=x.dtype) * (1.0 / (1.0 - self.p))


EXPORTED_STREAM = 1 << 32  # kExportedDropoutStream in ImporterContext.h


def torch_adamw_losses(model, x, y, batch, steps, lr, next_micro_batch):
    """PyTorch's AdamW (no weight decay) over the batches in order, calling
    next_micro_batch() before each forward; the per-step losses."""
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0)
    losses = []
    for step in range(steps):
        next_micro_batch()
        rows = slice(step * batch, step * batch + batch)
        loss = model(torch.tensor(x[rows]), torch.tensor(y[rows]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def exported_dropout(sdc, sdrun, tmp):
    """A model in train() with two nn.Dropout, exported the default way."""
    import torch
    from safetensors.numpy import load_file
    vocab, d, batch, seq, steps, seed, lr = 32, 16, 4, 8, 6, 7, 1e-2

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, d), torch.nn.Linear(d, vocab)
            self.drop1, self.drop2 = torch.nn.Dropout(0.2), torch.nn.Dropout(0.1)

        def forward(self, x, y):
            h = self.drop2(torch.nn.functional.gelu(self.lin(self.drop1(self.emb(x)))))
            return torch.nn.functional.cross_entropy(self.head(h).reshape(-1, vocab), y.reshape(-1))

    rng = np.random.default_rng(3)
    x = rng.integers(0, vocab, (batch * steps, seq)).astype(np.int64)
    y = rng.integers(0, vocab, (batch * steps, seq)).astype(np.int64)
    torch.manual_seed(0)
    model = Net()  # in train mode, as a fresh module is
    path, plan = os.path.join(tmp, "dropout_net.onnx"), os.path.join(tmp, "dropout_net.sdp")
    torch.onnx.export(model, (torch.tensor(x[:batch]), torch.tensor(y[:batch])), path, input_names=["x", "y"],
                      output_names=["loss"])
    sh([sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", plan])
    folder, evals = os.path.join(tmp, "dropout_net_data"), os.path.join(tmp, "dropout_net_eval")
    for f, rows in ((folder, slice(None)), (evals, slice(0, batch))):
        os.makedirs(f, exist_ok=True)
        np.save(os.path.join(f, "x.npy"), x[rows])
        np.save(os.path.join(f, "y.npy"), y[rows])
    metrics, weights = os.path.join(tmp, "dropout_net.jsonl"), os.path.join(tmp, "dropout_net.safetensors")
    sh([sdrun, "train", plan, "--data", folder, "--steps", str(steps), "--lr", str(lr), "--no-shuffle", "--seed",
        str(seed), "--threads", "2", "--metrics", metrics, "--save-weights", weights, "--eval-data", evals,
        "--eval-every", str(steps)])
    lines = [json.loads(l) for l in open(metrics)]
    ours, eval_loss = [l["loss"] for l in lines if "loss" in l], [l["eval_loss"] for l in lines if "eval_loss" in l]

    state = {"counter": -1}
    for k, drop in enumerate((model.drop1, model.drop2)):
        def masked(h, p=drop.p, stream=EXPORTED_STREAM + k, module=drop):
            if not module.training:
                return h
            keep = keep_mask(seed, state["counter"], stream, h.numel(), p).reshape(tuple(h.shape))
            return h * torch.tensor(keep, dtype=h.dtype) * (1.0 / (1.0 - p))
        drop.forward = masked
    want = torch_adamw_losses(model, x, y, batch, steps, lr, lambda: state.update(counter=state["counter"] + 1))
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == steps else float("inf")
    got = load_file(weights)
    params = {k: p.detach().numpy() for k, p in model.named_parameters()}
    worst = max((float(np.max(np.abs(got[k] - v))) for k, v in params.items() if k in got), default=float("inf"))
    check(f"exported nn.Dropout (train mode, dynamo default): {steps} losses and the {len(params)} weights equal "
          "PyTorch with the same masks (1e-4)", rel < 1e-4 and worst < 1e-4 and set(params) <= set(got),
          f"max rel loss diff {rel:.2e}, max weight diff {worst:.2e}, saved {sorted(got)}")
    with torch.no_grad():
        model.eval()
        want_eval = float(model(torch.tensor(x[:batch]), torch.tensor(y[:batch])))
    got_eval = eval_loss[-1] if eval_loss else float("nan")
    check("exported nn.Dropout: eval_loss is computed without dropout (equals PyTorch's eval)",
          abs(got_eval - want_eval) / want_eval < 1e-4, f"{got_eval:.6f} vs {want_eval:.6f}")
    problems, line = clean_error_problems([sdc, "compile", path, "--shapes", f"x={batch}x{seq},y={batch}x{seq}",
                                           "-o", os.path.join(tmp, "dropout_infer.sdp")],
                                          ["Dropout", "eval"], no_files=[os.path.join(tmp, "dropout_infer.sdp")])
    check("exported nn.Dropout: an inference plan of the train-mode export is refused in one line naming "
          "Dropout and eval mode", not problems, "; ".join(problems) or line)


def exported_random(sdc, sdrun, tmp):
    """A model in train() drawing random numbers itself: Dropout2d (a
    Bernoulli mask per channel, which the exporter writes as
    RandomUniformLike < keep) and a VAE's reparameterization noise
    (torch.randn_like: RandomNormalLike). The k-th random node of the file
    draws stream 2^32 + k."""
    import torch
    import torch.nn.functional as F
    batch, steps, seed, lr = 4, 6, 11, 1e-2
    draws = {"counter": -1, "stream": 0, "on": True}

    def next_stream():
        draws["stream"] += 1
        return EXPORTED_STREAM + draws["stream"] - 1

    class Drop2d(torch.nn.Dropout2d):
        def forward(self, h):
            if not self.training:
                return h
            keep = 1.0 - self.p
            u = uniform(seed, draws["counter"], next_stream(), h.shape[0] * h.shape[1])
            mask = torch.tensor(u < np.float32(keep), dtype=h.dtype).reshape(h.shape[0], h.shape[1], 1, 1)
            return h * (mask / keep)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.drop = torch.nn.Conv2d(3, 8, 3), Drop2d(0.25)
            self.mu, self.logvar, self.head = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4), torch.nn.Linear(4, 5)

        def forward(self, x, y):
            h = self.drop(F.relu(self.conv(x))).mean((2, 3))
            mu, logvar = self.mu(h), self.logvar(h)
            if draws["on"]:  # sdrun's draws, rebuilt
                eps = torch.tensor(normal(seed, draws["counter"], next_stream(), mu.numel())).reshape(mu.shape)
            else:  # export: the exporter's own
                eps = torch.randn_like(mu)
            z = mu + torch.exp(0.5 * logvar) * eps
            kl = -0.5 * torch.mean(1 + logvar - mu * mu - logvar.exp())
            return F.cross_entropy(self.head(z), y) + 0.1 * kl

    rng = np.random.default_rng(4)
    x = rng.standard_normal((batch * steps, 3, 6, 6)).astype(np.float32)
    y = rng.integers(0, 5, (batch * steps,)).astype(np.int64)
    torch.manual_seed(0)
    model = Net()
    path, plan = os.path.join(tmp, "random_net.onnx"), os.path.join(tmp, "random_net.sdp")
    draws["on"] = False
    own, Drop2d.forward = Drop2d.forward, torch.nn.Dropout2d.forward  # the export traces torch's own Dropout2d
    torch.onnx.export(model, (torch.tensor(x[:batch]), torch.tensor(y[:batch])), path, input_names=["x", "y"],
                      output_names=["loss"])
    Drop2d.forward, draws["on"] = own, True
    sh([sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", plan])
    folder, evals = os.path.join(tmp, "random_net_data"), os.path.join(tmp, "random_net_eval")
    for f, rows in ((folder, slice(None)), (evals, slice(0, batch))):
        os.makedirs(f, exist_ok=True)
        np.save(os.path.join(f, "x.npy"), x[rows])
        np.save(os.path.join(f, "y.npy"), y[rows])
    metrics = os.path.join(tmp, "random_net.jsonl")
    sh([sdrun, "train", plan, "--data", folder, "--steps", str(steps), "--lr", str(lr), "--no-shuffle", "--seed",
        str(seed), "--threads", "2", "--metrics", metrics, "--eval-data", evals, "--eval-every", str(steps)])
    lines = [json.loads(l) for l in open(metrics)]
    ours, eval_loss = [l["loss"] for l in lines if "loss" in l], [l["eval_loss"] for l in lines if "eval_loss" in l]
    want = torch_adamw_losses(model, x, y, batch, steps, lr,
                              lambda: draws.update(counter=draws["counter"] + 1, stream=0))
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == steps else float("inf")
    from test_user_training import cuda_bound
    cuda = cuda_bound(sdrun, plan)
    check(f"exported Dropout2d and randn_like (train mode, dynamo default): {steps} losses equal PyTorch with the "
          "same draws (1e-4); every step has a CUDA kernel (where the build has the backend)",
          rel < 1e-4 and cuda is not False, f"max rel loss diff {rel:.2e}; ours {ours[:3]}, PyTorch's {want[:3]}; "
          f"CUDA kernels for every step: {'no CUDA backend in this build' if cuda is None else cuda}")
    # Eval: Dropout2d is the identity (its mask's expectation), the noise its mean 0.
    model.eval()
    with torch.no_grad():
        h = F.relu(model.conv(torch.tensor(x[:batch]))).mean((2, 3))
        mu, logvar = model.mu(h), model.logvar(h)
        kl = -0.5 * torch.mean(1 + logvar - mu * mu - logvar.exp())
        want_eval = float(F.cross_entropy(model.head(mu), torch.tensor(y[:batch])) + 0.1 * kl)
    got_eval = eval_loss[-1] if eval_loss else float("nan")
    check("exported Dropout2d and randn_like: eval_loss takes each draw's expectation (no channel dropped, the noise "
          "0), as PyTorch's eval without noise", abs(got_eval - want_eval) / want_eval < 1e-4,
          f"{got_eval:.6f} vs {want_eval:.6f}")
    out = os.path.join(tmp, "random_infer.sdp")
    problems, line = clean_error_problems([sdc, "compile", path, "-o", out], ["RandomUniformLike", "model.eval()"],
                                          no_files=[out])
    check("exported Dropout2d: an inference plan of the train-mode export is refused in one line naming the random "
          "node and model.eval()", not problems, "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_models import Gpt
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="sd_dropout_")
    try:
        base, onnx_path = export_base(tmp)
        data = os.path.join(tmp, "train.jsonl")
        rows = make_data(data, 9, seed=1)
        targets, r, alpha = ["qkv", "fc2", "head"], 4, 8.0
        plan = os.path.join(tmp, "lora.sdp")
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(targets), "--lora-r", str(r),
            "--lora-alpha", str(alpha), "--lora-dropout", str(P), "--shapes", f"input_ids={BATCH}x{SEQ}",
            "--adam-epsilon", str(ADAM_EPS), "-o", plan])
        init_dir, out_dir = os.path.join(tmp, "adapter0"), os.path.join(tmp, "adapter1")
        init = write_initial_adapter(base, targets, r, alpha, init_dir, dropout=P)
        lr, wd, clip = 2e-3, 0.1, 1.0

        def train(metrics, steps, seed, extra=()):
            sh([sdrun, "train", plan, "--data", data, "--steps", str(steps), "--no-shuffle", "--threads", "2",
                "--lr", str(lr), "--weight-decay", str(wd), "--clip-norm", str(clip), "--seed", str(seed),
                "--metrics", metrics, *extra])
            lines = [json.loads(l) for l in open(metrics)]
            return [l["loss"] for l in lines if "loss" in l], [l["eval_loss"] for l in lines if "eval_loss" in l]

        ours, evals = train(os.path.join(tmp, "m.jsonl"), STEPS, SEED,
                            ["--adapter", init_dir, "--save-adapter", out_dir, "--eval-data", data, "--eval-every",
                             str(STEPS)])
        drop = Dropout(SEED, P)
        model = Gpt(d=64, layers=2, heads=4, block=SEQ)
        model.load_state_dict(base.state_dict())
        add_lora(model, targets, r, alpha, init, dropout=drop)
        forward = model.forward

        def counted_forward(ids):
            drop.next_micro_batch()
            return forward(ids)
        model.forward = counted_forward
        ref = torch_losses(model, rows, STEPS, 1, lr, wd, clip)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        check(f"LoRA dropout {P}: {STEPS} per-step losses equal PyTorch with the same masks",
              rel < 1e-4 and len(ours) == STEPS, f"max rel diff {rel:.2e} (first {ref[0]:.4f}, last {ref[-1]:.4f})")

        worst, keys_ok, _ = adapter_diff(model, out_dir)
        cfg = json.load(open(os.path.join(out_dir, "adapter_config.json")))
        check("LoRA dropout: trained adapter equals PyTorch's; adapter_config.json records lora_dropout",
              keys_ok and worst < 1e-4 and abs(cfg["lora_dropout"] - P) < 1e-7, f"max rel diff {worst:.2e}, "
              f"lora_dropout {cfg['lora_dropout']}")

        # Eval runs without dropout: the eval loss equals PyTorch's eval of the trained model.
        drop.active = False
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(rows), BATCH):
                ids, labels = padded_batch(rows[i:i + BATCH])
                logits = forward(ids)
                total += float(torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100,
                    reduction="sum"))
                count += int((labels[:, 1:] != -100).sum())
        want = total / count
        got_eval = evals[-1] if evals else float("nan")
        check("LoRA dropout: eval_loss is computed without dropout (equals PyTorch's eval)",
              abs(got_eval - want) / want < 1e-4, f"{got_eval:.6f} vs {want:.6f}")

        # Another seed draws other masks.
        other, _ = train(os.path.join(tmp, "m2.jsonl"), 3, SEED + 1, ["--adapter", init_dir])
        check("LoRA dropout: another --seed gives other masks (other losses)",
              other[0] != ours[0], f"first loss {other[0]:.6f} vs {ours[0]:.6f}")

        # Resume with dropout: the counter is part of the checkpoint.
        n, ck = 5, os.path.join(tmp, "ck")
        straight_dir, resumed_dir = os.path.join(tmp, "straight"), os.path.join(tmp, "resumed")
        a, _ = train(os.path.join(tmp, "s.jsonl"), 2 * n, SEED, ["--save-adapter", straight_dir])
        train(os.path.join(tmp, "r.jsonl"), n, SEED, ["--checkpoint-dir", ck])
        b, _ = train(os.path.join(tmp, "r.jsonl"), 2 * n, SEED,
                     ["--checkpoint-dir", ck, "--resume", "--save-adapter", resumed_dir])
        wa = read_safetensors(os.path.join(straight_dir, "adapter_model.safetensors"))
        wb = read_safetensors(os.path.join(resumed_dir, "adapter_model.safetensors"))
        same_w = all(np.array_equal(wa[k], wb[k]) for k in wa)
        check(f"LoRA dropout resume: {2 * n} steps straight == {n} + --resume {n}, bit for bit", a == b and same_w,
              f"losses equal: {a == b}, adapter equal: {same_w}")
        exported_dropout(sdc, sdrun, tmp)
        exported_random(sdc, sdrun, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_lora_dropout")


if __name__ == "__main__":
    sys.exit(main())
