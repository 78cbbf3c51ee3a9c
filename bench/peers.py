#!/usr/bin/env python3
"""Every peer side by side, in one run, same CPU threads, as a Markdown table.

Inference (examples/export_models.py models, median of --iterations):
  sdrun bench | ONNX Runtime (PyPI, ORT_ENABLE_ALL) | IREE (iree-base-compiler
  + iree-base-runtime, llvm-cpu, --iree-llvmcpu-target-cpu=host, static shapes)
Training step, LoRA and full fine-tuning (the GPT of train_bench.py):
  sdrun bench --entry train_step | PyTorch eager | torch.compile (inductor) |
  PyTorch+PEFT (LoRA only: PEFT has no full fine-tuning) | ONNX Runtime
  Training (artifacts generated from an opset-14 ONNX export of the same model,
  LoRA layers included; its own environment .venv-ort-training)

A peer that fails is reported with its error, never dropped.

  bench/peers.py [--threads N] [--iterations N] [--out RESULTS.json]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
ORTT_PYTHON = os.path.join(ROOT, ".venv-ort-training", "bin", "python")

INFER = [  # name, export_models args, input, shape
    ("gpt-small", ["--only", "gpt", "--d-model", "128", "--layers", "2", "--heads", "4", "--seq", "64", "--batch", "1"],
     "input_ids", [1, 64]),
    ("gpt-medium", ["--only", "gpt", "--d-model", "512", "--layers", "4", "--heads", "8", "--seq", "256",
                    "--batch", "1"], "input_ids", [1, 256]),
    ("cnn-32px", ["--only", "cnn", "--cnn-width", "32", "--image", "32", "--batch", "8"], "image", [8, 3, 32, 32]),
]
TRAIN = {"demo": (128, 2, 4, 128, 4)}  # d_model, layers, heads, seq, batch
LORA_TARGETS, LORA_R, LORA_ALPHA, VOCAB = ["qkv", "proj", "fc1", "fc2"], 8, 16.0, 256



def bench_cli(doc, script, hidden=("peer",)):
    """The command line the per-issue benches share: --build, --threads,
    --iterations and, hidden, the flags a peer child takes. Returns the
    arguments, the paths of sdc and sdrun, and the command that re-runs
    `script` as a peer child with the same threads and iterations."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=20)
    for flag in hidden:
        ap.add_argument("--" + flag, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sdc, sdrun = os.path.join(a.build, "tools", "sdc"), os.path.join(a.build, "tools", "sdrun")
    me = [sys.executable, os.path.abspath(script), "--threads", str(a.threads), "--iterations", str(a.iterations)]
    return a, sdc, sdrun, me

def timed(fn, iterations, warmup):
    """Median ms of fn, timed as ort_run.py times ONNX Runtime."""
    from ort_run import time_runs
    return time_runs(fn, iterations, warmup)[0]


def optimizer_step_ms(loss_fn, opt, iterations, warmup=3, after_step=None):
    """Median ms of one training step: loss_fn(), backward, opt.step(), then
    after_step() when given (AdaLoRA's update_and_allocate, which reads the
    gradients)."""
    def step():
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if after_step:
            after_step()
    return timed(step, iterations, warmup)


def one_line(e):
    text = str(e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:160]


def run_child(cmd, env=None):
    """A peer in its own process (its own threads and memory); its last stdout line is JSON."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1])
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- inference

def sdrun_infer(a, model, inp, shape, d):
    plan = os.path.join(d, "plan.sdp")
    subprocess.run([a.sdc, "compile", model, "-o", plan, "--shapes", f"{inp}=" + "x".join(map(str, shape))],
                   check=True, capture_output=True)
    out = run_child([a.sdrun, "bench", plan, "--iterations", str(a.iterations), "--warmup", "5", "--threads",
                     str(a.threads)])
    return out["median_ms"]


def ort_infer(a, model, feeds):
    from ort_run import make_session
    sess = make_session(model, a.threads, "all")
    return timed(lambda: sess.run(None, feeds), a.iterations, 5)


def iree_infer(a, model, feeds, d):
    import iree.runtime as rt
    import onnx
    m = onnx.load(model)
    for vi in list(m.graph.input) + list(m.graph.output):  # static shapes, as the other two get
        if vi.name in feeds:
            for dim, n in zip(vi.type.tensor_type.shape.dim, feeds[vi.name].shape):
                dim.Clear()
                dim.dim_value = n
    static, mlir, vmfb = (os.path.join(d, f) for f in ("static.onnx", "model.mlir", "model.vmfb"))
    onnx.save(m, static)
    bin_dir = os.path.dirname(sys.executable)
    for cmd in ([os.path.join(bin_dir, "iree-import-onnx"), static, "-o", mlir],
                [os.path.join(bin_dir, "iree-compile"), mlir, "--iree-hal-target-device=local",
                 "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host", "-o", vmfb]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{os.path.basename(cmd[0])}: " + (r.stderr.strip().splitlines() or ["failed"])[-1])
    rt.flags.parse_flags(f"--task_topology_max_group_count={a.threads}")
    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    with open(vmfb, "rb") as f:
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, f.read()))
    fn = ctx.modules.module[m.graph.name if m.graph.name in dir(ctx.modules.module) else "main_graph"]
    args = [feeds[i.name] for i in m.graph.input if i.name in feeds]
    return timed(lambda: fn(*args).to_host(), a.iterations, 5)


def inference_rows(a, tmp):
    import numpy as np
    rows = []
    for name, export_args, inp, shape in INFER:
        d = os.path.join(tmp, name)
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_models.py"), "--out", d] + export_args,
                       check=True, capture_output=True)
        kind = export_args[1]
        model = os.path.join(d, f"{kind}.onnx")
        feeds = {inp: np.load(os.path.join(d, f"{kind}_{inp}.npy"))}
        row = {"model": name}
        for peer, fn in (("sdrun", lambda: sdrun_infer(a, model, inp, shape, d)),
                         ("onnxruntime", lambda: ort_infer(a, model, feeds)),
                         ("iree", lambda: iree_infer(a, model, feeds, d))):
            try:
                row[peer] = fn()
            except Exception as e:
                row[peer] = "error: " + one_line(e)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------- training

def build_gpt(config, mode, peft_lib=False):
    import numpy as np
    import torch
    from export_models import Gpt
    d, layers, heads, seq, batch = TRAIN[config]
    torch.manual_seed(0)
    model = Gpt(d=d, layers=layers, heads=heads, block=seq)
    if mode == "lora" and peft_lib:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS))
    elif mode == "lora":
        sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
        from test_training import add_lora
        rng = np.random.default_rng(0)
        init = {n: ((rng.standard_normal((LORA_R, m.in_features)) * 0.02).astype(np.float32),
                    np.zeros((m.out_features, LORA_R), np.float32))
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) and any(n.endswith("." + t) for t in LORA_TARGETS)}
        add_lora(model, LORA_TARGETS, LORA_R, LORA_ALPHA, init)
    return model


def torch_child(a):
    """PyTorch eager, torch.compile or PyTorch+PEFT: one AdamW step per iteration."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(a.threads)
    d, layers, heads, seq, batch = TRAIN[a.config]
    model = build_gpt(a.config, a.mode, peft_lib=a.peer == "peft")
    forward = torch.compile(model) if a.peer == "compile" else model
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    ids = torch.randint(0, VOCAB, (batch, seq))

    def step():
        opt.zero_grad(set_to_none=True)
        logits = forward(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
    print(json.dumps({"median_ms": timed(step, a.iterations, a.warmup)}))


def ortt_child(a):
    """ONNX Runtime Training: artifacts from an ONNX export of the same model
    (logits flattened to [tokens, vocab] for its CrossEntropyLoss block)."""
    import numpy as np
    import onnx
    import torch
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    d, layers, heads, seq, batch = TRAIN[a.config]
    model = build_gpt(a.config, a.mode)

    class Flat(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(ids).reshape(-1, VOCAB)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        torch.onnx.export(Flat(model), (torch.zeros((batch, seq), dtype=torch.long),), path, input_names=["input_ids"],
                          output_names=["logits"], opset_version=a.ortt_opset, dynamo=False, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)
        m = onnx.load(path)
        inits = {t.name for t in m.graph.initializer}
        params = {"m." + n: p.requires_grad for n, p in model.named_parameters() if "m." + n in inits}
        trainable = [n for n, grad in params.items() if grad]
        frozen = [n for n, grad in params.items() if not grad]
        artifacts.generate_artifacts(m, requires_grad=trainable, frozen_params=frozen,
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=tmp)
        # The onnx package it sees (.venv's, current) writes IR versions newer
        # than ORT Training 1.19 reads; the graphs themselves are opset 14.
        for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
            art = onnx.load(os.path.join(tmp, name))
            art.ir_version = min(art.ir_version, 10)
            onnx.save(art, os.path.join(tmp, name))
        state = CheckpointState.load_checkpoint(os.path.join(tmp, "checkpoint"))
        module = Module(os.path.join(tmp, "training_model.onnx"), state, os.path.join(tmp, "eval_model.onnx"))
        opt = Optimizer(os.path.join(tmp, "optimizer_model.onnx"), module)
        module.train()
        ids = np.random.default_rng(0).integers(0, VOCAB, (batch, seq)).astype(np.int64)
        labels = np.roll(ids, -1, axis=1).reshape(-1).astype(np.int64)

        def step():
            module(ids, labels)
            opt.step()
            module.lazy_reset_grad()
        print(json.dumps({"median_ms": timed(step, a.iterations, a.warmup)}))


def training_rows(a, tmp):
    from train_bench import export_gpt_and_batch
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rows = []
    for config, (d, layers, heads, seq, batch) in TRAIN.items():
        onnx_path, data = export_gpt_and_batch(tmp, config, d, layers, heads, seq, batch)
        for mode in ("lora", "full"):
            row = {"config": f"{config} d={d} L={layers} seq={seq} batch={batch}", "mode": mode}
            plan = os.path.join(tmp, f"{config}-{mode}.sdp")
            peft = (["--peft", "lora", "--target-modules", ",".join(LORA_TARGETS), "--lora-r", str(LORA_R),
                     "--lora-alpha", str(LORA_ALPHA)] if mode == "lora" else ["--peft", "none"])
            child = ["--config", config, "--mode", mode, "--threads", str(a.threads), "--iterations",
                     str(a.iterations), "--warmup", str(a.warmup)]
            peers = [("sdrun", lambda: (subprocess.run([a.sdc, "compile", onnx_path, "--shapes",
                                                        f"input_ids={batch}x{seq}", "-o", plan] + peft, check=True,
                                                       capture_output=True),
                                        run_child([a.sdrun, "bench", plan, "--entry", "train_step", "--data", data,
                                                   "--threads", str(a.threads), "--iterations", str(a.iterations),
                                                   "--warmup", str(a.warmup)]))[1]["median_ms"])]
            for peer in ("torch", "compile", "peft"):
                if peer == "peft" and mode == "full":
                    continue
                peers.append((peer, lambda p=peer: run_child([sys.executable, __file__, "--child", p] + child,
                                                             env)["median_ms"]))
            peers.append(("ort-training", lambda: run_child([ORTT_PYTHON, __file__, "--child", "ortt"] + child,
                                                            env)["median_ms"]))
            for peer, fn in peers:
                try:
                    row[peer] = fn()
                except Exception as e:
                    row[peer] = "error: " + one_line(e)
            if mode == "full":
                row["peft"] = "n/a (adapters only)"
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------- report

def versions():
    import importlib.metadata as md
    v = {}
    for p in ("onnxruntime", "torch", "peft", "transformers", "trl", "bitsandbytes", "iree-base-compiler",
              "iree-base-runtime", "numpy"):
        try:
            v[p] = md.version(p)
        except md.PackageNotFoundError:
            v[p] = "not installed"
    try:
        v["onnxruntime-training"] = subprocess.run(
            [ORTT_PYTHON, "-c", "import onnxruntime; print(onnxruntime.__version__)"], capture_output=True,
            text=True).stdout.strip() or "not installed"
    except OSError:
        v["onnxruntime-training"] = "not installed"
    return v


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def cell(v, base=None):
    if isinstance(v, str):
        return v
    return f"{v:.2f}" + (f" ({v / base:.2f}x)" if isinstance(base, float) and base > 0 else "")


def table(rows, key_cols, peers, base):
    lines = ["| " + " | ".join(key_cols + peers) + " |", "|" + "---|" * (len(key_cols) + len(peers))]
    for r in rows:
        b = r.get(base)
        lines.append("| " + " | ".join([str(r[k]) for k in key_cols] +
                                       [cell(r.get(p, "—"), b if p != base else None) for p in peers]) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", choices=["inference", "training"], help="run one half")
    ap.add_argument("--out", help="also write the rows as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    # ORT Training 1.19 fails on opset 17's LayerNormalization gradient
    # ("i < node_->OutputDefs().size() was false"); opset 14 decomposes it.
    ap.add_argument("--ortt-opset", type=int, default=14, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.peer = a.child
        return ortt_child(a) if a.child == "ortt" else torch_child(a)
    a.sdc, a.sdrun = (os.path.join(a.build, "tools", t) for t in ("sdc", "sdrun"))
    os.environ.pop("OPENBLAS_CORETYPE", None)  # as bench/run_bench.sh
    report = {"cpu": cpu_model(), "threads": a.threads, "versions": versions()}
    with tempfile.TemporaryDirectory(prefix="sd_peers_") as tmp:
        if a.only != "training":
            report["inference"] = inference_rows(a, tmp)
        if a.only != "inference":
            report["training"] = training_rows(a, tmp)
    print(f"\nCPU: {report['cpu']}, {a.threads} threads; " +
          ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    if "inference" in report:
        print("\nInference, median ms (ratio to sdrun):\n")
        print(table(report["inference"], ["model"], ["sdrun", "onnxruntime", "iree"], "sdrun"))
    if "training" in report:
        print("\nTraining step, median ms (ratio to sdrun):\n")
        print(table(report["training"], ["config", "mode"], ["sdrun", "torch", "compile", "peft", "ort-training"],
                    "sdrun"))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
