#!/usr/bin/env python3
"""Bad input through the command-line tools: each case must end with exit code
1 (2 for usage errors), exactly one line on stderr naming what is wrong, no crash, no hang and no
output file left behind."""
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from e2e_util import embedding_model, export_tiny_gpt, ROOT, clean_error_problems, tool_paths

RESULTS = []


def run(cmd, timeout=60):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def expect_clean_error(name, cmd, must_contain=(), no_files=()):
    problems, _ = clean_error_problems(cmd, must_contain, no_files)
    RESULTS.append((name, problems))


def small_model(path, op="Relu", opset=17, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x"], ["y"], name="the_node", **attrs)
    g = helper.make_graph([node], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(m, path)


def external_model(folder, location):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = numpy_helper.from_array(w, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", location
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    return path


def main():
    with tempfile.TemporaryDirectory(prefix="sd_bad_input_") as tmp:
        return check_all(tmp)


def check_all(tmp):
    sdc, sdrun = tool_paths()
    out = os.path.join(tmp, "out.sdp")

    good = os.path.join(tmp, "good.onnx")
    small_model(good)
    raw = open(good, "rb").read()

    garbage_pb = os.path.join(tmp, "garbage_bind.pb")
    open(garbage_pb, "wb").write(b"\xff\xff\xff\xff")

    # Malformed models.
    expect_clean_error("missing model", [sdc, "compile", os.path.join(tmp, "nope.onnx"), "-o", out],
                       ["nope.onnx", "no such file"], [out])
    empty = os.path.join(tmp, "empty.onnx")
    open(empty, "wb").close()
    expect_clean_error("empty model", [sdc, "compile", empty, "-o", out], ["empty.onnx"], [out])
    trunc = os.path.join(tmp, "trunc.onnx")
    open(trunc, "wb").write(raw[: len(raw) // 2])
    expect_clean_error("truncated model", [sdc, "compile", trunc, "-o", out], ["trunc.onnx"], [out])
    rnd = os.path.join(tmp, "random.onnx")
    random.seed(7)
    open(rnd, "wb").write(bytes(random.getrandbits(8) for _ in range(4096)))
    expect_clean_error("random-bytes model", [sdc, "compile", rnd, "-o", out], ["random.onnx"], [out])
    text = os.path.join(tmp, "bad.onnxtxt")
    open(text, "w").write("<ir_version: 8> g (float[2] x) => (float[2] y) { y = Relu(x ")
    expect_clean_error("malformed text model", [sdc, "compile", text, "-o", out], ["bad.onnxtxt", "parse"], [out])

    unsupported = os.path.join(tmp, "unsupported.onnx")
    small_model(unsupported, op="Bernoulli", opset=15)
    expect_clean_error("unsupported op", [sdc, "compile", unsupported, "-o", out],
                       ["Bernoulli", "the_node", "opset 15"], [out])

    # Handlers that read their own attributes refuse one they do not know
    # (input_forget is LSTM's, not RNN's), naming it, instead of ignoring it.
    rnn = os.path.join(tmp, "rnn_attr.onnx")
    w = numpy_helper.from_array(np.ones((1, 4, 3), np.float32), "W")
    rr = numpy_helper.from_array(np.ones((1, 4, 4), np.float32), "R")
    g = helper.make_graph([helper.make_node("RNN", ["x", "W", "R"], ["", "h"], name="the_rnn", hidden_size=4,
                                            input_forget=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 2, 3])],
                          [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)], [w, rr])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), rnn)
    expect_clean_error("attribute the op's handler does not know", [sdc, "compile", rnn, "-o", out],
                       ["the_rnn", "input_forget", "not supported"], [out])

    # A float4 constant (MXFP4 weights) is refused by name; float4 values
    # computed in the graph (Cast) are supported.
    fp4 = os.path.join(tmp, "fp4_weight.onnx")
    t4 = helper.make_tensor("w4", TensorProto.FLOAT4E2M1, [2, 3], [0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    g = helper.make_graph([helper.make_node("Cast", ["w4"], ["w"], to=TensorProto.FLOAT),
                           helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [t4])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]), fp4)
    expect_clean_error("float4 initializer", [sdc, "compile", fp4, "-o", out], ["w4", "f4e2m1", "constant"], [out])

    # An input without a shape (found by the importer fuzzer): needs --shapes.
    noshape = os.path.join(tmp, "noshape.onnx")
    xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [xin],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), noshape)
    expect_clean_error("input without a shape", [sdc, "compile", noshape, "-o", out], ["'x' has no shape"], [out])
    r = run([sdc, "compile", noshape, "-o", out, "--shapes", "x=2x3"])
    RESULTS.append(("input without a shape compiles with --shapes", [] if r and r.returncode == 0 and os.path.exists(out)
                    else [f"failed: {r.stderr if r else 'hung'}"]))
    if os.path.exists(out):
        os.remove(out)

    # Absurd sizes: a constant-of-shape of 10^12 x 10^12 and an initializer
    # declaring 2^62 elements must be errors, not allocations.
    huge = os.path.join(tmp, "huge.onnx")
    shape = numpy_helper.from_array(np.array([10**12, 10**12], np.int64), "shape")
    g = helper.make_graph([helper.make_node("ConstantOfShape", ["shape"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), huge)
    expect_clean_error("constant of absurd shape", [sdc, "compile", huge, "-o", out], ["2^40"], [out])
    lying = os.path.join(tmp, "lying.onnx")
    w = TensorProto()
    w.name, w.data_type = "w", TensorProto.FLOAT
    w.dims.extend([2**31, 2**31])
    w.raw_data = b"\0" * 16
    xin = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [xin],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), lying)
    expect_clean_error("initializer claiming 2^62 elements", [sdc, "compile", lying, "-o", out], ["'w'"], [out])

    def refused_in_training(what, file_name, model_text, want):
        """The ONNX text model `model_text`, fully fine-tuned on its `loss`: one clean line containing `want`."""
        path = os.path.join(tmp, file_name)
        open(path, "w").write(model_text)
        expect_clean_error(what, [sdc, "compile", path, "--peft", "none", "--loss-output", "loss", "-o", out], want,
                           [out])

    # Gradients sdc refuses (ClassicNormVJP.cpp): one line naming the op and what it lacks.
    refused_in_training(
        "full fine-tuning through LpPool with ceil_mode = 1", "lp_pool_ceil.onnxtxt",
        '<ir_version: 8, opset_import: ["" : 18]>\n'
        'g (float[1, 1, 5, 5] x) => (float loss)\n<float[2, 1, 1, 1] w = {0.5, -0.25}>\n{\n'
        '  c = Conv(x, w)\n  p = LpPool <kernel_shape = [2, 2], strides = [2, 2], ceil_mode = 1> (c)\n'
        '  loss = ReduceSum <keepdims = 0> (p)\n}\n',
        ["LpPool's gradient with ceil_mode = 1 is not supported"])

    # A train-mode export's randomness the training import refuses (OpHandlers.cpp).
    refused_in_training(
        "full fine-tuning through a train-mode Dropout of ratio 1.5", "dropout_ratio.onnxtxt",
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        'g (float[2, 3] x) => (float loss)\n<float[3, 3] w = {1, 0, 0, 0, 1, 0, 0, 0, 1}, float r = {1.5}, bool t = {1}>\n'
        '{\n  h = MatMul(x, w)\n  d = Dropout(h, r, t)\n  loss = ReduceSum <keepdims = 0> (d)\n}\n',
        ["Dropout ratio 1.5 is outside [0, 1)"])
    refused_in_training(
        "full fine-tuning through a train-mode Dropout whose ratio is computed", "dropout_ratio_input.onnxtxt",
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        'g (float[2, 3] x, float r) => (float loss)\n<float[3, 3] w = {1, 0, 0, 0, 1, 0, 0, 0, 1}, bool t = {1}>\n'
        '{\n  h = MatMul(x, w)\n  d = Dropout(h, r, t)\n  loss = ReduceSum <keepdims = 0> (d)\n}\n',
        ["Dropout in training mode needs a constant ratio"])
    refused_in_training(
        "full fine-tuning through a RandomUniform without its shape", "random_shapeless.onnxtxt",
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        'g (float[2, 3] x) => (float loss)\n<float[3, 3] w = {1, 0, 0, 0, 1, 0, 0, 0, 1}>\n'
        '{\n  h = MatMul(x, w)\n  n = RandomUniform <dtype = 1> ()\n  d = Add(h, n)\n'
        '  loss = ReduceSum <keepdims = 0> (d)\n}\n',
        ["(RandomUniform) lacks its required attribute 'shape'"])

    # Importer inputs the fuzzer found (test/fuzz/regressions): clean errors, not crashes.
    regressions = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuzz", "regressions")
    expect_clean_error("node without a first input",
                       [sdc, "compile", os.path.join(regressions, "importer-node-without-inputs.onnx"), "-o", out],
                       ["Softmax_0", "node has no first input"], [out])
    expect_clean_error("Gather of a rank-0 tensor",
                       [sdc, "compile", os.path.join(regressions, "importer-unranked-operand.onnx"), "-o", out],
                       ["Gather_0", "axis 0 out of range for rank 0"], [out])
    # A Scan without its body and num_scan_inputs: libonnx's shape inference
    # would dereference the missing attribute.
    expect_clean_error("Scan without its required attributes",
                       [sdc, "compile", os.path.join(regressions, "importer-scan-without-body.onnx"), "-o", out],
                       ["(Scan) lacks its required attribute 'body'"], [out])
    # A folded copy whose bytes are fewer than its dims say, which the
    # training import's repairs indexed by its dims.
    expect_clean_error("a training import of a copy shorter than its dims",
                       [sdc, "compile", os.path.join(regressions, "importer-copy-shorter-than-dims.onnx"), "--peft",
                        "none", "--loss-output", "loss", "-o", out], ["'lin.weight'", "wrong number of values"], [out])

    # --bind misuse.
    bound = os.path.join(tmp, "bound.pb")
    open(bound, "wb").write(numpy_helper.from_array(np.zeros((2, 3), np.float32)).SerializeToString())
    expect_clean_error("--bind of an unknown input", [sdc, "compile", good, "-o", out, "--bind", f"q={bound}"],
                       ["--bind names 'q', which is not a graph input"], [out])
    wrong = os.path.join(tmp, "bound_i64.pb")
    open(wrong, "wb").write(numpy_helper.from_array(np.zeros((2, 3), np.int64)).SerializeToString())
    expect_clean_error("--bind of the wrong element type", [sdc, "compile", good, "-o", out, "--bind", f"x={wrong}"],
                       ["--bind x has element type 7"], [out])
    expect_clean_error("--bind of a garbage file", [sdc, "compile", good, "-o", out, "--bind", f"x={garbage_pb}"],
                       ["not a TensorProto file"], [out])

    # Flags.
    expect_clean_error("--shapes contradicting the model", [sdc, "compile", good, "-o", out, "--shapes", "x=2x4"],
                       ["--shapes x sets dim 1 to 4", "model fixes it at 3"], [out])
    expect_clean_error("--shapes wrong rank", [sdc, "compile", good, "-o", out, "--shapes", "x=6"], ["rank"], [out])
    expect_clean_error("--shapes unknown input (the model's inputs named)",
                       [sdc, "compile", good, "-o", out, "--shapes", "q=2x3"], ["'q'", "the model's inputs: x"], [out])
    expect_clean_error("unknown flag", [sdc, "compile", good, "-o", out, "--frobnicate"], ["--frobnicate"], [out])

    # External data confinement.
    for label, loc in [("parent dir", "../w.bin"), ("absolute path", "/etc/passwd")]:
        d = tempfile.mkdtemp(dir=tmp)
        open(os.path.join(tmp, "w.bin"), "wb").write(np.zeros(6, np.float32).tobytes())
        m = external_model(d, loc)
        expect_clean_error(f"external data via {label}", [sdc, "compile", m, "-o", out], ["escapes the model folder"],
                           [out])
    d = tempfile.mkdtemp(dir=tmp)
    os.symlink(os.path.join(tmp, "w.bin"), os.path.join(d, "link.bin"))
    m = external_model(d, "link.bin")
    expect_clean_error("external data via symlink", [sdc, "compile", m, "-o", out], ["escapes the model folder"], [out])

    # Runtime inputs.
    plan = os.path.join(tmp, "good.sdp")
    r = run([sdc, "compile", good, "-o", plan])
    assert r and r.returncode == 0, r.stderr if r else "sdc hung"
    outdir = os.path.join(tmp, "outputs")
    wrong_dtype = os.path.join(tmp, "wrong_dtype.pb")
    open(wrong_dtype, "wb").write(numpy_helper.from_array(np.zeros((2, 3), np.float64)).SerializeToString())
    expect_clean_error("input of wrong dtype", [sdrun, "infer", plan, "--input", f"x={wrong_dtype}", "--output-dir",
                                                 outdir], ["'x'", "f64", "f32"], [outdir])
    wrong_shape = os.path.join(tmp, "wrong_shape.npy")
    np.save(wrong_shape, np.zeros((3, 3), np.float32))
    expect_clean_error("input of wrong shape", [sdrun, "infer", plan, "--input", f"x={wrong_shape}", "--output-dir",
                                                 outdir], ["3x3"], [outdir])
    # A wrong input name lists the plan's inputs, so the user can fix it in one go.
    expect_clean_error("--input with an unknown name", [sdrun, "infer", plan, "--input", f"img={wrong_shape}",
                                                         "--output-dir", outdir], ["'img'", "its inputs: x"], [outdir])
    garbage = os.path.join(tmp, "garbage.pb")
    open(garbage, "wb").write(b"\xff\xff\xff\xff")
    expect_clean_error("garbage tensor file", [sdrun, "infer", plan, "--input", f"x={garbage}"], ["garbage.pb"])

    # Shapes a tensor file claims but does not hold: refused before anything is
    # allocated for them (once std::bad_alloc and SIGABRT, or 8.4 GB for a
    # 19-byte file). Under a 4 GB address-space limit either would show.
    def limited(cmd):
        return ["sh", "-c", 'ulimit -v 4000000; exec "$@"', "sh"] + cmd
    for label, proto in [("2**40 int64 dims, 16 raw bytes", TensorProto(dims=[2 ** 40], data_type=TensorProto.INT64,
                                                                       raw_data=b"\0" * 16)),
                         ("2**31 f32 dims, no data", TensorProto(dims=[2 ** 31], data_type=TensorProto.FLOAT)),
                         ("2**31 f32 dims, 2 float_data", TensorProto(dims=[2 ** 31], data_type=TensorProto.FLOAT,
                                                                     float_data=[1.0, 2.0]))]:
        huge = os.path.join(tmp, "huge.pb")
        open(huge, "wb").write(proto.SerializeToString())
        expect_clean_error(f"tensor file claiming {label}",
                           limited([sdrun, "infer", plan, "--input", f"x={huge}", "--output-dir", outdir]),
                           ["huge.pb", "needs"], [outdir])
    bad_npy = os.path.join(tmp, "bad_shape.npy")
    np.save(bad_npy, np.zeros((2, 3), np.float32))
    data = open(bad_npy, "rb").read().replace(b"(2, 3)", b"(2x,3)")
    open(bad_npy, "wb").write(data)
    expect_clean_error(".npy header shape (2x,3)", [sdrun, "infer", plan, "--input", f"x={bad_npy}", "--output-dir",
                                                     outdir], ["bad_shape.npy", "shape"], [outdir])

    # Zero-sized buckets: a training step over nothing is refused at compile
    # time; generate on an inference plan with an empty sequence no longer
    # reads logits[-256] (it was SIGSEGV).
    gpt = export_tiny_gpt(tmp)
    out_plan = os.path.join(tmp, "zero.sdp")
    for shape in ("0x64", "4x0"):
        expect_clean_error(f"training plan with a zero-sized bucket {shape}",
                           [sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv", "--shapes",
                            f"input_ids={shape}", "-o", out_plan], ["input_ids", "is 0 in a training bucket"],
                           [out_plan])
    empty_seq = os.path.join(tmp, "empty_seq.sdp")
    r = run([sdc, "compile", gpt, "--shapes", "input_ids=1x0", "-o", empty_seq])
    assert r and r.returncode == 0, r.stderr if r else "sdc hung"
    expect_clean_error("generate on a plan whose only bucket is 1x0",
                       [sdrun, "generate", empty_seq, "--prompt", "Hi", "--max-new-tokens", "2"], ["seq > 0"])
    expect_clean_error("--freeze matching nothing", [sdc, "compile", gpt, "--peft", "none", "--freeze", "nope", "-o",
                                                     out_plan], ["--freeze 'nope'", "matches no"], [out_plan])
    expect_clean_error("--freeze with LoRA", [sdc, "compile", gpt, "--peft", "lora", "--target-modules", "all-linear",
                                              "--freeze", "x", "-o", out_plan], ["--freeze", "--peft none"], [out_plan])
    expect_clean_error("--use-dora without LoRA", [sdc, "compile", gpt, "--peft", "none", "--use-dora", "-o",
                                                  out_plan], ["--use-dora", "--peft lora"], [out_plan])
    expect_clean_error("--peft ia3 without --target-modules", [sdc, "compile", gpt, "--peft", "ia3", "-o", out_plan],
                       ["--peft ia3", "--target-modules"], [out_plan])
    expect_clean_error("--lora-dropout with IA3", [sdc, "compile", gpt, "--peft", "ia3", "--target-modules", "qkv",
                                                   "--lora-dropout", "0.1", "-o", out_plan],
                       ["--lora-dropout", "--peft ia3"], [out_plan])
    expect_clean_error("--peft vera without --target-modules", [sdc, "compile", gpt, "--peft", "vera", "-o", out_plan],
                       ["--peft vera", "--target-modules"], [out_plan])
    expect_clean_error("--peft loha without --target-modules", [sdc, "compile", gpt, "--peft", "loha", "-o", out_plan],
                       ["--peft loha", "--target-modules"], [out_plan])
    expect_clean_error("--peft lokr without --target-modules", [sdc, "compile", gpt, "--peft", "lokr", "-o", out_plan],
                       ["--peft lokr", "--target-modules"], [out_plan])
    expect_clean_error("--decompose-both without LoKr", [sdc, "compile", gpt, "--peft", "loha", "--target-modules",
                                                         "qkv", "--decompose-both", "-o", out_plan],
                       ["--decompose-both", "--peft lokr"], [out_plan])
    expect_clean_error("--decompose-factor 0", [sdc, "compile", gpt, "--peft", "lokr", "--target-modules", "qkv",
                                                "--decompose-factor", "0", "-o", out_plan],
                       ["--decompose-factor", "positive integer or -1"], [out_plan])
    expect_clean_error("--num-virtual-tokens without prompt tuning",
                       [sdc, "compile", gpt, "--peft", "none", "--num-virtual-tokens", "4", "-o", out_plan],
                       ["--num-virtual-tokens", "--peft prompt or prefix"], [out_plan])
    expect_clean_error("--target-r without AdaLoRA", [sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv",
                                                      "--target-r", "4", "-o", out_plan],
                       ["--target-r", "--peft adalora"], [out_plan])
    expect_clean_error("--peft adalora with --shard", [sdc, "compile", gpt, "--peft", "adalora", "--target-modules",
                                                       "qkv", "--total-step", "10", "--shard", "grads", "-o", out_plan],
                       ["--peft adalora", "--shard"], [out_plan])
    expect_clean_error("--total-step -1", [sdc, "compile", gpt, "--peft", "adalora", "--target-modules", "qkv",
                                           "--total-step", "-1", "-o", out_plan], ["--total-step", "whole number"],
                       [out_plan])
    expect_clean_error("--total-step past the schedule table's bound",
                       [sdc, "compile", gpt, "--peft", "adalora", "--target-modules", "qkv", "--total-step",
                        "1099511627776", "-o", out_plan], ["--total-step", "at most 1000000"], [out_plan])
    expect_clean_error("--lora-init pissa without LoRA", [sdc, "compile", gpt, "--peft", "ia3", "--target-modules",
                                                          "qkv", "--lora-init", "pissa", "-o", out_plan],
                       ["--lora-init pissa", "--peft lora"], [out_plan])
    expect_clean_error("--lora-init other than PEFT's", [sdc, "compile", gpt, "--peft", "lora", "--target-modules",
                                                         "qkv", "--lora-init", "eva", "-o", out_plan],
                       ["--lora-init", "pissa, olora or loftq"], [out_plan])
    expect_clean_error("--bias without LoRA", [sdc, "compile", gpt, "--peft", "ia3", "--target-modules", "qkv",
                                               "--bias", "all", "-o", out_plan], ["--bias all", "--peft lora"],
                       [out_plan])
    expect_clean_error("--bias other than none, all or lora_only",
                       [sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv", "--bias", "some", "-o",
                        out_plan], ["--bias", "lora_only"], [out_plan])
    attention_free = os.path.join(tmp, "attention_free.onnx")
    embedding_model(attention_free)
    fixed_seq = onnx.load(attention_free)
    for dim, size in zip(fixed_seq.graph.input[0].type.tensor_type.shape.dim, (2, 8)):
        dim.dim_value = size
    onnx.save(fixed_seq, os.path.join(tmp, "fixed_seq.onnx"))
    expect_clean_error("prompt tuning on an export that fixes the sequence length",
                       [sdc, "compile", os.path.join(tmp, "fixed_seq.onnx"), "--peft", "prompt", "-o", out_plan],
                       ["--peft prompt", "'input_ids' at 8 tokens", "20 longer", "dynamic sequence axis"], [out_plan])
    expect_clean_error("prefix tuning on a model without attention",
                       [sdc, "compile", attention_free, "--peft", "prefix", "--shapes", "input_ids=2x8", "-o", out_plan],
                       ["--peft prefix", "no attention layer"], [out_plan])
    expect_clean_error("--prompt-init with prefix tuning",
                       [sdc, "compile", gpt, "--peft", "prefix", "--prompt-init", "vocab", "-o", out_plan],
                       ["--prompt-init", "--peft prompt"], [out_plan])
    expect_clean_error("--num-virtual-tokens 0", [sdc, "compile", gpt, "--peft", "prompt", "--num-virtual-tokens", "0",
                                                  "-o", out_plan], ["--num-virtual-tokens", "1 to 65536"], [out_plan])
    expect_clean_error("--prompt-init other", [sdc, "compile", gpt, "--peft", "prompt", "--prompt-init", "other",
                                               "-o", out_plan], ["--prompt-init", "'random', 'vocab' or 'text'"],
                       [out_plan])
    expect_clean_error("--prompt-init text without its text", [sdc, "compile", gpt, "--peft", "prompt", "--prompt-init",
                                                               "text", "-o", out_plan],
                       ["--prompt-init text", "--prompt-init-text", "--tokenizer"], [out_plan])
    expect_clean_error("--prompt-init text with a missing tokenizer",
                       [sdc, "compile", gpt, "--peft", "prompt", "--prompt-init", "text", "--prompt-init-text", "Hi",
                        "--tokenizer", os.path.join(tmp, "no_such_tokenizer"), "-o", out_plan],
                       ["--tokenizer", "no_such_tokenizer"], [out_plan])
    for what, extra, words in (("--recipe dpo", ["--recipe", "dpo"], ["--recipe"]),
                               ("--packing", ["--packing"], ["--packing"]),
                               ("--target-modules", ["--target-modules", "qkv"], ["--target-modules"])):
        expect_clean_error(f"prompt tuning with {what}", [sdc, "compile", gpt, "--peft", "prompt", *extra, "-o",
                                                          out_plan], ["--peft prompt", *words], [out_plan])
    expect_clean_error("--feedforward-modules without IA3", [sdc, "compile", gpt, "--peft", "lora", "--target-modules",
                                                             "qkv", "--feedforward-modules", "qkv", "-o", out_plan],
                       ["--feedforward-modules", "--peft ia3"], [out_plan])
    expect_clean_error("--feedforward-modules matching no adapted module",
                       [sdc, "compile", gpt, "--peft", "ia3", "--target-modules", "qkv", "--feedforward-modules", "fc2",
                        "-o", out_plan], ["--feedforward-modules 'fc2'", "matches none"], [out_plan])
    expect_clean_error("--feedforward-modules with a broken regex",
                       [sdc, "compile", gpt, "--peft", "ia3", "--target-modules", "qkv", "--feedforward-modules", "(q",
                        "-o", out_plan], ["--feedforward-modules", "(q"], [out_plan])
    expect_clean_error("--freeze with a broken regex", [sdc, "compile", gpt, "--peft", "none", "--freeze", "(", "-o",
                                                        out_plan], ["--freeze '('", "not a valid"], [out_plan])
    expect_clean_error("--adam-beta1 1.5", [sdc, "compile", gpt, "--peft", "none", "--adam-beta1", "1.5", "-o",
                                            out_plan], ["--adam-beta1", "below 1"], [out_plan])
    expect_clean_error("--adam-epsilon 0", [sdc, "compile", gpt, "--peft", "none", "--adam-epsilon", "0", "-o",
                                            out_plan], ["--adam-epsilon"], [out_plan])
    # Ranks (docs/ranks.md): compile flags, and a launch this build cannot serve.
    for label, flags, needles in [("--bucket-mb -1", ["--peft", "none", "--bucket-mb", "-1"], ["--bucket-mb", "-1"]),
                                  ("--shard params without a training plan", ["--shard", "params"],
                                   ["--shard params", "training plan"]),
                                  ("--shard frob", ["--peft", "none", "--shard", "frob"], ["--shard takes", "frob", "params"]),
                                  ("--shard without a training plan", ["--shard", "optimizer"],
                                   ["--shard optimizer", "training plan"]),
                                  # Loop bounds (docs/control_flow.md).
                                  ("--max-trip 0", ["--max-trip", "0"], ["--max-trip", "integer from 1"]),
                                  ("--max-unroll x", ["--max-unroll", "x"], ["--max-unroll", "integer from 0"]),
                                  ("--max-select -1", ["--max-select", "-1"], ["--max-select", "integer from 0"]),
                                  # Fusions (docs/cuda.md).
                                  ("--no-fuse frob", ["--no-fuse", "elementwise,frob"],
                                   ["--no-fuse takes", "frob", "gemm-epilogues"])]:
        expect_clean_error(label, [sdc, "compile", gpt, *flags, "-o", out_plan], needles, [out_plan])
    expect_clean_error("torchrun-style launch (RANK, WORLD_SIZE) of CPU ranks",
                       ["env", "RANK=1", "WORLD_SIZE=2", sdrun, "train", out_plan, "--data", os.path.join(tmp, "x.jsonl")],
                       ["rank 1", "NCCL", "mpirun -np 2"])
    expect_clean_error("--comm-timeout 0", [sdrun, "train", out_plan, "--data", os.path.join(tmp, "x.jsonl"),
                                            "--comm-timeout", "0"], ["--comm-timeout"])
    expect_clean_error("--seed above 2^63-1 (was clamped silently)",
                       [sdrun, "train", out_plan, "--data", os.path.join(tmp, "none.jsonl"), "--seed",
                        str(2 ** 64)], ["--seed", str(2 ** 64)])

    data = os.path.join(tmp, "keep.jsonl")
    open(data, "w").write('{"input_ids": [1, 2, 3]}\n')
    train_plan = os.path.join(tmp, "train.sdp")
    r = run([sdc, "compile", gpt, "--peft", "none", "--shapes", "input_ids=1x8", "-o", train_plan])
    assert r and r.returncode == 0, r.stderr if r else "sdc hung"
    for flag in ("--metrics", "--save-weights"):
        expect_clean_error(f"{flag} naming the --data file", [sdrun, "train", train_plan, "--data", data, flag, data],
                           ["keep.jsonl", "--data", "overwritten"])
    check_kept = open(data).read() == '{"input_ids": [1, 2, 3]}\n'
    RESULTS.append(("the --data file is left as it was", [] if check_kept else ["the data file changed"]))

    # Corrupt plans.
    pbytes = open(plan, "rb").read()
    for label, data in [("truncated plan", pbytes[: len(pbytes) - 40]),
                        ("bit-flipped plan", pbytes[:100] + bytes([pbytes[100] ^ 1]) + pbytes[101:]),
                        ("empty plan", b""), ("onnx file as plan", raw)]:
        p = os.path.join(tmp, "corrupt.sdp")
        open(p, "wb").write(data)
        good_in = os.path.join(tmp, "x.npy")
        np.save(good_in, np.zeros((2, 3), np.float32))
        expect_clean_error(label, [sdrun, "infer", p, "--input", f"x={good_in}", "--output-dir", outdir],
                           ["corrupt.sdp"], [outdir])
    expect_clean_error("inspect of a corrupt plan", [sdrun, "inspect", os.path.join(tmp, "corrupt.sdp")],
                       ["corrupt.sdp"])
    expect_clean_error("inspect --traffic of an entry the plan lacks", [sdrun, "inspect", plan, "--traffic", "nope"],
                       ["--traffic", "'nope'", "entries: "])
    for cmd in ("infer", "bench"):
        expect_clean_error(f"{cmd} on a device this build lacks", [sdrun, cmd, plan, "--device", "tpu"],
                           ["--device", "unknown device 'tpu'", "cpu"])
    # --cpu-ops names ops the CPU computes; it cannot go with --no-cpu-fallback.
    for cmd in ("infer", "bench"):
        expect_clean_error(f"{cmd} --cpu-ops naming no op", [sdrun, cmd, plan, "--cpu-ops", "Relu,NonMaxSupression"],
                           ["--cpu-ops", "'NonMaxSupression'"])
    expect_clean_error("--cpu-ops with --no-cpu-fallback",
                       [sdrun, "infer", plan, "--cpu-ops", "Relu", "--no-cpu-fallback"], ["--cpu-ops", "--no-cpu-fallback"])
    expect_clean_error("infer --profile into a missing folder",
                       [sdrun, "infer", plan, "--profile", os.path.join(tmp, "nope", "t.json")], ["--profile", "nope"])
    expect_clean_error("bench --profile= into a missing folder",
                       [sdrun, "bench", plan, "--profile=" + os.path.join(tmp, "nope", "t.json")], ["--profile", "nope"])
    # --device cuda where there is no GPU: one line saying why (no CUDA in
    # this build, no driver or no GPU), for every command that takes it.
    if not os.path.exists("/dev/nvidia0"):
        for cmd in ("infer", "bench"):
            expect_clean_error(f"{cmd} --device cuda without a GPU", [sdrun, cmd, plan, "--device", "cuda"],
                               ["--device", "device 'cuda'"])
        # The GEMM comparison needs a GPU (and a build with CUDA).
        expect_clean_error("bench --gemms without a GPU", [sdrun, "bench", plan, "--gemms"], ["--gemms"])
    # The CUDA backend is a plugin (libsdcuda.so) loaded on first use: a missing
    # or foreign one is one line naming the file, for every way in.
    missing = os.path.join(tmp, "nope", "libsdcuda.so")
    for label, args in [("infer --device cuda", ["infer", plan, "--device", "cuda"]),
                        ("inspect --kernels cuda", ["inspect", plan, "--kernels", "cuda"]),
                        ("bench --gemms", ["bench", plan, "--gemms"])]:
        expect_clean_error(f"{label} with a missing CUDA plugin", ["env", f"SD_CUDA_PLUGIN={missing}", sdrun] + args,
                           [missing])
    foreign = os.path.join(tmp, "foreign.so")  # a shared library, but the C API's, not the plugin
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(sdrun)), "capi", "libsd.so"), foreign)
    expect_clean_error("--device cuda with a library that is not the CUDA plugin",
                       ["env", f"SD_CUDA_PLUGIN={foreign}", sdrun, "infer", plan, "--device", "cuda"],
                       ["foreign.so", "is not sdc's CUDA backend"])
    # A CPU run never loads the plugin (so its size and CUDA's libraries do not weigh on CPU processes).
    r = subprocess.run(["env", "LD_DEBUG=files", sdrun, "bench", plan, "--device", "cpu", "--iterations", "1"],
                       capture_output=True, text=True)
    RESULTS.append(("a CPU run does not load the CUDA plugin",
                    [f"exit {r.returncode}"] * (r.returncode != 0) + ["libsdcuda.so was loaded"] * ("libsdcuda" in r.stderr)))
    expect_clean_error("bench with bad iterations", [sdrun, "bench", plan, "--iterations", "zero"], ["--iterations"])
    # A GEMM tuning file is written by the GEMM comparison only.
    expect_clean_error("bench --tune without --gemms", [sdrun, "bench", plan, "--tune", os.path.join(tmp, "t.tsv")],
                       ["--tune goes with --gemms"], no_files=[os.path.join(tmp, "t.tsv")])
    # inspect --cpu with a bad plan or flag: the error alone, no CPU report before it.
    for label, cmd, needle in [("inspect --cpu of a corrupt plan", [sdrun, "inspect", "--cpu",
                                                                      os.path.join(tmp, "corrupt.sdp")], "corrupt.sdp"),
                               ("inspect --cpu with an unknown flag", [sdrun, "inspect", "--cpu", "--bogus"], "--bogus")]:
        problems, _ = clean_error_problems(cmd, [needle])
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        RESULTS.append((label, problems + ([f"printed before the error: {out[:80]!r}"] if out else [])))

    failed = 0
    for name, problems in RESULTS:
        print(("PASS " if not problems else "FAIL ") + name + ("" if not problems else ": " + "; ".join(problems)))
        failed += bool(problems)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
