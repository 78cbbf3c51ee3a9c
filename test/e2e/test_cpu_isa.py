#!/usr/bin/env python3
"""The f32 GEMM in use is the CPU's fastest build, chosen from cpuid feature
flags and not from what OpenBLAS makes of the CPU model: `sdrun inspect
--cpu` must report avx512 on a CPU with AVX-512F and avx2 on one with
AVX2+FMA (a generic fallback there fails), also with OPENBLAS_CORETYPE
forcing OpenBLAS's SSE3 kernels. A plan whose frozen weights the session
packs gives the numpy result with every build this CPU can run
(SD_CPU_ISA caps the choice)."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from e2e_util import sh, tool_paths


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def report(sdrun, **env):
    out = sh([sdrun, "inspect", "--cpu"], env={**os.environ, **env})
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return fields


def make_model(path, rng):
    """x[9,40] -> MatMul W1[40,70] -> Relu -> Gemm(transB) W2[33,70] + b -> y."""
    w1 = rng.standard_normal((40, 70)).astype(np.float32)
    w2 = rng.standard_normal((33, 70)).astype(np.float32)
    b = rng.standard_normal(33).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "isa", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [9, 33])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                               numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w1, w2, b


def main():
    sdc, sdrun = tool_paths()
    flags = cpu_flags()
    best = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "generic"
    failures = []
    got = report(sdrun)
    print(f"cpu: {got.get('cpu')}; features: {got.get('features')}; f32 gemm: {got.get('f32 gemm')}")
    if got.get("f32 gemm") != best:
        failures.append(f"f32 gemm is {got.get('f32 gemm')!r}, this CPU's best is {best!r}")
    forced = report(sdrun, OPENBLAS_CORETYPE="Prescott")
    if forced.get("f32 gemm") != best:
        failures.append(f"with OPENBLAS_CORETYPE=Prescott the f32 gemm is {forced.get('f32 gemm')!r}")
    if "Prescott" not in forced.get("f64 gemm", ""):
        failures.append(f"OPENBLAS_CORETYPE did not reach OpenBLAS: {forced.get('f64 gemm')!r}")
    isas = {"avx512": ["avx512", "avx2", "generic"], "avx2": ["avx2", "generic"], "generic": ["generic"]}[best]
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(5)
        w1, w2, b = make_model(os.path.join(tmp, "m.onnx"), rng)
        x = rng.standard_normal((9, 40)).astype(np.float32)
        np.save(os.path.join(tmp, "x.npy"), x)
        want = np.maximum(x.astype(np.float64) @ w1, 0) @ w2.T.astype(np.float64) + b
        plan = os.path.join(tmp, "m.sdp")
        sh([sdc, "compile", os.path.join(tmp, "m.onnx"), "-o", plan])
        for isa in isas:
            capped = report(sdrun, SD_CPU_ISA=isa)
            if capped.get("f32 gemm") != isa:
                failures.append(f"SD_CPU_ISA={isa} reports {capped.get('f32 gemm')!r}")
            out = os.path.join(tmp, isa)
            sh([sdrun, "infer", plan, "--input", f"x={tmp}/x.npy", "--output-dir", out, "--output-format", "npy",
                "--threads", "2"], env={**os.environ, "SD_CPU_ISA": isa})
            y = np.load(os.path.join(out, "output_0.npy"))
            err = float(np.abs(y - want).max())
            print(f"SD_CPU_ISA={isa}: max |y - numpy| = {err:.2e}")
            if err > 1e-3:
                failures.append(f"SD_CPU_ISA={isa}: output differs from numpy by {err:.2e}")
    for f in failures:
        print("FAIL:", f)
    print(f"{'FAILED' if failures else 'PASSED'}: f32 gemm {best}, {len(isas)} builds checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
