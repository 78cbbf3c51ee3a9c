#!/usr/bin/env python3
"""Models with control flow and recurrent layers, as users bring them:

  silero     Silero VAD from its PyPI wheel (a real speech model: If on the
             sample rate, LSTM): sdrun equals ONNX Runtime, with the rate bound
             (one branch compiled) and as run-time data (both, then selected)
  if         a PyTorch-scripted `if` on an input's values: both ways equal PyTorch
  while      a scripted while loop (ONNX Loop, data-dependent stop) under
             --max-trip: equals PyTorch when it stops in time; past the bound
             the run fails with one clear line and writes no output
  rnn        a GRU/LSTM speech-style tagger (2 layers, bidirectional,
             batch_first) exported by PyTorch (TorchScript and dynamo):
             inference equals PyTorch
  train      a GRU and an LSTM language model trained 10 steps by sdrun and
             by PyTorch (nn.GRU / nn.LSTM, same AdamW): per-step losses agree;
             LoRA on the linear layer before an LSTM trains through it
"""
import importlib.util
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import clean_error_problems, sh, tool_paths
from test_training import ADAM_EPS, BATCH, SEQ, check, make_data, report, torch_losses

STEPS = 10


def run_plan(sdrun, plan, feeds, tmp, tag):
    args = []
    for name, value in feeds.items():
        path = os.path.join(tmp, f"{tag}_{name}.npy")
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    out = os.path.join(tmp, f"{tag}_out")
    sh([sdrun, "infer", plan] + args + ["--output-dir", out, "--output-format", "npy"])
    outs, i = [], 0
    while os.path.exists(os.path.join(out, f"output_{i}.npy")):
        outs.append(np.load(os.path.join(out, f"output_{i}.npy")))
        i += 1
    return outs


def shapes_of(feeds):
    args = []
    for name, v in feeds.items():
        args += ["--shapes", f"{name}=" + ("x".join(map(str, v.shape)) or "scalar")]
    return args


def max_err(got, want):
    return max(float(np.max(np.abs(g - w))) if g.shape == w.shape else float("inf") for g, w in zip(got, want))


def silero(sdc, sdrun, tmp):
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        check("Silero VAD wheel installed (requirements-models.txt)", False, "silero_vad not found")
        return
    data = os.path.join(os.path.dirname(spec.origin), "data")
    rng = np.random.default_rng(0)
    cases = [("silero_vad.onnx", 512, 16000, True), ("silero_vad.onnx", 256, 8000, True),
             ("silero_vad_16k_op15.onnx", 512, 16000, False), ("silero_vad_op18_ifless.onnx", 256, 8000, False)]
    for model, samples, rate, bind in cases:
        path = os.path.join(data, model)
        names = [i.name for i in onnx.load(path).graph.input]
        feeds = {"input": (rng.standard_normal((1, samples)) * 0.1).astype(np.float32),
                 "state": (rng.standard_normal((2, 1, 128)) * 0.1).astype(np.float32),
                 "sr": np.array(rate, np.int64)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        plan = os.path.join(tmp, f"vad_{samples}.sdp")
        extra = []
        if bind:
            pb = os.path.join(tmp, "sr.pb")
            with open(pb, "wb") as f:
                f.write(numpy_helper.from_array(feeds.pop("sr"), "sr").SerializeToString())
            extra = ["--bind", f"sr={pb}"]
        sh([sdc, "compile", path, "-o", plan] + shapes_of(feeds) + extra)
        err = max_err(run_plan(sdrun, plan, feeds, tmp, "vad"), want)
        how = "sample rate bound: one branch compiled" if bind else "sample rate at run time: branches selected"
        check(f"Silero VAD {model} at {rate} Hz ({how}): probability and state equal ONNX Runtime (1e-5)",
              err <= 1e-5, f"max abs err {err:.1e}")


def scripted_if(sdc, sdrun, tmp):
    import torch

    @torch.jit.script
    def branch(x):
        if bool(x.sum() > 0):
            y = x * 2.0 + 1.0
        else:
            y = torch.tanh(x) - 1.0
        return y

    class M(torch.nn.Module):
        def forward(self, x):
            return branch(x)

    path = os.path.join(tmp, "if.onnx")
    x = torch.ones(2, 3)
    torch.onnx.export(M(), (x,), path, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    import onnx
    ops = [n.op_type for n in onnx.load(path).graph.node]
    plan = os.path.join(tmp, "if.sdp")
    sh([sdc, "compile", path, "--shapes", "x=2x3", "-o", plan])
    worst = 0.0
    for sign in (1.0, -1.0):
        v = (np.abs(np.random.default_rng(1).standard_normal((2, 3))) * sign).astype(np.float32)
        want = branch(torch.from_numpy(v)).numpy()
        worst = max(worst, max_err(run_plan(sdrun, plan, {"x": v}, tmp, "if"), [want]))
    check("scripted if on an input's values: the exported If matches PyTorch both ways (1e-6)",
          "If" in ops and worst <= 1e-6, f"max abs err {worst:.1e}, ops {sorted(set(ops))}")


def scripted_while(sdc, sdrun, tmp):
    import torch

    @torch.jit.script
    def grow(x, limit):
        while bool(x.sum() < limit):
            x = x * 1.5 + 0.25
        return x

    class M(torch.nn.Module):
        def forward(self, x, limit):
            return grow(x, limit)

    path = os.path.join(tmp, "while.onnx")
    torch.onnx.export(M(), (torch.ones(4), torch.tensor(10.0)), path, dynamo=False, opset_version=17,
                      input_names=["x", "limit"], output_names=["y"])
    plan = os.path.join(tmp, "while.sdp")
    sh([sdc, "compile", path, "--shapes", "x=4", "--shapes", "limit=scalar", "--max-trip", "8", "-o", plan])
    x = np.full(4, 0.5, np.float32)
    limit = np.array(12.0, np.float32)
    want = grow(torch.from_numpy(x), torch.from_numpy(limit)).numpy()
    err = max_err(run_plan(sdrun, plan, {"x": x, "limit": limit}, tmp, "while"), [want])
    check("scripted while loop under --max-trip 8: stops on its own condition as PyTorch does (1e-6)", err <= 1e-6,
          f"max abs err {err:.1e}")
    out = os.path.join(tmp, "overrun_out")
    np.save(os.path.join(tmp, "far.npy"), np.array(1e6, np.float32))
    cmd = [sdrun, "infer", plan, "--input", f"x={os.path.join(tmp, 'while_x.npy')}", "--input",
           f"limit={os.path.join(tmp, 'far.npy')}", "--output-dir", out]
    problems, line = clean_error_problems(cmd, ["needs more than --max-trip 8"], no_files=[out])
    check("a loop that needs more than --max-trip stops the run with one clear line, no output", not problems,
          "; ".join(problems) or line)
    problems, line = clean_error_problems([sdc, "compile", path, "--shapes", "x=4", "--shapes", "limit=scalar",
                                           "-o", os.path.join(tmp, "nobound.sdp")], ["--max-trip"],
                                          no_files=[os.path.join(tmp, "nobound.sdp")])
    check("a while loop compiled without --max-trip is refused, naming the node and the flag", not problems,
          "; ".join(problems) or line)


class Tagger:
    """Speech-style frame tagger: features -> 2-layer bidirectional RNN -> frame classes."""

    @staticmethod
    def make(kind):
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(torch.nn, kind)(20, 24, num_layers=2, bidirectional=True, batch_first=True)
                self.head = torch.nn.Linear(48, 5)

            def forward(self, feats):
                return self.head(self.rnn(feats)[0])
        return M().eval()


def recurrent_inference(sdc, sdrun, tmp):
    import torch
    for kind in ("GRU", "LSTM"):
        for dynamo in (False, True):
            torch.manual_seed(0)
            model = Tagger.make(kind)
            feats = torch.randn(3, 30, 20)
            path = os.path.join(tmp, f"{kind}_{dynamo}.onnx")
            exporter = "dynamo (its default opset)" if dynamo else "TorchScript, opset 17"
            if dynamo:
                torch.onnx.export(model, (feats,), path, dynamo=True, input_names=["feats"], output_names=["logits"])
            else:
                torch.onnx.export(model, (feats,), path, dynamo=False, opset_version=17, input_names=["feats"],
                                  output_names=["logits"])
            plan = os.path.join(tmp, f"{kind}.sdp")
            sh([sdc, "compile", path, "--shapes", "feats=3x30x20", "-o", plan])
            with torch.no_grad():
                want = model(feats).numpy()
            err = max_err(run_plan(sdrun, plan, {"feats": feats.numpy()}, tmp, kind), [want])
            check(f"{kind} tagger (2 layers, bidirectional, batch_first), {exporter} export: logits equal PyTorch "
                  "(1e-5)", err <= 1e-5, f"max abs err {err:.1e}")


def recurrent_training(sdc, sdrun, tmp):
    import torch
    data = os.path.join(tmp, "train.jsonl")
    rows = make_data(data, 9, seed=1)
    lr, wd, clip = 3e-3, 0.01, 1.0
    for kind in ("GRU", "LSTM"):
        class Lm(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(256, 32)
                self.rnn = getattr(torch.nn, kind)(32, 48, batch_first=True)
                self.head = torch.nn.Linear(48, 256)

            def forward(self, ids):
                return self.head(self.rnn(self.emb(ids))[0])
        torch.manual_seed(2)
        model = Lm()
        path = os.path.join(tmp, f"{kind}_lm.onnx")
        torch.onnx.export(model, (torch.zeros(BATCH, SEQ, dtype=torch.long),), path, dynamo=False, opset_version=17,
                          input_names=["input_ids"], output_names=["logits"])
        plan = os.path.join(tmp, f"{kind}_lm.sdp")
        sh([sdc, "compile", path, "--peft", "none", "--shapes", f"input_ids={BATCH}x{SEQ}", "--adam-epsilon",
            str(ADAM_EPS), "-o", plan])
        metrics = os.path.join(tmp, f"{kind}_m.jsonl")
        sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--threads", "2", "--lr",
            str(lr), "--weight-decay", str(wd), "--clip-norm", str(clip), "--metrics", metrics])
        ours = [json.loads(l)["loss"] for l in open(metrics)]
        ref = torch_losses(model, rows, STEPS, 1, lr, wd, clip)
        rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
        check(f"{kind} language model, full fine-tuning: {STEPS} per-step losses equal PyTorch's nn.{kind} (1e-4)",
              rel < 1e-4 and len(ours) == STEPS, f"max rel diff {rel:.2e} (first {ref[0]:.4f}, last {ref[-1]:.4f})")


def recurrent_lora(sdc, sdrun, tmp):
    """LoRA on the linear layer before an LSTM: its gradient has to come back
    through the fused recurrence's backward (dL/dxw, then the input GEMM)."""
    import torch
    import torch.nn.functional as F
    from safetensors.numpy import load_file

    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 32)
            self.proj = torch.nn.Linear(32, 32)
            self.rnn = torch.nn.LSTM(32, 48, batch_first=True)
            self.head = torch.nn.Linear(48, 256)

        def forward(self, ids):
            return self.head(self.rnn(self.proj(self.emb(ids)))[0])
    torch.manual_seed(3)
    model = Lm()
    path = os.path.join(tmp, "lora_lstm.onnx")
    torch.onnx.export(model, (torch.zeros(BATCH, SEQ, dtype=torch.long),), path, dynamo=False, opset_version=17,
                      input_names=["input_ids"], output_names=["logits"])
    data = os.path.join(tmp, "lora.jsonl")
    rows = make_data(data, 8, seed=4)
    plan = os.path.join(tmp, "lora_lstm.sdp")
    sh([sdc, "compile", path, "--peft", "lora", "--target-modules", "proj", "--shapes", f"input_ids={BATCH}x{SEQ}",
        "-o", plan])
    metrics, adapter = os.path.join(tmp, "lora_m.jsonl"), os.path.join(tmp, "lora_adapter")
    sh([sdrun, "train", plan, "--data", data, "--no-shuffle", "--steps", str(STEPS), "--lr", "1e-2", "--metrics",
        metrics, "--save-adapter", adapter])
    losses = [json.loads(l)["loss"] for l in open(metrics)]
    ids = torch.tensor([r[:SEQ] + [0] * (SEQ - len(r)) for r in rows[:BATCH]])
    labels = torch.tensor([r[:SEQ] + [-100] * (SEQ - len(r)) for r in rows[:BATCH]])
    with torch.no_grad():
        logits = model(ids)
        want = float(F.cross_entropy(logits[:, :-1].reshape(-1, 256), labels[:, 1:].reshape(-1), ignore_index=-100))
    b = [v for k, v in load_file(os.path.join(adapter, "adapter_model.safetensors")).items() if "lora_B" in k]
    check("LoRA before an LSTM: starts from PyTorch's loss (1e-4), the loss falls over 10 steps, and lora_B moves "
          "(its gradient crosses the fused recurrence backward)",
          abs(losses[0] - want) <= 1e-4 * abs(want) and losses[-1] < losses[0] and len(b) == 1
          and float(np.abs(b[0]).max()) > 0,
          f"first {losses[0]:.5f} (PyTorch {want:.5f}), last {losses[-1]:.5f}, {len(b)} lora_B")


def main():
    sdc, sdrun = tool_paths()
    import torch
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="sd_control_")
    try:
        silero(sdc, sdrun, tmp)
        scripted_if(sdc, sdrun, tmp)
        scripted_while(sdc, sdrun, tmp)
        recurrent_inference(sdc, sdrun, tmp)
        recurrent_training(sdc, sdrun, tmp)
        recurrent_lora(sdc, sdrun, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_control_flow")


if __name__ == "__main__":
    sys.exit(main())
