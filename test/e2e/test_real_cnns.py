#!/usr/bin/env python3
"""Real depthwise-separable CNNs published by others, as users deploy them:
PaddleOCR's PP-OCRv4 text detector and recognizer and its mobile direction
classifier from the rapidocr-onnxruntime wheel (paddle2onnx exports, opsets
11-12), on a synthetic page of dark strokes on white, normalized as
PaddleOCR does:

  match   sdrun infer equals ONNX Runtime (1e-4 relative)
  fused   the compiler folded PP-LCNet's per-convolution affine into the
          weights and the HardSwish written as x * Clip(x + 3, 0, 6) / 6 into
          the convolutions' epilogues: no Clip or Div step is left in the
          detector's plan, and most of its convolutions are FusedConv; the
          classifier's BatchNormalizations fold into its convolutions too
  dims    the '?' dims paddle2onnx writes are independent unknowns (the
          classifier's height and width differ)
"""
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import ort_run, plan_steps, rel_err, sdrun_logits, sh, tool_paths
from test_training import check, report

MODELS = [("ch_PP-OCRv4_det_infer.onnx", (1, 3, 320, 320)),
          ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
          ("ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192))]


def page(shape, seed):
    """Dark strokes of random sizes on white, (x / 255 - 0.5) / 0.5 as PaddleOCR normalizes."""
    rng = np.random.default_rng(seed)
    img = np.full(shape[2:], 255.0)
    for _ in range(shape[2] * shape[3] // 400):
        y, x = rng.integers(0, shape[2] - 4), rng.integers(0, shape[3] - 4)
        img[y:y + rng.integers(2, 8), x:x + rng.integers(1, 4)] = rng.uniform(0, 60)
    img = np.broadcast_to(img, shape).astype(np.float32)
    return (img / 255.0 - 0.5) / 0.5


def main():
    sdc, sdrun = tool_paths()
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        check("the rapidocr-onnxruntime wheel is installed (requirements-models.txt)", False, "not found")
        return report("real_cnns")
    models = os.path.join(os.path.dirname(spec.origin), "models")
    tmp = tempfile.mkdtemp(prefix="sd_cnns_")
    try:
        for name, shape in MODELS:
            stem = name[:-5]
            plan = os.path.join(tmp, stem + ".sdp")
            sh([sdc, "compile", os.path.join(models, name), "--shapes", "x=" + "x".join(map(str, shape)), "-o", plan])
            x = page(shape, len(stem))
            got = sdrun_logits(sdrun, plan, None, {"x": x}, tmp, stem)
            want = list(ort_run(os.path.join(models, name), {"x": x}).values())[0]
            check(f"{stem}: sdrun equals ONNX Runtime (1e-4)", rel_err(got, want) <= 1e-4,
                  f"relative err {rel_err(got, want):.1e}, output max {float(np.abs(want).max()):.3g}")
            steps = plan_steps(sdrun, plan)
            if "cls" in stem:
                check(f"{stem}: every BatchNormalization folded into its convolution",
                      "BatchNormalization" not in steps and "HardSwish" not in steps, f"steps {steps}")
            if "det" in stem:
                check(f"{stem}: affine and HardSwish folded into the convolutions",
                      "Clip" not in steps and "Div" not in steps and "HardSwish" not in steps and
                      steps.get("FusedConv", 0) > 2 * steps.get("Conv", 0),
                      f"steps {steps}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("real_cnns")


if __name__ == "__main__":
    sys.exit(main())
