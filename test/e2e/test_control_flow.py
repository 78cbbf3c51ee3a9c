#!/usr/bin/env python3
"""Models with control flow and recurrent layers, as users bring them:

  silero     Silero VAD from its PyPI wheel (a real speech model: If on the
             sample rate, LSTM): sdrun equals ONNX Runtime, with the rate bound
             (one branch compiled), and its exports without a sample-rate input
  if         a PyTorch-scripted `if` on an input's values: both ways equal PyTorch
  ifstep     Ifs whose branches cost more than --max-select run only the taken
             branch (If steps over body entries), nested and inside a loop
             step's body: equal PyTorch / ONNX Runtime and the selecting plan
  while      a scripted while loop (ONNX Loop, data-dependent stop) under
             --max-trip: equals PyTorch when it stops in time; past the bound
             the run fails with one clear line and writes no output
  loopstep   loops longer than --max-unroll run as a loop step over their
             body entry: a 1000-iteration Loop with a scan output and an
             outer-scope input, a 100-step Scan (reverse input, reversed
             output on axis 1), an 80-step Scan-8 per batch row, nested
             loops and a scripted while loop that runs thousands of
             iterations under --max-trip 100000 equal ONNX Runtime / PyTorch
             and the unrolled plans
  rnn        a GRU/LSTM speech-style tagger (2 layers, bidirectional,
             batch_first) exported by PyTorch (TorchScript and dynamo):
             inference equals PyTorch
  train      a GRU and an LSTM language model trained 10 steps by sdrun and
             by PyTorch (nn.GRU / nn.LSTM, same AdamW): per-step losses agree;
             LoRA on the linear layer before an LSTM trains through it; a
             language model with a loop step on its ids and a selected If on
             activations trains as PyTorch does
"""
import importlib.util
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import clean_error_problems, sh, tool_paths
from test_training import ADAM_EPS, BATCH, SEQ, check, make_data, report, torch_losses

STEPS = 10


def run_plan(sdrun, plan, feeds, tmp, tag):
    args = []
    for name, value in feeds.items():
        path = os.path.join(tmp, f"{tag}_{name}.npy")
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    out = os.path.join(tmp, f"{tag}_out")
    sh([sdrun, "infer", plan] + args + ["--output-dir", out, "--output-format", "npy"])
    outs, i = [], 0
    while os.path.exists(os.path.join(out, f"output_{i}.npy")):
        outs.append(np.load(os.path.join(out, f"output_{i}.npy")))
        i += 1
    return outs


def shapes_of(feeds):
    args = []
    for name, v in feeds.items():
        args += ["--shapes", f"{name}=" + ("x".join(map(str, v.shape)) or "scalar")]
    return args


def max_err(got, want):
    return max(float(np.max(np.abs(g - w))) if g.shape == w.shape else float("inf") for g, w in zip(got, want))


def silero(sdc, sdrun, tmp):
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper
    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        check("Silero VAD wheel installed (requirements-models.txt)", False, "silero_vad not found")
        return
    data = os.path.join(os.path.dirname(spec.origin), "data")
    rng = np.random.default_rng(0)
    cases = [("silero_vad.onnx", 512, 16000, True), ("silero_vad.onnx", 256, 8000, True),
             ("silero_vad_16k_op15.onnx", 512, 16000, False), ("silero_vad_op18_ifless.onnx", 256, 8000, False)]
    for model, samples, rate, bind in cases:
        path = os.path.join(data, model)
        names = [i.name for i in onnx.load(path).graph.input]
        feeds = {"input": (rng.standard_normal((1, samples)) * 0.1).astype(np.float32),
                 "state": (rng.standard_normal((2, 1, 128)) * 0.1).astype(np.float32),
                 "sr": np.array(rate, np.int64)}
        feeds = {k: v for k, v in feeds.items() if k in names}
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        plan = os.path.join(tmp, f"vad_{samples}.sdp")
        extra = []
        if bind:
            pb = os.path.join(tmp, "sr.pb")
            with open(pb, "wb") as f:
                f.write(numpy_helper.from_array(feeds.pop("sr"), "sr").SerializeToString())
            extra = ["--bind", f"sr={pb}"]
        sh([sdc, "compile", path, "-o", plan] + shapes_of(feeds) + extra)
        err = max_err(run_plan(sdrun, plan, feeds, tmp, "vad"), want)
        how = "sample rate bound: one branch compiled" if bind else "no sample-rate input: Ifs fold on shapes, if any"
        check(f"Silero VAD {model} at {rate} Hz ({how}): probability and state equal ONNX Runtime (1e-5)",
              err <= 1e-5, f"max abs err {err:.1e}")


def scripted_if(sdc, sdrun, tmp):
    import torch

    @torch.jit.script
    def branch(x):
        if bool(x.sum() > 0):
            y = x * 2.0 + 1.0
        else:
            y = torch.tanh(x) - 1.0
        return y

    class M(torch.nn.Module):
        def forward(self, x):
            return branch(x)

    path = os.path.join(tmp, "if.onnx")
    x = torch.ones(2, 3)
    torch.onnx.export(M(), (x,), path, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"])
    import onnx
    ops = [n.op_type for n in onnx.load(path).graph.node]
    plan = os.path.join(tmp, "if.sdp")
    sh([sdc, "compile", path, "--shapes", "x=2x3", "-o", plan])
    worst = 0.0
    for sign in (1.0, -1.0):
        v = (np.abs(np.random.default_rng(1).standard_normal((2, 3))) * sign).astype(np.float32)
        want = branch(torch.from_numpy(v)).numpy()
        worst = max(worst, max_err(run_plan(sdrun, plan, {"x": v}, tmp, "if"), [want]))
    check("scripted if on an input's values: the exported If matches PyTorch both ways (1e-6)",
          "If" in ops and worst <= 1e-6, f"max abs err {worst:.1e}, ops {sorted(set(ops))}")


def if_steps(sdc, sdrun, tmp):
    """Ifs on run-time data whose branches cost more than --max-select run
    only the taken branch (an If step over two body entries)."""
    import onnx
    import torch
    from onnx import TensorProto as T, helper as h

    @torch.jit.script
    def branch(x, w):
        if bool(x.sum() > 0):
            y = torch.relu(x @ w) + 1.0
        else:
            y = torch.tanh(x @ w.t()) - 1.0
        return y

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 0.1)

        def forward(self, x):
            return branch(x, self.w)

    path = os.path.join(tmp, "if_matmul.onnx")
    m = M()
    torch.onnx.export(m, (torch.ones(8, 64),), path, dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["y"])
    selects = dry_run_notes(sdc, path, ["--shapes", "x=8x64"])
    steps = dry_run_notes(sdc, path, ["--shapes", "x=8x64", "--max-select", "1000"])
    worst = {}
    for how, extra in (("select", []), ("step", ["--max-select", "1000"])):
        plan = os.path.join(tmp, f"if_{how}.sdp")
        sh([sdc, "compile", path, "--shapes", "x=8x64", "-o", plan] + extra)
        for sign in (1.0, -1.0):
            v = (np.abs(np.random.default_rng(2).standard_normal((8, 64))) * sign).astype(np.float32)
            with torch.no_grad():
                want = m(torch.from_numpy(v)).numpy()
            worst[how] = max(worst.get(how, 0.0), max_err(run_plan(sdrun, plan, {"x": v}, tmp, "ifm"), [want]))
    inspect = sh([sdrun, "inspect", os.path.join(tmp, "if_step.sdp")])
    check("an If with 64x64 matmul branches: selected at the default --max-select, an If step over two body "
          "entries at --max-select 1000; both equal PyTorch both ways (1e-5)",
          "both branches computed" in selects and "at most --max-select 65536" in selects and
          "an If step runs entry 'if_then_0' or 'if_else_0'" in steps and
          "if_else_0 (body of a Loop or If step)" in inspect and max(worst.values()) <= 1e-5,
          f"max abs err {worst}; notes: {selects.strip()} / {steps.strip()}")

    # Nested: the outer then branch holds an If and a 100-iteration loop step
    # whose body branches on its carried value.
    vec = lambda name: h.make_tensor_value_info(name, T.FLOAT, [4])
    scalar = lambda name, t=T.FLOAT: h.make_tensor_value_info(name, t, [])
    const = lambda name, v: h.make_node("Constant", [], [name], value=h.make_tensor("", T.FLOAT, [], [v]))
    halve = h.make_graph([const("half", 0.5), h.make_node("Mul", ["v_in", "half"], ["h"])], "halve", [], [vec("h")])
    grow = h.make_graph([const("one", 1.0), h.make_node("Add", ["v_in", "one"], ["g"])], "grow", [], [vec("g")])
    body = h.make_graph([h.make_node("ReduceSum", ["v_in"], ["s"], keepdims=0), const("lim", 2.0),
                         h.make_node("Greater", ["s", "lim"], ["big"]),
                         h.make_node("If", ["big"], ["v_out"], then_branch=halve, else_branch=grow),
                         h.make_node("Identity", ["c_in"], ["c_out"])], "body",
                        [scalar("i", T.INT64), scalar("c_in", T.BOOL), vec("v_in")], [scalar("c_out", T.BOOL), vec("v_out")])
    doubled = h.make_graph([h.make_node("Add", ["x", "x"], ["d"])], "doubled", [], [vec("d")])
    squared = h.make_graph([h.make_node("Mul", ["x", "x"], ["sq"])], "squared", [], [vec("sq")])
    outer_then = h.make_graph([h.make_node("If", ["b"], ["u"], then_branch=doubled, else_branch=squared),
                               h.make_node("Constant", [], ["M"], value=h.make_tensor("", T.INT64, [], [100])),
                               h.make_node("Loop", ["M", "", "u"], ["t"], body=body)], "outer_then", [], [vec("t")])
    outer_else = h.make_graph([h.make_node("Neg", ["x"], ["n"])], "outer_else", [], [vec("n")])
    g = h.make_graph([const("zero", 0.0), h.make_node("Greater", ["p", "zero"], ["a"]),
                      h.make_node("Greater", ["q", "zero"], ["b"]),
                      h.make_node("If", ["a"], ["y"], then_branch=outer_then, else_branch=outer_else)], "main",
                     [vec("x"), scalar("p"), scalar("q")], [vec("y")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = os.path.join(tmp, "if_nested.onnx")
    onnx.save(model, path)
    notes = dry_run_notes(sdc, path, ["--max-select", "0", "--max-unroll", "8"])
    plans = {}
    for how, extra in (("steps", ["--max-select", "0", "--max-unroll", "8"]), ("selects", [])):
        plans[how] = os.path.join(tmp, f"if_nested_{how}.sdp")
        sh([sdc, "compile", path, "-o", plans[how]] + extra)
    worst, same = 0.0, True
    x = np.array([0.3, -0.2, 0.5, 0.1], np.float32)
    for p, q in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
        feeds = {"x": x, "p": np.array(p, np.float32), "q": np.array(q, np.float32)}
        got = run_plan(sdrun, plans["steps"], feeds, tmp, "ifn")
        worst = max(worst, max_err(got, ort_outputs(path, feeds)))
        same &= np.array_equal(got[0], run_plan(sdrun, plans["selects"], feeds, tmp, "ifs")[0])
    check("nested If steps (an If and a 100-iteration loop step with an If in its body, inside an If branch) "
          "equal ONNX Runtime (1e-6) and, bit for bit, the plan that selects",
          notes.count("an If step runs") == 3 and worst <= 1e-6 and same, f"max abs err {worst:.1e}, same {same}; {notes}")


def loop_model(path, body_nodes, body_outs, loop_inputs, graph_inputs, graph_outputs, init=(), iteration="i"):
    """One Loop node over a body (iteration number, condition c_in, carried x_in)."""
    import onnx
    from onnx import TensorProto as T, helper as h
    body = h.make_graph(body_nodes, "body", [h.make_tensor_value_info(iteration, T.INT64, []),
                                             h.make_tensor_value_info("c_in", T.BOOL, []),
                                             h.make_tensor_value_info("x_in", T.FLOAT, [4])], body_outs)
    g = h.make_graph([h.make_node("Loop", loop_inputs, [o.name for o in graph_outputs], body=body)], "main",
                     graph_inputs, graph_outputs, initializer=list(init))
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def ort_outputs(path, feeds):
    import onnxruntime as ort
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def dry_run_notes(sdc, path, extra):
    import subprocess
    r = subprocess.run([sdc, "compile", path, "--dry-run"] + extra, capture_output=True, text=True)
    return r.stdout + r.stderr


def export_while(tmp, name, scale, shift):
    """A PyTorch while loop, x = x * scale + shift until x.sum() reaches
    limit, exported as an ONNX Loop with a run-time stop. Returns its path
    and the loop as a PyTorch function of (x, limit)."""
    import torch

    @torch.jit.script
    def affine_while(x, limit, scale: float, shift: float):
        while bool(x.sum() < limit):
            x = x * scale + shift
        return x

    class M(torch.nn.Module):
        def forward(self, x, limit):
            return affine_while(x, limit, scale, shift)

    path = os.path.join(tmp, f"{name}.onnx")
    torch.onnx.export(M(), (torch.ones(4), torch.tensor(10.0)), path, dynamo=False, opset_version=17,
                      input_names=["x", "limit"], output_names=["y"])
    return path, lambda x, limit: affine_while(x, limit, scale, shift)


def loop_steps(sdc, sdrun, tmp):
    from onnx import TensorProto as T, helper as h
    rng = np.random.default_rng(3)
    vec = lambda name: h.make_tensor_value_info(name, T.FLOAT, [4])
    # x <- x * 0.999 + w * i, every x kept as a scan output; w is an outer-scope input.
    path = os.path.join(tmp, "loop1000.onnx")
    loop_model(path, [h.make_node("Constant", [], ["decay"], value=h.make_tensor("", T.FLOAT, [], [0.999])),
                      h.make_node("Cast", ["i"], ["f"], to=T.FLOAT), h.make_node("Mul", ["x_in", "decay"], ["d"]),
                      h.make_node("Mul", ["f", "w"], ["wf"]), h.make_node("Add", ["d", "wf"], ["x_out"]),
                      h.make_node("Identity", ["x_out"], ["scan"]), h.make_node("Identity", ["c_in"], ["c_out"])],
               [h.make_tensor_value_info("c_out", T.BOOL, []), vec("x_out"), vec("scan")], ["M", "", "x"],
               [vec("x"), vec("w")], [vec("y"), h.make_tensor_value_info("ys", T.FLOAT, [1000, 4])],
               [h.make_tensor("M", T.INT64, [], [1000])])
    feeds = {"x": rng.standard_normal(4).astype(np.float32), "w": (rng.standard_normal(4) * 1e-3).astype(np.float32)}
    want = ort_outputs(path, feeds)
    notes = dry_run_notes(sdc, path, [])
    step, unrolled = os.path.join(tmp, "loop_step.sdp"), os.path.join(tmp, "loop_unrolled.sdp")
    sh([sdc, "compile", path, "-o", step])
    sh([sdc, "compile", path, "--max-unroll", "1000", "-o", unrolled])
    got_step, got_unrolled = run_plan(sdrun, step, feeds, tmp, "ls"), run_plan(sdrun, unrolled, feeds, tmp, "lu")
    err = max_err(got_step, want)
    check("a 1000-iteration Loop (scan output, outer-scope input) is a loop step by default and equals ONNX Runtime "
          "(1e-6) and the unrolled plan (bit for bit)",
          "loop step over entry" in notes and err <= 1e-6 and max_err(got_step, got_unrolled) == 0,
          f"max abs err {err:.1e}; vs unrolled {max_err(got_step, got_unrolled):.1e}; {notes.strip()!r}")

    # Scan-9+: 100 steps, the input read backwards, the second output reversed and stacked on axis 1.
    import onnx
    body = h.make_graph([h.make_node("Mul", ["x_t", "w"], ["xw"]), h.make_node("Add", ["s_in", "xw"], ["s_out"]),
                         h.make_node("Identity", ["s_out"], ["y_t"]), h.make_node("Mul", ["x_t", "x_t"], ["z_t"])],
                        "body", [vec("s_in"), vec("x_t")], [vec("s_out"), vec("y_t"), vec("z_t")])
    g = h.make_graph([h.make_node("Scan", ["s0", "xs"], ["s", "ys", "zs"], body=body, num_scan_inputs=1,
                                  scan_input_directions=[1], scan_output_directions=[0, 1], scan_output_axes=[0, 1])],
                     "main", [vec("s0"), h.make_tensor_value_info("xs", T.FLOAT, [100, 4]), vec("w")],
                     [vec("s"), h.make_tensor_value_info("ys", T.FLOAT, [100, 4]),
                      h.make_tensor_value_info("zs", T.FLOAT, [4, 100])])
    path = os.path.join(tmp, "scan100.onnx")
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    feeds = {"s0": rng.standard_normal(4).astype(np.float32), "xs": rng.standard_normal((100, 4)).astype(np.float32),
             "w": rng.standard_normal(4).astype(np.float32)}
    plan = os.path.join(tmp, "scan100.sdp")
    sh([sdc, "compile", path, "-o", plan])
    err = max_err(run_plan(sdrun, plan, feeds, tmp, "scan"), ort_outputs(path, feeds))
    check("a 100-step Scan (reverse input, reversed output on axis 1) as a loop step equals ONNX Runtime (1e-6)",
          "loop step over 100" in dry_run_notes(sdc, path, []) and err <= 1e-6, f"max abs err {err:.1e}")

    # Scan-8: a batch axis on everything; each row is its own loop step.
    body = h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
                        "body", [vec("s_in"), vec("x_t")], [vec("s_out"), vec("y_t")])
    g = h.make_graph([h.make_node("Scan", ["", "s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, directions=[1])],
                     "main", [h.make_tensor_value_info("s0", T.FLOAT, [2, 4]),
                              h.make_tensor_value_info("xs", T.FLOAT, [2, 80, 4])],
                     [h.make_tensor_value_info("s", T.FLOAT, [2, 4]), h.make_tensor_value_info("ys", T.FLOAT, [2, 80, 4])])
    path = os.path.join(tmp, "scan8.onnx")
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 8)], ir_version=7), path)
    feeds = {"s0": (rng.standard_normal((2, 4)) * 0.1).astype(np.float32),
             "xs": (rng.standard_normal((2, 80, 4)) * 0.1).astype(np.float32)}
    plan = os.path.join(tmp, "scan8.sdp")
    sh([sdc, "compile", path, "-o", plan])
    err = max_err(run_plan(sdrun, plan, feeds, tmp, "scan8"), ort_outputs(path, feeds))
    check("an 80-step Scan-8 over 2 batch rows (reverse) as loop steps equals ONNX Runtime (1e-6)",
          "loop step over 80 step(s) per batch row" in dry_run_notes(sdc, path, []) and err <= 1e-6,
          f"max abs err {err:.1e}")

    # A Loop inside a Loop body, the inner one reading the outer's iteration number and a graph input.
    inner = h.make_graph([h.make_node("Cast", ["oi"], ["of"], to=T.FLOAT), h.make_node("Mul", ["w", "of"], ["wo"]),
                          h.make_node("Add", ["b_in", "wo"], ["b_out"]), h.make_node("Identity", ["c"], ["c_out"])],
                         "inner", [h.make_tensor_value_info("ii", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
                                   vec("b_in")], [h.make_tensor_value_info("c_out", T.BOOL, []), vec("b_out")])
    path = os.path.join(tmp, "nested.onnx")
    loop_model(path, [h.make_node("Constant", [], ["M2"], value=h.make_tensor("", T.INT64, [], [30])),
                      h.make_node("Constant", [], ["k"], value=h.make_tensor("", T.FLOAT, [], [0.01])),
                      h.make_node("Loop", ["M2", "", "x_in"], ["b"], body=inner),
                      h.make_node("Mul", ["b", "k"], ["bk"]), h.make_node("Add", ["x_in", "bk"], ["x_out"]),
                      h.make_node("Identity", ["c_in"], ["c_out"])],
               [h.make_tensor_value_info("c_out", T.BOOL, []), vec("x_out")], ["M", "", "x"], [vec("x"), vec("w")],
               [vec("y")], [h.make_tensor("M", T.INT64, [], [20])], iteration="oi")
    feeds = {"x": rng.standard_normal(4).astype(np.float32), "w": rng.standard_normal(4).astype(np.float32)}
    plan = os.path.join(tmp, "nested.sdp")
    sh([sdc, "compile", path, "--max-unroll", "8", "-o", plan])
    err = max_err(run_plan(sdrun, plan, feeds, tmp, "nested"), ort_outputs(path, feeds))
    check("nested Loops (20 x 30 iterations, both loop steps) equal ONNX Runtime (1e-5)", err <= 1e-5,
          f"max abs err {err:.1e}")

    # A PyTorch while loop that runs thousands of iterations: unrolling that
    # many is out of the question, a loop step stops on the condition.
    import torch
    path, creep = export_while(tmp, "creep", 1.001, 0.001)
    plan = os.path.join(tmp, "creep.sdp")
    sh([sdc, "compile", path, "--shapes", "x=4", "--shapes", "limit=scalar", "--max-trip", "100000", "-o", plan])
    x = np.full(4, 0.5, np.float32)
    worst = 0.0
    for limit in (3.0, 40.0):
        want = creep(torch.from_numpy(x), torch.tensor(limit)).numpy()
        worst = max(worst, max_err(run_plan(sdrun, plan, {"x": x, "limit": np.array(limit, np.float32)}, tmp, "creep"),
                                   [want]))
    check("a scripted while loop of thousands of iterations under --max-trip 100000 runs as a loop step and "
          "stops on its condition as PyTorch does (1e-4)", worst <= 1e-4, f"max abs err {worst:.1e}")
    # From -1e30 the sum only falls (to -inf, where it stays): the loop never stops.
    np.save(os.path.join(tmp, "creep_down.npy"), np.full(4, -1e30, np.float32))
    out = os.path.join(tmp, "creep_overrun")
    problems, line = clean_error_problems([sdrun, "infer", plan, "--input", f"x={os.path.join(tmp, 'creep_down.npy')}",
                                           "--input", f"limit={os.path.join(tmp, 'creep_limit.npy')}", "--output-dir", out],
                                          ["needs more than --max-trip 100000"], no_files=[out])
    check("a loop step that needs more than --max-trip stops the run with one clear line, no output", not problems,
          "; ".join(problems) or line)


def scripted_while(sdc, sdrun, tmp):
    import torch
    path, grow = export_while(tmp, "while", 1.5, 0.25)
    plan = os.path.join(tmp, "while.sdp")
    sh([sdc, "compile", path, "--shapes", "x=4", "--shapes", "limit=scalar", "--max-trip", "8", "-o", plan])
    x = np.full(4, 0.5, np.float32)
    limit = np.array(12.0, np.float32)
    want = grow(torch.from_numpy(x), torch.from_numpy(limit)).numpy()
    err = max_err(run_plan(sdrun, plan, {"x": x, "limit": limit}, tmp, "while"), [want])
    check("scripted while loop under --max-trip 8: stops on its own condition as PyTorch does (1e-6)", err <= 1e-6,
          f"max abs err {err:.1e}")
    out = os.path.join(tmp, "overrun_out")
    np.save(os.path.join(tmp, "far.npy"), np.array(1e6, np.float32))
    cmd = [sdrun, "infer", plan, "--input", f"x={os.path.join(tmp, 'while_x.npy')}", "--input",
           f"limit={os.path.join(tmp, 'far.npy')}", "--output-dir", out]
    problems, line = clean_error_problems(cmd, ["needs more than --max-trip 8"], no_files=[out])
    check("a loop that needs more than --max-trip stops the run with one clear line, no output", not problems,
          "; ".join(problems) or line)
    problems, line = clean_error_problems([sdc, "compile", path, "--shapes", "x=4", "--shapes", "limit=scalar",
                                           "-o", os.path.join(tmp, "nobound.sdp")], ["--max-trip"],
                                          no_files=[os.path.join(tmp, "nobound.sdp")])
    check("a while loop compiled without --max-trip is refused, naming the node and the flag", not problems,
          "; ".join(problems) or line)


class Tagger:
    """Speech-style frame tagger: features -> 2-layer bidirectional RNN -> frame classes."""

    @staticmethod
    def make(kind):
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(torch.nn, kind)(20, 24, num_layers=2, bidirectional=True, batch_first=True)
                self.head = torch.nn.Linear(48, 5)

            def forward(self, feats):
                return self.head(self.rnn(feats)[0])
        return M().eval()


def recurrent_inference(sdc, sdrun, tmp):
    import torch
    for kind in ("GRU", "LSTM"):
        for dynamo in (False, True):
            torch.manual_seed(0)
            model = Tagger.make(kind)
            feats = torch.randn(3, 30, 20)
            path = os.path.join(tmp, f"{kind}_{dynamo}.onnx")
            exporter = "dynamo (its default opset)" if dynamo else "TorchScript, opset 17"
            if dynamo:
                torch.onnx.export(model, (feats,), path, dynamo=True, input_names=["feats"], output_names=["logits"])
            else:
                torch.onnx.export(model, (feats,), path, dynamo=False, opset_version=17, input_names=["feats"],
                                  output_names=["logits"])
            plan = os.path.join(tmp, f"{kind}.sdp")
            sh([sdc, "compile", path, "--shapes", "feats=3x30x20", "-o", plan])
            with torch.no_grad():
                want = model(feats).numpy()
            err = max_err(run_plan(sdrun, plan, {"feats": feats.numpy()}, tmp, kind), [want])
            check(f"{kind} tagger (2 layers, bidirectional, batch_first), {exporter} export: logits equal PyTorch "
                  "(1e-5)", err <= 1e-5, f"max abs err {err:.1e}")


TRAIN_LR, TRAIN_WD, TRAIN_CLIP = 3e-3, 0.01, 1.0


def losses_vs_torch(sdc, sdrun, tmp, model, tag, data, rows, compile_flags=()):
    """Exports `model` (a language model over input_ids), trains it STEPS steps
    with sdrun and with PyTorch (same AdamW) and returns (ours, PyTorch's,
    max relative difference)."""
    import torch
    path = os.path.join(tmp, f"{tag}.onnx")
    torch.onnx.export(model, (torch.zeros(BATCH, SEQ, dtype=torch.long),), path, dynamo=False, opset_version=17,
                      input_names=["input_ids"], output_names=["logits"])
    plan = os.path.join(tmp, f"{tag}.sdp")
    sh([sdc, "compile", path, "--peft", "none", "--shapes", f"input_ids={BATCH}x{SEQ}", "--adam-epsilon",
        str(ADAM_EPS), "-o", plan, *compile_flags])
    metrics = os.path.join(tmp, f"{tag}_m.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--threads", "2", "--lr",
        str(TRAIN_LR), "--weight-decay", str(TRAIN_WD), "--clip-norm", str(TRAIN_CLIP), "--metrics", metrics])
    ours = [json.loads(l)["loss"] for l in open(metrics)]
    ref = torch_losses(model, rows, STEPS, 1, TRAIN_LR, TRAIN_WD, TRAIN_CLIP)
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours, ref)) if len(ours) == len(ref) else float("inf")
    return ours, ref, rel


def recurrent_training(sdc, sdrun, tmp):
    import torch
    data = os.path.join(tmp, "train.jsonl")
    rows = make_data(data, 9, seed=1)
    for kind in ("GRU", "LSTM"):
        class Lm(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(256, 32)
                self.rnn = getattr(torch.nn, kind)(32, 48, batch_first=True)
                self.head = torch.nn.Linear(48, 256)

            def forward(self, ids):
                return self.head(self.rnn(self.emb(ids))[0])
        torch.manual_seed(2)
        ours, ref, rel = losses_vs_torch(sdc, sdrun, tmp, Lm(), f"{kind}_lm", data, rows)
        check(f"{kind} language model, full fine-tuning: {STEPS} per-step losses equal PyTorch's nn.{kind} (1e-4)",
              rel < 1e-4 and len(ours) == STEPS, f"max rel diff {rel:.2e} (first {ref[0]:.4f}, last {ref[-1]:.4f})")


def control_flow_training(sdc, sdrun, tmp):
    """A training plan with a loop step (on the token ids only, so nothing
    trainable flows through it) and an If on activations (selected, so both
    branches' weights get their gradients when taken)."""
    import torch

    @torch.jit.script
    def mix(ids: torch.Tensor, h: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
        s = ids.float() / 256.0
        for _ in range(100):
            s = s * 0.99 + 0.001
        # Each branch reads both weights: PyTorch's AdamW skips a weight a
        # step left without a gradient (None), a plan gives it zeros (its
        # moments and decay still move it), so a weight only one branch reads
        # would train differently the first time the branch flips.
        if bool(h.sum() > 0):
            y = h @ w1 + 0.1 * (h @ w2)
        else:
            y = torch.tanh(h @ w2) - 0.1 * (h @ w1)
        return y * s.unsqueeze(-1)

    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 32)
            self.w1 = torch.nn.Parameter(torch.randn(32, 32) * 0.2)
            self.w2 = torch.nn.Parameter(torch.randn(32, 32) * 0.2)
            self.head = torch.nn.Linear(32, 256)

        def forward(self, ids):
            return self.head(mix(ids, self.emb(ids), self.w1, self.w2))

    data = os.path.join(tmp, "cf_train.jsonl")
    rows = make_data(data, 9, seed=4)
    torch.manual_seed(5)
    ours, ref, rel = losses_vs_torch(sdc, sdrun, tmp, Lm(), "cf_lm", data, rows, ["--max-select", "0"])
    notes = dry_run_notes(sdc, os.path.join(tmp, "cf_lm.onnx"), ["--peft", "none", "--shapes",
                                                                 f"input_ids={BATCH}x{SEQ}", "--max-select", "0"])
    check(f"training through a loop step on the ids and a selected If on activations: {STEPS} per-step losses "
          "equal PyTorch (1e-4)", rel < 1e-4 and len(ours) == STEPS and "loop step over entry" in notes and
          "a training plan selects" in notes, f"max rel diff {rel:.2e}; {notes.strip()[:300]}")


def recurrent_lora(sdc, sdrun, tmp):
    """LoRA on the linear layer before an LSTM: its gradient has to come back
    through the fused recurrence's backward (dL/dxw, then the input GEMM)."""
    import torch
    import torch.nn.functional as F
    from safetensors.numpy import load_file

    class Lm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(256, 32)
            self.proj = torch.nn.Linear(32, 32)
            self.rnn = torch.nn.LSTM(32, 48, batch_first=True)
            self.head = torch.nn.Linear(48, 256)

        def forward(self, ids):
            return self.head(self.rnn(self.proj(self.emb(ids)))[0])
    torch.manual_seed(3)
    model = Lm()
    path = os.path.join(tmp, "lora_lstm.onnx")
    torch.onnx.export(model, (torch.zeros(BATCH, SEQ, dtype=torch.long),), path, dynamo=False, opset_version=17,
                      input_names=["input_ids"], output_names=["logits"])
    data = os.path.join(tmp, "lora.jsonl")
    rows = make_data(data, 8, seed=4)
    plan = os.path.join(tmp, "lora_lstm.sdp")
    sh([sdc, "compile", path, "--peft", "lora", "--target-modules", "proj", "--shapes", f"input_ids={BATCH}x{SEQ}",
        "-o", plan])
    metrics, adapter = os.path.join(tmp, "lora_m.jsonl"), os.path.join(tmp, "lora_adapter")
    sh([sdrun, "train", plan, "--data", data, "--no-shuffle", "--steps", str(STEPS), "--lr", "1e-2", "--metrics",
        metrics, "--save-adapter", adapter])
    losses = [json.loads(l)["loss"] for l in open(metrics)]
    ids = torch.tensor([r[:SEQ] + [0] * (SEQ - len(r)) for r in rows[:BATCH]])
    labels = torch.tensor([r[:SEQ] + [-100] * (SEQ - len(r)) for r in rows[:BATCH]])
    with torch.no_grad():
        logits = model(ids)
        want = float(F.cross_entropy(logits[:, :-1].reshape(-1, 256), labels[:, 1:].reshape(-1), ignore_index=-100))
    b = [v for k, v in load_file(os.path.join(adapter, "adapter_model.safetensors")).items() if "lora_B" in k]
    check("LoRA before an LSTM: starts from PyTorch's loss (1e-4), the loss falls over 10 steps, and lora_B moves "
          "(its gradient crosses the fused recurrence backward)",
          abs(losses[0] - want) <= 1e-4 * abs(want) and losses[-1] < losses[0] and len(b) == 1
          and float(np.abs(b[0]).max()) > 0,
          f"first {losses[0]:.5f} (PyTorch {want:.5f}), last {losses[-1]:.5f}, {len(b)} lora_B")


def main():
    sdc, sdrun = tool_paths()
    import torch
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="sd_control_")
    try:
        silero(sdc, sdrun, tmp)
        scripted_if(sdc, sdrun, tmp)
        if_steps(sdc, sdrun, tmp)
        scripted_while(sdc, sdrun, tmp)
        loop_steps(sdc, sdrun, tmp)
        recurrent_inference(sdc, sdrun, tmp)
        recurrent_training(sdc, sdrun, tmp)
        control_flow_training(sdc, sdrun, tmp)
        recurrent_lora(sdc, sdrun, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_control_flow")


if __name__ == "__main__":
    sys.exit(main())
