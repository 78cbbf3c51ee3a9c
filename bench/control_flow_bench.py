#!/usr/bin/env python3
"""Loop steps and If steps against unrolling, selecting and ONNX Runtime, in
one run (issue 16):

Loop: an ONNX Loop of T iterations carrying h [1, 128] (h = tanh(h W + b),
every h kept as a scan output). sdc runs it as a loop step over one body
entry (the default past --max-unroll 64) or unrolled (--max-unroll T);
compile time and plan size are reported with the run time.

If: an If on a run-time scalar whose branches are two 256x256 matrix
products each on x [64, 256] (relu(x W1) W2, else tanh(x W2) W1). sdc runs
it as an If step (the default: its branches cost more than --max-select) or
selects (--max-select 2^62: both branches run).

Peers: sdrun bench (in-process, random inputs), ONNX Runtime (ORT_ENABLE_ALL),
each in its own process at the same threads; times are medians.

  bench/control_flow_bench.py [--build build] [--threads 2] [--iterations 20]
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peers import bench_cli, cpu_model, one_line, run_child, table, timed, versions  # noqa: E402

HIDDEN, ROWS, WIDTH = 128, 64, 256


def loop_model(path, trips):
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal((1, HIDDEN)) * 0.1).astype(np.float32), "b")
    m = numpy_helper.from_array(np.array(trips, np.int64), "m")
    hv = lambda name: h.make_tensor_value_info(name, T.FLOAT, [1, HIDDEN])
    body = h.make_graph([h.make_node("MatMul", ["h_in", "w"], ["hw"]), h.make_node("Add", ["hw", "b"], ["pre"]),
                         h.make_node("Tanh", ["pre"], ["h_out"]), h.make_node("Identity", ["h_out"], ["seen"]),
                         h.make_node("Identity", ["c_in"], ["c_out"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
                         hv("h_in")], [h.make_tensor_value_info("c_out", T.BOOL, []), hv("h_out"), hv("seen")])
    g = h.make_graph([h.make_node("Loop", ["m", "", "h0"], ["h", "all"], body=body)], "loop", [hv("h0")],
                     [hv("h"), h.make_tensor_value_info("all", T.FLOAT, [trips, 1, HIDDEN])], initializer=[w, b, m])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return {"h0": rng.standard_normal((1, HIDDEN)).astype(np.float32)}


def if_model(path):
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper
    rng = np.random.default_rng(1)
    ws = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32), n)
          for n in ("w1", "w2")]
    out = lambda name: h.make_tensor_value_info(name, T.FLOAT, [ROWS, WIDTH])
    then = h.make_graph([h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Relu", ["a"], ["ar"]),
                         h.make_node("MatMul", ["ar", "w2"], ["t"])], "then", [], [out("t")])
    other = h.make_graph([h.make_node("MatMul", ["x", "w2"], ["d"]), h.make_node("Tanh", ["d"], ["dt"]),
                          h.make_node("MatMul", ["dt", "w1"], ["e"])], "else", [], [out("e")])
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    g = h.make_graph([h.make_node("Greater", ["p", "zero"], ["c"]),
                      h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "branch",
                     [out("x"), h.make_tensor_value_info("p", T.FLOAT, [])], [out("y")], initializer=ws + [zero])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return {"x": rng.standard_normal((ROWS, WIDTH)).astype(np.float32), "p": np.array(1, np.float32)}


def ort_child(a):
    import numpy as np
    from ort_run import make_session
    feeds = {k: np.load(v) for k, v in json.loads(a.feeds).items()}
    sess = make_session(a.model, a.threads, "all")
    print(json.dumps({"median_ms": timed(lambda: sess.run(None, feeds), a.iterations, 5)}))


def sdrun_row(a, sdc, sdrun, model, flags, feeds_dir, tmp, tag):
    plan = os.path.join(tmp, f"{tag}.sdp")
    t0 = time.perf_counter()
    subprocess.run([sdc, "compile", model, "-o", plan] + flags, check=True, capture_output=True)
    compile_s = time.perf_counter() - t0
    ms = run_child([sdrun, "bench", plan, "--input-dir", feeds_dir, "--iterations", str(a.iterations), "--warmup",
                    "5", "--threads", str(a.threads)])["median_ms"]
    return ms, compile_s, os.path.getsize(plan)


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__, ("peer", "model", "feeds"))
    if a.peer:
        return ort_child(a)
    import numpy as np
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(f"Loop, {t} iterations", f"loop{t}", lambda p, t=t: loop_model(p, t),
                  [("loop step", []), ("unrolled", ["--max-unroll", str(t)])]) for t in (200, 1000)]
        cases.append((f"If, two {WIDTH}x{WIDTH} matmuls per branch", "if", if_model,
                      [("If step", []), ("select", ["--max-select", str(1 << 62)])]))
        for name, tag, make, variants in cases:
            model = os.path.join(tmp, f"{tag}.onnx")
            feeds = make(model)
            feeds_dir = os.path.join(tmp, f"{tag}_in")
            os.makedirs(feeds_dir)
            paths = {}
            for i, (k, v) in enumerate(feeds.items()):  # graph-input order, as --input-dir reads them
                paths[k] = os.path.join(feeds_dir, f"input_{i}.npy")
                np.save(paths[k], v)
            shapes = [f for k, v in feeds.items() for f in ("--shapes", f"{k}=" + ("x".join(map(str, v.shape)) or "scalar"))]
            row = {"model": name}
            for how, flags in variants:
                try:
                    ms, secs, size = sdrun_row(a, sdc, sdrun, model, shapes + flags, feeds_dir, tmp, f"{tag}_{how}")
                    row[f"sdrun {how}"] = ms
                    row[f"compile {how}"] = f"{secs:.2f} s, {size / 1024:.0f} KiB"
                except Exception as e:  # a peer that fails is reported, never dropped
                    row[f"sdrun {how}"] = one_line(e)
            try:
                row["ort"] = run_child(me + ["--peer", "ort", "--model", model, "--feeds", json.dumps(paths)])["median_ms"]
            except Exception as e:
                row["ort"] = one_line(e)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"CPU: {cpu_model()}, {a.threads} threads; versions: {json.dumps(versions())}")
    print("\nRun time, ms (x: relative to the first sdrun column); compile time and plan size\n")
    for r in rows:
        cols = [k for k in r if k.startswith("sdrun ")]
        print(table([r], ["model"], cols + ["ort"], cols[0]))
        print("  " + "; ".join(f"{k}: {v}" for k, v in r.items() if k.startswith("compile ")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
