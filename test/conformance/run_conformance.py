#!/usr/bin/env python3
"""ONNX backend conformance: compile and run every model in Debian's
libonnx-testdata with sdc/sdrun and compare against the expected outputs
(rtol 1e-3, atol 1e-5).

Each test ends as pass, fail or unsupported (the importer refused an op with
its clear error). Counts are printed per category; with --check, any test in
expected_pass.txt that no longer passes fails the run.
"""
import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

DATA = "/usr/share/libonnx-testdata/data"
CATEGORIES = ["node", "simple", "pytorch-converted", "pytorch-operator"]
HERE = os.path.dirname(os.path.abspath(__file__))
UNSUPPORTED_MARKERS = ("unsupported operator", "not supported", "unsupported element type", "to unsupported type", "not supported at inference",
                       "has a kind", "operator domain", "is not a tensor")


def model_inputs(model_path):
    m = onnx.load(model_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


def load_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def compare(expected, actual):
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    if expected.dtype.kind in "fc":
        if not np.allclose(actual, expected, rtol=1e-3, atol=1e-5, equal_nan=True):
            err = np.nanmax(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))
            return f"values differ (max abs err {err:.3g})"
    elif not np.array_equal(actual, expected):
        return "values differ"
    return None


def run_test(args, test_dir):
    model = os.path.join(test_dir, "model.onnx")
    data_sets = sorted(d for d in os.listdir(test_dir) if d.startswith("test_data_set"))
    if not data_sets:
        return "fail", "no test data"
    ds = os.path.join(test_dir, data_sets[0])
    try:
        names = model_inputs(model)
    except Exception as e:  # the model itself cannot be read by python-onnx
        return "fail", f"cannot read model: {e}"
    shapes, binds = [], []
    for i, name in enumerate(names):
        p = os.path.join(ds, f"input_{i}.pb")
        if not os.path.exists(p):
            return "fail", f"missing {p}"
        try:
            dims = load_pb(p).shape
        except Exception:  # sequence/optional inputs: let sdc judge the model
            continue
        shapes += ["--shapes", f"{name}=" + ("x".join(str(d) for d in dims) if dims else "scalar")]
        value = load_pb(p)
        if value.dtype.kind in "iub" or value.size <= 16:
            binds += ["--bind", f"{name}={p}"]
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan.sdp")
        try:
            r = subprocess.run([args.sdc, "compile", model, "-o", plan] + shapes, capture_output=True, text=True,
                               timeout=120)
        except subprocess.TimeoutExpired:
            return "fail", "sdc timed out"
        # Inputs that determine shapes (a Reshape target, Slice starts, ...) must be
        # known ahead of time: retry with the integer inputs bound as constants.
        if r.returncode > 0 and binds and ("dynamic shape" in r.stderr or "must be a constant" in r.stderr):
            bound = {b.split("=", 1)[0] for b in binds[1::2]}
            kept = [x for pair in zip(shapes[0::2], shapes[1::2]) if pair[1].split("=", 1)[0] not in bound
                    for x in pair]
            r = subprocess.run([args.sdc, "compile", model, "-o", plan] + kept + binds, capture_output=True,
                               text=True, timeout=120)
        else:
            bound = set()
        if r.returncode != 0:
            msg = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
            if r.returncode < 0:
                return "fail", f"sdc crashed (signal {-r.returncode})"
            kind = "unsupported" if any(m in msg for m in UNSUPPORTED_MARKERS) else "fail"
            return kind, msg
        out = os.path.join(tmp, "out")
        feeds = []
        for i, name in enumerate(names):
            if name not in bound:
                feeds += ["--input", f"{name}=" + os.path.join(ds, f"input_{i}.pb")]
        try:
            r = subprocess.run([args.sdrun, "infer", plan] + feeds + [ "--output-dir", out, "--threads", "1"],
                               capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return "fail", "sdrun timed out"
        if r.returncode != 0:
            if r.returncode < 0:
                return "fail", f"sdrun crashed (signal {-r.returncode})"
            return "fail", (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        i = 0
        while os.path.exists(os.path.join(ds, f"output_{i}.pb")):
            try:
                expected = load_pb(os.path.join(ds, f"output_{i}.pb"))
            except Exception:
                return "unsupported", "expected output is not a plain tensor (sequence/optional)"
            got_path = os.path.join(out, f"output_{i}.pb")
            if not os.path.exists(got_path):
                return "fail", f"output {i} missing"
            try:
                why = compare(expected, load_pb(got_path))
            except Exception as e:
                why = f"cannot compare: {e}"
            if why:
                return "fail", f"output {i}: {why}"
            i += 1
    return "pass", ("inputs bound at compile time: " + ",".join(sorted(bound))) if bound else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory holding tools/sdc and tools/sdrun")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--filter", default="", help="only tests whose name contains this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--results", default=os.path.join(HERE, "results.txt"), help="per-test results file")
    ap.add_argument("--check", action="store_true", help="fail if a test in expected_pass.txt does not pass")
    ap.add_argument("--update", action="store_true", help="rewrite expected_pass.txt from this run")
    args = ap.parse_args()
    args.sdc = os.path.join(args.build, "tools", "sdc")
    args.sdrun = os.path.join(args.build, "tools", "sdrun")
    tests = []
    for cat in args.categories.split(","):
        root = os.path.join(DATA, cat)
        if not os.path.isdir(root):
            print(f"conformance: {root} missing (install libonnx-testdata)", file=sys.stderr)
            return 2
        for name in sorted(os.listdir(root)):
            if args.filter in name and os.path.exists(os.path.join(root, name, "model.onnx")):
                tests.append((cat, name))
    results = {}
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futs = {pool.submit(run_test, args, os.path.join(DATA, c, n)): (c, n) for c, n in tests}
        for f in cf.as_completed(futs):
            results[futs[f]] = f.result()
    counts = {}
    for (cat, _), (status, _) in results.items():
        counts.setdefault(cat, {"pass": 0, "fail": 0, "unsupported": 0})[status] += 1
    with open(args.results, "w") as f:
        for (cat, name) in sorted(results):
            status, msg = results[(cat, name)]
            # Keep the file stable across runs: no temp dirs or data prefixes.
            msg = re.sub(r"/tmp/[^/ ]+/", "", msg).replace(DATA + "/", "")
            f.write(f"{cat}/{name}\t{status}\t{msg}\n")
    total = {"pass": 0, "fail": 0, "unsupported": 0}
    for cat in sorted(counts):
        c = counts[cat]
        for k in total:
            total[k] += c[k]
        print(f"conformance {cat:18s} pass {c['pass']:4d}  fail {c['fail']:4d}  unsupported {c['unsupported']:4d}")
    print(f"conformance {'total':18s} pass {total['pass']:4d}  fail {total['fail']:4d}  "
          f"unsupported {total['unsupported']:4d}  (details: {args.results})")
    expected_path = os.path.join(HERE, "expected_pass.txt")
    passing = sorted(f"{c}/{n}" for (c, n), (s, _) in results.items() if s == "pass")
    if args.update:
        with open(expected_path, "w") as f:
            f.write("\n".join(passing) + "\n")
    if args.check:
        with open(expected_path) as f:
            expected = [l.strip() for l in f if l.strip()]
        ran = {f"{c}/{n}" for c, n in tests}
        regressed = [t for t in expected if t in ran and results[tuple(t.split("/", 1))][0] != "pass"]
        for t in regressed:
            print(f"REGRESSION {t}: {results[tuple(t.split('/', 1))][1]}")
        if regressed:
            print(f"conformance: {len(regressed)} previously passing tests fail")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
