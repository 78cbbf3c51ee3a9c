#!/usr/bin/env python3
"""End-to-end on real exported models: export the GPT-style decoder and the
CNN with PyTorch (examples/export_models.py, at opsets 14 and 17), compile
with sdc, run with sdrun, and compare with ONNX Runtime and with PyTorch.
Also checks multi-bucket plans and --external-weights plans."""
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import ort_run, sh, tool_paths

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = []


def close(name, got, want, rtol=1e-3, atol=1e-4):
    ok = got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=atol)
    err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
    RESULTS.append((name, ok, f"max abs err {err:.2e}"))


def main():
    sdc, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_models_")
    try:
        for opset in (14, 17):
            d = os.path.join(tmp, f"opset{opset}")
            sh([sys.executable, os.path.join(ROOT, "examples", "export_models.py"), "--out", d, "--opset",
                str(opset), "--seq", "32", "--batch", "2"])
            for model, inp, shape in [("gpt", "input_ids", "2x32"), ("cnn", "image", "2x3x32x32")]:
                onnx_path = os.path.join(d, f"{model}.onnx")
                x = os.path.join(d, f"{model}_{inp}.npy")
                plan = os.path.join(d, f"{model}.sdp")
                sh([sdc, "compile", onnx_path, "-o", plan, "--shapes", f"{inp}={shape}"])
                out = os.path.join(d, f"{model}_sd")
                sh([sdrun, "infer", plan, "--input", f"{inp}={x}", "--output-dir", out, "--output-format", "npy"])
                got = np.load(os.path.join(out, "output_0.npy"))
                want = ort_run(onnx_path, {inp: np.load(x)})["logits"]
                close(f"{model} opset {opset} vs ONNX Runtime", got, want)
                close(f"{model} opset {opset} vs PyTorch", got, np.load(os.path.join(d, f"{model}_logits_torch.npy")))

        # MobileNet-style depthwise-separable blocks: the direct depthwise kernel
        # and FusedConv's epilogues (ReLU6 as Clip, HardSwish, residual Add).
        d = os.path.join(tmp, "mobilenet")
        sh([sys.executable, os.path.join(ROOT, "examples", "export_models.py"), "--out", d, "--only", "mobilenet",
            "--cnn-width", "8", "--image", "40", "--batch", "2"])
        plan, x = os.path.join(d, "mobilenet.sdp"), os.path.join(d, "mobilenet_image.npy")
        sh([sdc, "compile", os.path.join(d, "mobilenet.onnx"), "-o", plan, "--shapes", "image=2x3x40x40"])
        out = os.path.join(d, "sd")
        sh([sdrun, "infer", plan, "--input", f"image={x}", "--output-dir", out, "--output-format", "npy"])
        got = np.load(os.path.join(out, "output_0.npy"))
        close("mobilenet vs ONNX Runtime", got, ort_run(os.path.join(d, "mobilenet.onnx"), {"image": np.load(x)})["logits"])
        close("mobilenet vs PyTorch", got, np.load(os.path.join(d, "mobilenet_logits_torch.npy")))
        profile = sh([sdrun, "bench", plan, "--iterations", "1", "--warmup", "0", "--profile"])
        RESULTS.append(("mobilenet runs its convolutions as FusedConv", "FusedConv" in profile, ""))

        # Two buckets in one plan, and weights in an external safetensors file.
        # seq 80 runs the attention kernels' causal blocks (32 + 32 + 16 rows).
        d = os.path.join(tmp, "opset17")
        gpt = os.path.join(d, "gpt.onnx")
        plan = os.path.join(d, "gpt_buckets.sdp")
        sh([sdc, "compile", gpt, "-o", plan, "--dim", "batch=1", "--dim", "seq=16,80", "--external-weights"])
        ok = os.path.exists(os.path.join(d, "gpt_buckets.safetensors"))
        RESULTS.append(("external weights file written", ok, ""))
        inspect = sh([sdrun, "inspect", plan])
        RESULTS.append(("two buckets listed", inspect.count("infer [") == 2, ""))
        ids = np.random.default_rng(0).integers(0, 256, size=(1, 80), dtype=np.int64)
        for seq in (16, 80):
            x = os.path.join(d, f"ids_{seq}.npy")
            np.save(x, ids[:, :seq])
            out = os.path.join(d, f"bucket_{seq}")
            sh([sdrun, "infer", plan, "--input", f"input_ids={x}", "--output-dir", out, "--output-format", "npy"])
            close(f"bucket seq={seq} with external weights vs ONNX Runtime", np.load(os.path.join(out, "output_0.npy")),
                  ort_run(gpt, {"input_ids": ids[:, :seq]})["logits"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = 0
    for name, ok, info in RESULTS:
        print(("PASS " if ok else "FAIL ") + name + (f" ({info})" if info else ""))
        failed += not ok
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
