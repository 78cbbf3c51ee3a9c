#!/usr/bin/env python3
"""The runtime embedded through its C API and the `sdc` Python module: the C
example (examples/c/train_and_generate.c) and a Python training loop train a
LoRA plan to the same per-step losses and the same adapter bytes as
`sdrun train`; a Python run stopped at a checkpoint and resumed ends on the
same adapter; sessions run entries on NumPy arrays, read and write globals,
refuse to write frozen ones, and errors arrive as sdc.Error with the C API's
message; greedy generation agrees between C and Python."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_util import losses_of, sh  # noqa: E402
from test_training import BATCH, SEQ, check, export_base, make_data, report  # noqa: E402

STEPS, LR, SEED, THREADS = 12, 1e-3, 1, 2


def python(build, code, *args):
    """Runs `code` in the project's Python with the sdc module on the path."""
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"python failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
    return r.stdout


TRAIN_LOOP = """
import sys, sdc
session = sdc.Session(sdc.Plan(sys.argv[1]), threads=2)
trainer = sdc.Trainer(session, data=sys.argv[2], steps=int(sys.argv[3]), lr=1e-3, seed=1)
for report in trainer:
    print(repr(report.loss))
session.save_adapter(sys.argv[4])
"""

RESUME = """
import sys, sdc
plan, data, ckpt, adapter = sys.argv[1:5]
session = sdc.Session(sdc.Plan(plan), threads=2)
trainer = sdc.Trainer(session, data=data, steps=12, lr=1e-3, seed=1, checkpoint_dir=ckpt, checkpoint_every=6)
for _ in range(6):
    trainer.step()
del trainer, session  # a run that stops after its step-6 checkpoint
session = sdc.Session(sdc.Plan(plan), threads=2)
trainer = sdc.Trainer(session, data=data, steps=12, lr=1e-3, seed=1, checkpoint_dir=ckpt, resume=True)
print("resumed at", trainer.step_count)
for report in trainer:
    print(repr(report.loss))
session.save_adapter(adapter)
"""

SESSION_API = """
import sys, json, numpy as np, sdc
plan = sdc.Plan(sys.argv[1])
session = sdc.Session(plan)
out = {"entries": sorted(set(plan.entries))}
ids = np.arange(16, dtype=np.int64).reshape(1, 16)
logits = session.run("infer", {"input_ids": ids})
name, value = next(iter(logits.items()))
out["infer"] = [name, list(value.shape), str(value.dtype), bool(np.isfinite(value).all()), value.base is not None]
lora = [g for g in plan.globals if g[0].endswith("lora_B.weight")][0]
w = session.read_global(lora[0])
session.write_global(lora[0], w + 1)
out["roundtrip"] = bool((session.read_global(lora[0]) == w + 1).all())
frozen = [g for g in plan.globals if g[3] == "frozen"][0]
def error_of(f):
    try:
        f()
    except sdc.Error as e:
        return str(e)
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
    return None
out["frozen"] = error_of(lambda: session.write_global(frozen[0], session.read_global(frozen[0])))
out["bad_plan"] = error_of(lambda: sdc.Plan(sys.argv[2]))
out["bad_shape"] = error_of(lambda: session.run("infer", {"input_ids": np.zeros((1, 5), np.int64)}))
out["bad_device"] = error_of(lambda: sdc.Session(plan, device="cuda"))
session.load_adapter(sys.argv[3])
gen = sdc.Generator(session, temperature=0)
out["generated"] = bytes(list(b"The ") + gen.generate(list(b"The "), 32)).decode("latin-1")
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    build = os.path.abspath(ap.parse_args().build)
    sdc_bin, sdrun = os.path.join(build, "tools", "sdc"), os.path.join(build, "tools", "sdrun")
    example = os.path.join(build, "examples", "c", "train_and_generate")
    with tempfile.TemporaryDirectory() as tmp:
        _, onnx_path = export_base(tmp)
        data = os.path.join(tmp, "train.jsonl")
        make_data(data, 40, seed=3)
        plan = os.path.join(tmp, "lora.sdp")
        sh([sdc_bin, "compile", onnx_path, "--peft", "lora", "--target-modules", "qkv,proj", "--lora-r", "4",
            "--lora-dropout", "0.1", "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
        metrics, a_cli = os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "a_cli")
        sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--lr", str(LR), "--seed", str(SEED),
            "--threads", str(THREADS), "--metrics", metrics, "--save-adapter", a_cli])
        cli = losses_of(metrics)
        adapter_bytes = lambda d: open(os.path.join(d, "adapter_model.safetensors"), "rb").read()

        a_c = os.path.join(tmp, "a_c")
        r = subprocess.run([example, plan, data, str(STEPS), a_c, "The "], capture_output=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{example} failed: {r.stderr.decode(errors='replace')[-800:]}")
        out = r.stdout.decode("latin-1").splitlines()  # generated bytes of a random model
        c_losses = [float(l.split()[3]) for l in out if l.startswith("step ")]
        c_text = next(l for l in out if l.startswith("generated: "))[len("generated: "):]
        check("C example: losses", len(c_losses) == STEPS and all(f"{a:.8g}" == f"{b:.8g}" for a, b in zip(c_losses, cli)),
              f"{len(c_losses)} steps, first {c_losses[:1]} vs sdrun {cli[:1]}")
        check("C example: adapter bit for bit", adapter_bytes(a_c) == adapter_bytes(a_cli), "adapter_model.safetensors")

        a_py = os.path.join(tmp, "a_py")
        py_losses = [float(l) for l in python(build, TRAIN_LOOP, plan, data, str(STEPS), a_py).split()]
        check("Python loop: losses", py_losses == c_losses and all(f"{a:.8g}" == f"{b:.8g}" for a, b in zip(py_losses, cli)),
              f"{len(py_losses)} steps equal to the C API's doubles and sdrun's metrics")
        check("Python loop: adapter bit for bit", adapter_bytes(a_py) == adapter_bytes(a_cli), "adapter_model.safetensors")

        a_res = os.path.join(tmp, "a_res")
        res = python(build, RESUME, plan, data, os.path.join(tmp, "ckpt"), a_res).splitlines()
        check("Python resume", res[0] == "resumed at 6" and [float(l) for l in res[1:]] == py_losses[6:] and
              adapter_bytes(a_res) == adapter_bytes(a_cli), f"{res[0]}; steps 7-12 and the adapter equal the straight run")

        bad = os.path.join(tmp, "bad.sdp")
        open(bad, "wb").write(b"not a plan")
        api = json.loads(python(build, SESSION_API, plan, bad, a_cli))
        check("Session.run", api["infer"][1] == [1, SEQ, 256] and api["infer"][2] == "float32" and api["infer"][3] and
              api["infer"][4], f"{api['infer']} (outputs wrap the C API's memory)")
        check("read/write_global", api["roundtrip"], "a LoRA weight written and read back")
        for key, want in [("frozen", "cannot be written"), ("bad_plan", "bad.sdp"), ("bad_shape", "bucket"),
                          ("bad_device", "cuda")]:
            check(f"sdc.Error: {key}", api[key] is not None and want in api[key], str(api[key]))
        check("generation: C and Python agree", api["generated"] == c_text, f"C {c_text!r}, Python {api['generated']!r}")
    return report("embedding")


if __name__ == "__main__":
    sys.exit(main())
