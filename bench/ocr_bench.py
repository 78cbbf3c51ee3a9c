#!/usr/bin/env python3
"""Real depthwise-separable CNNs published by others, against ONNX Runtime:
PaddleOCR's PP-OCRv4 text detector and recognizer and its mobile direction
classifier, as the `rapidocr-onnxruntime` wheel on PyPI carries them
(paddle2onnx exports, opsets 11-12: depthwise and grouped convolutions,
HardSwish written as Clip/Div, squeeze-and-excitation blocks; the recognizer
ends in an SVTR transformer block).

For each model and thread count: sdrun's output equals ONNX Runtime's
(relative error printed), then both are timed (`sdrun bench` and
bench/ort_run.py, ORT_ENABLE_ALL, median ms).

  bench/ocr_bench.py [--threads 1,2] [--iterations 20] [--wheel-dir DIR]

The models come from the wheel scripts/install-deps.sh installs
(requirements-models.txt); without it, the wheel is fetched with `pip
download` into DIR (default build/bench/ocr), where plans and outputs go too.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL = "rapidocr-onnxruntime==1.4.4"
# model file | input shape (the detector's 640x640 page, a 48x320 text line, a 48x192 line for the classifier)
MODELS = [("ch_PP-OCRv4_det_infer.onnx", (1, 3, 640, 640)),
          ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
          ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192))]


def installed_models():
    """The models folder of the rapidocr-onnxruntime wheel that
    scripts/install-deps.sh installs (requirements-models.txt), or None."""
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    folder = os.path.join(os.path.dirname(spec.origin), "models") if spec and spec.origin else None
    return folder if folder and all(os.path.exists(os.path.join(folder, n)) for n, _ in MODELS) else None


def fetch_models(folder):
    os.makedirs(folder, exist_ok=True)
    wheels = glob.glob(os.path.join(folder, "rapidocr_onnxruntime-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-d", folder, WHEEL],
                       check=True, capture_output=True)
        wheels = glob.glob(os.path.join(folder, "rapidocr_onnxruntime-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        for name, _ in MODELS:
            target = os.path.join(folder, name)
            if not os.path.exists(target):
                with open(target, "wb") as f:
                    f.write(z.read("rapidocr_onnxruntime/models/" + name))


def median_ms(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["median_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--wheel-dir", default=os.path.join(ROOT, "build", "bench", "ocr"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = ap.parse_args()
    import onnxruntime as ort
    sdc, sdrun = (os.path.join(args.build, "tools", t) for t in ("sdc", "sdrun"))
    models = installed_models()
    if not models:
        fetch_models(args.wheel_dir)
        models = args.wheel_dir
    os.makedirs(args.wheel_dir, exist_ok=True)
    print(f"{'model':38} {'threads':>7} {'sdrun ms':>9} {'ORT ms':>9} {'ratio':>6}  rel err vs ORT (ORT's own)")
    for name, shape in MODELS:
        model = os.path.join(models, name)
        stem = os.path.join(args.wheel_dir, name[:-5])
        x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)  # an image normalized as PaddleOCR does
        np.save(stem + "_x.npy", x)
        plan = stem + ".sdp"
        subprocess.run([sdc, "compile", model, "--shapes", "x=" + "x".join(map(str, shape)), "-o", plan], check=True)
        out = stem + "_out"
        subprocess.run([sdrun, "infer", plan, "--input", f"x={stem}_x.npy", "--output-dir", out, "--output-format",
                        "npy"], check=True, capture_output=True)
        got = np.load(os.path.join(out, "output_0.npy"))
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        # ONNX Runtime's own optimized and unoptimized runs differ by this much: the rounding noise of the model
        plain = ort.SessionOptions()
        plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        unopt = ort.InferenceSession(model, plain, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        noise = float(np.abs(unopt - want).max() / max(np.abs(want).max(), 1e-30))
        for threads in args.threads.split(","):
            common = ["--iterations", str(args.iterations), "--warmup", "3", "--threads", threads]
            sd = median_ms([sdrun, "bench", plan, *common])  # its own random input: a CNN's time does not depend on it
            ort_ms = median_ms([sys.executable, os.path.join(ROOT, "bench", "ort_run.py"), model, "--input",
                                f"x={stem}_x.npy", *common])
            print(f"{name[:-5]:38} {threads:>7} {sd:9.2f} {ort_ms:9.2f} {sd / ort_ms:6.2f}  {err:.1e} ({noise:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
