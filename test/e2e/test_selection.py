#!/usr/bin/env python3
"""Selections whose size is only known at run time, in models exported by
PyTorch: a detector with NonMaxSuppression post-processing, and masked
selection (torch.nonzero, boolean-mask indexing).

  match      sdrun and the Python module return exactly the boxes, scores and
             classes ONNX Runtime returns, for inputs that keep none, a few
             and the most NMS can keep (the plan holds the bound, the runtime
             returns the counted rows)
  inspect    `sdrun inspect` says which outputs are bounded
  read       a sum over the detections and the detections scaled by their
             number (a Shape of the counted result) equal ONNX Runtime's
  refused    a consumer that would read the padding (the first detection, a
             Gather along the counted dim) is refused at compile time with
             one line naming it and the NMS node, no plan
  masked     rows picked by torch.nonzero(scores > t) and by x[scores > t]
             (NonZero + Gather / GatherND) equal ONNX Runtime's, however many
  topk       torch.topk with k counted from the data (TopK with a run-time k)
             equals ONNX Runtime, from k = 0 to the whole axis
  prefix     the first 3 of the selected values (x[x > 0][:3]) keep
             min(count, 3) rows, as ONNX Runtime, for 0 to 6 selected
  consumers  what a user computes from x[mask], exported by TorchScript and
             by the default (dynamo) exporter: a mean, a column sum and max,
             a softmax along the rows, a linear layer, a LayerNorm, a flatten
             and a scale by the row count; equal to ONNX Runtime for 0 to 6
             rows (the mean of no rows is NaN, as in PyTorch)
"""
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import ROOT, clean_error_problems, max_abs_diff, ort_run, report_checks, sh, tool_paths

RESULTS = []
CLASSES, MAX_PER_CLASS = 3, 5


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok), detail))


def detector_classes():
    import torch
    import torch.nn as nn

    class NMS(torch.autograd.Function):
        """NonMaxSuppression as torchvision exports it (a custom symbolic)."""

        @staticmethod
        def forward(ctx, boxes, scores, max_out, iou, score_threshold):
            return torch.zeros((min(max_out, boxes.shape[1]), 3), dtype=torch.int64)

        @staticmethod
        def symbolic(g, boxes, scores, max_out, iou, score_threshold):
            const = lambda v, t: g.op("Constant", value_t=torch.tensor([v], dtype=t))
            return g.op("NonMaxSuppression", boxes, scores, const(max_out, torch.int64), const(iou, torch.float32),
                        const(score_threshold, torch.float32))

    class Detector(nn.Module):
        """A one-level anchor-free head: per cell, 4 box offsets and per-class
        scores; NMS per class; then the kept boxes, scores and classes."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
            self.head = nn.Conv2d(8, 4 + CLASSES, 1)

        def candidates(self, image):
            f = self.head(self.stem(image))
            h, w = f.shape[2], f.shape[3]
            f = f.flatten(2).transpose(1, 2)  # [1, cells, 4 + classes]
            ys = (torch.arange(h).float() + 0.5).repeat_interleave(w) / h
            xs = (torch.arange(w).float() + 0.5).repeat(h) / w
            d = torch.sigmoid(f[..., :4]) * 0.3
            boxes = torch.stack([ys - d[..., 0], xs - d[..., 1], ys + d[..., 2], xs + d[..., 3]], -1)
            return boxes, torch.sigmoid(f[..., 4:]).transpose(1, 2)

        def forward(self, image):
            boxes, scores = self.candidates(image)
            sel = NMS.apply(boxes, scores, MAX_PER_CLASS, 0.4, 0.55)
            cls, idx = sel[:, 1], sel[:, 2]
            kept = boxes[0].index_select(0, idx)
            kept_scores = scores.reshape(-1).index_select(0, cls * scores.shape[2] + idx)
            return kept, kept_scores, cls

    class SumOfScores(Detector):
        def forward(self, image):
            return super().forward(image)[1].sum()

    class ScaledByCount(Detector):
        def forward(self, image):
            kept, kept_scores, _ = super().forward(image)
            return kept * kept_scores.shape[0]

    class FirstScore(Detector):
        def forward(self, image):
            return super().forward(image)[1][0]

    return Detector, SumOfScores, ScaledByCount, FirstScore


def export(cls, path):
    import torch
    torch.manual_seed(0)
    torch.onnx.export(cls().eval(), (torch.zeros(1, 3, 16, 16),), path, input_names=["image"],
                      output_names=["boxes", "scores", "classes"][:1 if cls.__name__ != "Detector" else 3],
                      opset_version=17, dynamo=False)


def main():
    sdc, sdrun = tool_paths()
    sys.path.insert(0, os.path.join(os.path.dirname(sdc), "..", "python"))
    import torch
    torch.set_num_threads(1)
    Detector, SumOfScores, ScaledByCount, FirstScore = detector_classes()
    tmp = tempfile.mkdtemp(prefix="sd_detection_")
    try:
        model, plan = os.path.join(tmp, "det.onnx"), os.path.join(tmp, "det.sdp")
        export(Detector, model)
        sh([sdc, "compile", model, "-o", plan])
        bound = CLASSES * MAX_PER_CLASS
        shown = sh([sdrun, "inspect", plan])
        check("sdrun inspect: the outputs are bounded by classes x max_output_boxes_per_class and counted at run time",
              f"f32[{bound}x4] (at most; dim 0 holds the run-time count" in shown, shown[shown.find("output"):][:200])
        import sdc as sdc_py
        session = sdc_py.Session(sdc_py.Plan(plan), threads=1)
        rng = np.random.default_rng(0)
        # Blank, faint (nothing above the score threshold), ordinary and strong inputs.
        images = [np.zeros((1, 3, 16, 16), np.float32)] + [
            (rng.standard_normal((1, 3, 16, 16)) * s).astype(np.float32) for s in (0.01, 0.5, 1.0, 3.0, 6.0)]
        counts, worst, shapes_ok, py_ok = [], 0.0, True, True
        for k, image in enumerate(images):
            want = list(ort_run(model, {"image": image}).values())
            path = os.path.join(tmp, f"image{k}.npy")
            np.save(path, image)
            out = os.path.join(tmp, f"out{k}")
            sh([sdrun, "infer", plan, "--input", f"image={path}", "--output-dir", out, "--output-format", "npy"])
            got = [np.load(os.path.join(out, f"output_{i}.npy")) for i in range(3)]
            from_py = list(session.run("infer", {"image": image}).values())
            counts.append(want[2].shape[0])
            shapes_ok &= all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want))
            py_ok &= all(p.shape == g.shape and np.array_equal(p, g) for p, g in zip(from_py, got))
            if shapes_ok:
                worst = max([worst] + [float(np.max(np.abs(g.astype(np.float64) - w), initial=0))
                                       for g, w in zip(got, want)])
        check(f"detections equal ONNX Runtime's for {len(images)} inputs (shapes exact, values 1e-5), from none to "
              f"the bound ({bound})", shapes_ok and worst <= 1e-5 and min(counts) == 0 and max(counts) == bound
              and len(set(counts)) >= 3, f"detections per input {counts}, max |diff| {worst:.2e}")
        check("the Python module returns the same counted outputs as sdrun infer", py_ok, "")
        for cls in (SumOfScores, ScaledByCount):
            path, cls_plan = os.path.join(tmp, f"{cls.__name__}.onnx"), os.path.join(tmp, f"{cls.__name__}.sdp")
            export(cls, path)
            sh([sdc, "compile", path, "-o", cls_plan])
            worst, shapes_ok = 0.0, True
            for k, image in enumerate(images):
                want = list(ort_run(path, {"image": image}).values())[0]
                got = list(sdc_py.Session(sdc_py.Plan(cls_plan), threads=1).run("infer", {"image": image}).values())[0]
                shapes_ok &= got.shape == want.shape
                if shapes_ok:
                    worst = max(worst, max_abs_diff(got, want))
            check(f"{cls.__name__}: what it reads across the detections (a sum over them, their number as a Shape) "
                  "equals ONNX Runtime's for every input", shapes_ok and worst <= 1e-5, f"max |diff| {worst:.2e}")
        bad, bad_plan = os.path.join(tmp, "FirstScore.onnx"), os.path.join(tmp, "FirstScore.sdp")
        export(FirstScore, bad)
        problems, line = clean_error_problems([sdc, "compile", bad, "-o", bad_plan],
                                              ["Gather", "cannot honour the run-time count", "NonMaxSuppression",
                                               "gathers along the counted dim"], [bad_plan])
        check("the first detection (a Gather along the counted dim, which may read the padding) is refused at "
              "compile time: one line naming it and the NMS node, no plan", not problems, "; ".join(problems) or line)
        masked_selection(sdc, sdrun, tmp)
        top_k_by_count(sdc, sdrun, tmp)
        prefix_of_selection(sdc, sdrun, tmp)
        for dynamo in (False, True):
            consumers_of_selection(sdc, sdrun, tmp, dynamo)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report_checks("test_selection", RESULTS)


def infer_npy(sdrun, plan, feeds, folder, outputs):
    """`sdrun infer` on `feeds` saved as .npy files in `folder`; its first `outputs` outputs."""
    os.makedirs(folder, exist_ok=True)
    args = []
    for name, value in feeds.items():
        np.save(os.path.join(folder, f"{name}.npy"), value)
        args += ["--input", f"{name}=" + os.path.join(folder, f"{name}.npy")]
    out = os.path.join(folder, "out")
    sh([sdrun, "infer", plan] + args + ["--output-dir", out, "--output-format", "npy"])
    return [np.load(os.path.join(out, f"output_{i}.npy")) for i in range(outputs)]


def export_masked(path):
    """torch.nonzero's rows and boolean-mask indexing on run-time scores, as
    a PyTorch user writes them (test_cuda_plans runs it on a GPU too)."""
    import torch
    import torch.nn as nn

    class Masked(nn.Module):
        def forward(self, x, scores):
            rows = torch.nonzero(scores > 0.5)[:, 0]
            return x.index_select(0, rows) * 2, x[scores > 0.2]

    torch.onnx.export(Masked(), (torch.randn(6, 4), torch.rand(6)), path, input_names=["x", "scores"],
                      output_names=["doubled", "picked"], opset_version=17, dynamo=False)


def masked_selection(sdc, sdrun, tmp):
    model, plan = os.path.join(tmp, "masked.onnx"), os.path.join(tmp, "masked.sdp")
    export_masked(model)
    sh([sdc, "compile", model, "-o", plan])
    rng = np.random.default_rng(1)
    equal, counts = True, []
    for k, scale in enumerate((0.0, 0.4, 1.0, 2.0, 0.7)):
        x = rng.standard_normal((6, 4)).astype(np.float32)
        scores = np.clip(rng.random(6) * scale, 0, 1).astype(np.float32)
        want = list(ort_run(model, {"x": x, "scores": scores}).values())
        got = infer_npy(sdrun, plan, {"x": x, "scores": scores}, os.path.join(tmp, f"m{k}"), len(want))
        counts.append([w.shape[0] for w in want])
        equal &= all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))
    check("torch.nonzero and boolean-mask indexing on run-time scores: the rows equal ONNX Runtime's, from none to "
          "all", equal and [0, 0] in counts and any(c[1] == 6 for c in counts), f"rows per input {counts}")


def top_k_by_count(sdc, sdrun, tmp):
    import torch
    import torch.nn as nn

    class TopByCount(nn.Module):
        def forward(self, scores):
            v, i = torch.topk(scores, (scores > 0.5).sum())
            return v * 2, i

    model, plan = os.path.join(tmp, "topk.onnx"), os.path.join(tmp, "topk.sdp")
    torch.onnx.export(TopByCount(), (torch.rand(8),), model, input_names=["scores"], output_names=["v", "i"],
                      opset_version=17, dynamo=False)
    sh([sdc, "compile", model, "-o", plan])
    rng = np.random.default_rng(2)
    equal, counts = True, []
    for k, scale in enumerate((0.0, 0.8, 1.5, 9.0)):
        scores = (rng.random(8) * scale).astype(np.float32)
        want = list(ort_run(model, {"scores": scores}).values())
        path, out = os.path.join(tmp, f"t{k}.npy"), os.path.join(tmp, f"t{k}")
        np.save(path, scores)
        sh([sdrun, "infer", plan, "--input", f"scores={path}", "--output-dir", out, "--output-format", "npy"])
        got = [np.load(os.path.join(out, f"output_{i}.npy")) for i in range(2)]
        counts.append(want[0].shape[0])
        equal &= all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))
    check("torch.topk with k counted from the data (a run-time k): values and indices equal ONNX Runtime's",
          equal and 0 in counts and 8 in counts, f"k per input {counts}")


def prefix_of_selection(sdc, sdrun, tmp):
    import torch

    class FirstThreePositive(torch.nn.Module):
        def forward(self, x):
            return x[x > 0][:3]

    model, plan = os.path.join(tmp, "prefix.onnx"), os.path.join(tmp, "prefix.sdp")
    torch.onnx.export(FirstThreePositive(), (torch.randn(6),), model, input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    sh([sdc, "compile", model, "-o", plan])
    equal, counts = True, []
    for k in range(7):  # k positive values among 6
        x = np.array([1.5, -2.0, 0.25, -0.5, 3.0, 2.0], np.float32)
        x = np.where(np.arange(6) < k, np.abs(x) + 0.1, -np.abs(x) - 0.1).astype(np.float32)
        want = list(ort_run(model, {"x": x}).values())[0]
        path, out = os.path.join(tmp, f"p{k}.npy"), os.path.join(tmp, f"p{k}")
        np.save(path, x)
        sh([sdrun, "infer", plan, "--input", f"x={path}", "--output-dir", out, "--output-format", "npy"])
        got = np.load(os.path.join(out, "output_0.npy"))
        counts.append(want.shape[0])
        equal &= got.shape == want.shape and np.array_equal(got, want)
    check("a prefix [:3] of a boolean-mask selection keeps min(count, 3) values, as ONNX Runtime",
          equal and counts == [0, 1, 2, 3, 3, 3, 3], f"values per input {counts}")


def consumers_of_selection(sdc, sdrun, tmp, dynamo):
    import torch
    import torch.nn as nn

    class Consumers(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.norm = nn.Linear(4, 3), nn.LayerNorm(4)

        def forward(self, x, scores):
            rows = x[scores > 0.5]
            return (rows.mean(), rows.sum(0), rows.amax(0), torch.softmax(rows, 0), self.linear(rows),
                    self.norm(rows), rows.flatten() * 2, rows * rows.shape[0])

    how = "dynamo" if dynamo else "torchscript"
    model, plan = os.path.join(tmp, f"consumers_{how}.onnx"), os.path.join(tmp, f"consumers_{how}.sdp")
    torch.manual_seed(0)
    extra = {} if dynamo else {"opset_version": 17}
    torch.onnx.export(Consumers().eval(), (torch.randn(6, 4), torch.rand(6)), model, input_names=["x", "scores"],
                      dynamo=dynamo, **extra)
    try:
        sh([sdc, "compile", model, "-o", plan])
    except RuntimeError as e:
        check(f"consumers of x[mask] ({how} export) compile", False, str(e)[-300:])
        return
    rng = np.random.default_rng(3)
    worst, shapes_ok, empty_mean_nan, counts = 0.0, True, True, []
    for k in range(4):
        x = rng.standard_normal((6, 4)).astype(np.float32)
        scores = np.array([[0.1] * 6, [0.9, 0.1, 0.7, 0.2, 0.6, 0.3], [0.9] + [0.1] * 5, [0.9] * 6][k], np.float32)
        want = list(ort_run(model, {"x": x, "scores": scores}).values())
        got = infer_npy(sdrun, plan, {"x": x, "scores": scores}, os.path.join(tmp, f"c{how}{k}"), len(want))
        counts.append(int((scores > 0.5).sum()))
        if counts[-1] == 0:  # ONNX Runtime's ReduceMean of nothing is 0, PyTorch's NaN
            empty_mean_nan &= bool(np.isnan(got[0]))
            got, want = got[1:], want[1:]
        shapes_ok &= all(g.shape == w.shape for g, w in zip(got, want))
        if shapes_ok:
            worst = max([worst] + [max_abs_diff(g, w) for g, w in zip(got, want)])
    check(f"consumers of x[mask] ({how} export: mean, column sum and max, softmax along the rows, Linear, LayerNorm, "
          "flatten, scale by the row count) equal ONNX Runtime's for 0, 1, 3 and 6 rows; the mean of no rows is NaN",
          shapes_ok and worst <= 1e-5 and empty_mean_nan and counts == [0, 3, 1, 6],
          f"rows {counts}, max |diff| {worst:.2e}, empty mean NaN {empty_mean_nan}")


if __name__ == "__main__":
    sys.exit(main())
