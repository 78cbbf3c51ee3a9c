#!/usr/bin/env python3
"""Runs an ONNX model with ONNX Runtime (CPU, the PyPI `onnxruntime` package):
the reference for sdc's model tests and the peer in benchmarks.

  ort_run.py MODEL.onnx --input NAME=FILE.npy|FILE.pb ... [--output-dir DIR]
             [--threads N] [--iterations N] [--warmup N] [--opt-level all]

Outputs are written as DIR/<name>.npy. With --iterations the last line printed
is JSON with median_ms. The peer setting is ORT's own graph optimizations at
ORT_ENABLE_ALL ("all"), intra-op threads = --threads, one inter-op thread.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
OPT_LEVEL_NAMES = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
                   "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def read_tensor(path):
    if path.endswith(".pb"):
        import onnx
        from onnx import numpy_helper
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return numpy_helper.to_array(t)
    return np.load(path, allow_pickle=False)


def make_session(model, threads, opt_level):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = OPT_LEVELS[opt_level]
    opts.inter_op_num_threads = 1
    if threads > 0:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def time_runs(run, iterations, warmup):
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0]


def main():
    ap = argparse.ArgumentParser(description="Run an ONNX model with ONNX Runtime (CPU).")
    ap.add_argument("model")
    ap.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                    help="a graph input from a .npy or TensorProto .pb file (repeatable)")
    ap.add_argument("--output-dir", help="write each output as DIR/<name>.npy")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT's default)")
    ap.add_argument("--iterations", type=int, default=0, help="timed runs; prints JSON with median_ms")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--opt-level", choices=sorted(OPT_LEVELS), default="all",
                    help="ORT graph optimization level (default: all = ORT_ENABLE_ALL)")
    a = ap.parse_args()
    feeds = {}
    for spec in a.input:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"--input '{spec}': expected NAME=FILE")
        feeds[name] = read_tensor(path)
    try:
        sess = make_session(a.model, a.threads, a.opt_level)
        results = sess.run(None, feeds)
    except Exception as e:  # ORT raises its own exception types; one line is enough
        print(f"ort_run: error: {a.model}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    if a.output_dir:
        os.makedirs(a.output_dir, exist_ok=True)
        for out, value in zip(sess.get_outputs(), results):
            np.save(os.path.join(a.output_dir, f"{out.name}.npy"), value)
    if a.iterations > 0:
        median, best = time_runs(lambda: sess.run(None, feeds), a.iterations, a.warmup)
        print(json.dumps({"runtime": "onnxruntime", "version": ort.__version__,
                          "opt_level": OPT_LEVEL_NAMES[a.opt_level], "iterations": a.iterations,
                          "threads": a.threads, "median_ms": median, "min_ms": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
