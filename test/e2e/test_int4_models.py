#!/usr/bin/env python3
"""Block-quantized weights (onnxruntime's MatMulNBits, com.microsoft): the
int4 models onnxruntime-genai's model builder writes for CPUs run as they
are, their weights packed in the plan.

  node     single MatMulNBits nodes of every form (2, 4 and 8 bits; blocks of
           16 to 64; K a multiple of the block or not; no, packed and float
           zero points; with and without bias; 1 and 3 rows, which read the
           packed weights in place, and 20, which widen them for the GEMM)
           equal a NumPy reference and ONNX Runtime (accuracy_level 0: f32
           math) within 1e-5
  model    a tiny Llama built with `-p int4 -e cpu`: logits equal ONNX
           Runtime's on the same file (within 1e-5 with accuracy_level 0; the
           builder's level 4 quantizes activations to int8 in ONNX Runtime, so
           there only a bound is checked); greedy decoding through the KV
           cache (--kv-cache) equals onnxruntime-genai's on the same folder;
           the plan keeps the weights packed (smaller than the fp32 build's)
  refusals g_idx, bits 3, a B of the wrong size: one-line errors naming them
  --quantize int4 (sdc's own): plain MatMuls equal the reference quantization's
           product; a Llama export's linear layers all 4-bit, logits near
           PyTorch's with the dequantized weights, decoding through the cache;
           with --peft, --precision bf16 and an unknown kind refused
"""
import os
import shutil
import subprocess
import sys

import numpy as np

from e2e_util import clean_error_problems, ort_run, rel_err, sdrun_logits, sh, tool_paths
from test_training import check, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
PROMPTS = ["In the beginning God created", "And"]


def pack(codes, bits):
    """Codes [rows, count] (count a multiple of 8 / bits) packed low bits first, as MatMulNBits stores them."""
    per = 8 // bits
    codes = codes.reshape(codes.shape[0], -1, per).astype(np.uint16)
    return sum(codes[:, :, t] << (t * bits) for t in range(per)).astype(np.uint8)


def nbits_case(rng, K, N, bits, block, zeros, bias):
    """(initializers, inputs of the node, reference weight W [N, K]) for random codes and scales."""
    blocks = -(-K // block)
    codes = rng.integers(0, 1 << bits, (N, blocks * block))
    codes[:, K:] = 0
    scales = rng.uniform(0.01, 0.1, (N, blocks)).astype(np.float32)
    if zeros == "packed":
        z = rng.integers(0, 1 << bits, (N, blocks))
        per = 8 // bits
        zp = pack(np.pad(z, ((0, 0), (0, -blocks % per))), bits)
        zf = z.astype(np.float32)
    elif zeros == "float":
        zf = rng.uniform(0, (1 << bits) - 1, (N, blocks)).astype(np.float32)
        zp = zf
    else:
        zf, zp = np.full((N, blocks), 1 << (bits - 1), np.float32), None
    w = ((codes.reshape(N, blocks, block) - zf[:, :, None]) * scales[:, :, None]).reshape(N, -1)[:, :K]
    init = {"B": pack(codes, bits).reshape(N, blocks, block * bits // 8), "scales": scales}
    if zp is not None:
        init["zp"] = zp
    if bias:
        init["bias"] = rng.standard_normal(N).astype(np.float32)
    return init, w.astype(np.float32)


def int8_reference(a, w_codes_minus_zero, scales, K, block=32):
    """accuracy_level 4's math: each block of 32 of a quantized to int8 (its largest magnitude over 127, rounded
    to nearest even), times the codes less the zero point, times both scales."""
    rows, blocks = a.shape[0], scales.shape[1]
    padded = np.zeros((rows, blocks * block), np.float32)
    padded[:, :K] = a
    ab = padded.reshape(rows, blocks, block)
    most = np.abs(ab).max(axis=2, keepdims=True)
    sa = most / 127
    qa = np.rint(np.clip(ab * np.where(most > 0, 127 / np.where(most > 0, most, 1), 0), -127, 127))
    dots = np.einsum("rbe,nbe->rnb", qa, w_codes_minus_zero.reshape(-1, blocks, block))
    return (dots * sa[:, None, :, 0] * scales[None, :, :]).sum(axis=2).astype(np.float32)


def int8_checks(sdc, sdrun, tmp):
    """accuracy_level 4 with 4-bit codes in blocks of 32 and no zero points: the rows take int8 (on CPUs with
    AVX-512 VNNI; the f32 math elsewhere)."""
    rng = np.random.default_rng(8)
    worst_ours, worst_ort, worst_f32 = 0.0, 0.0, 0.0
    for K, bias in ((64, False), (96, True), (200, False), (600, True)):
        for rows in (1, 3, 20):
            N, blocks = 40, -(-K // 32)
            init, w = nbits_case(rng, K, N, 4, 32, None, bias)
            path = os.path.join(tmp, f"int8_{K}_{rows}.onnx")
            node_model(path, init, K, N, 4, 32, rows, level=4)
            plan = path[:-5] + ".sdp"
            sh([sdc, "compile", path, "-o", plan])
            a = rng.standard_normal((rows, K)).astype(np.float32)
            got = sdrun_logits(sdrun, plan, None, {"A": a}, tmp, "int8")
            scales = init["scales"]
            codes = (w / np.repeat(scales, 32, axis=1)[:, :K])  # the codes less the zero point, exactly
            codes = np.pad(codes, ((0, 0), (0, blocks * 32 - K)))
            want = int8_reference(a, np.rint(codes), scales, K) + init.get("bias", 0)
            exact = a @ w.T + init.get("bias", 0)
            worst_ours = max(worst_ours, rel_err(got, want))
            worst_f32 = max(worst_f32, rel_err(got, exact))
            worst_ort = max(worst_ort, rel_err(got, ort_run(path, {"A": a})["Y"]))
    from cpu_flags import has_vnni
    vnni = has_vnni()
    check("MatMulNBits at accuracy_level 4 (int8 activations per block of 32, 1, 3 and 20 rows, K 64-600: 2 to 19 "
          "blocks, whole and partial groups of 4): " + ("equal to the int8 reference (1e-5; AVX-512 VNNI here)" if vnni else
                                     "the f32 math (no AVX-512 VNNI here)") +
          ", and near ONNX Runtime's own level-4 math and the f32 product (2e-2)",
          (worst_ours <= 1e-5 if vnni else worst_f32 <= 1e-5) and worst_ort <= 2e-2 and worst_f32 <= 2e-2,
          f"vs int8 reference {worst_ours:.1e}, vs ONNX Runtime {worst_ort:.1e}, vs f32 {worst_f32:.1e}")


def node_model(path, init, K, N, bits, block, rows, level=0):
    from onnx import TensorProto, helper, numpy_helper
    names = ["A", "B", "scales", "zp" if "zp" in init else "", "", "bias" if "bias" in init else ""]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=block, accuracy_level=level)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [rows, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, N])],
                              [numpy_helper.from_array(v, k) for k, v in init.items()])
    import onnx
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid("com.microsoft", 1)]), path)


def node_checks(sdc, sdrun, tmp):
    rng = np.random.default_rng(3)
    worst = {"ours": 0.0, "ort": 0.0}
    failures = []
    cases = ort_cases = 0
    for bits, block in ((4, 32), (4, 16), (8, 32), (2, 64)):
        for K, zeros, bias in ((64, None, False), (72, "packed", True), (96, "float", False)):
            for rows in (1, 3, 20):
                N = 24
                init, w = nbits_case(rng, K, N, bits, block, zeros, bias)
                path = os.path.join(tmp, f"nbits_{bits}_{block}_{K}_{rows}.onnx")
                node_model(path, init, K, N, bits, block, rows)
                a = rng.standard_normal((rows, K)).astype(np.float32)
                want = a @ w.T + init.get("bias", 0)
                plan = path[:-5] + ".sdp"
                r = subprocess.run([sdc, "compile", path, "-o", plan], capture_output=True, text=True)
                if r.returncode:
                    failures.append(f"{os.path.basename(path)}: {r.stderr.strip()[-200:]}")
                    continue
                got = sdrun_logits(sdrun, plan, None, {"A": a}, tmp, "nbits")
                cases += 1
                worst["ours"] = max(worst["ours"], rel_err(got, want))
                if bits == 8 and zeros == "float":  # ONNX Runtime's CPU kernel refuses this form
                    continue
                worst["ort"] = max(worst["ort"], rel_err(got, ort_run(path, {"A": a})["Y"]))
                ort_cases += 1
    check(f"MatMulNBits nodes ({cases} of 36 compiled: bits 2, 4, 8; blocks 16-64; K 64, 72, 96; zero points none, "
          f"packed, float; bias; 1, 3 and 20 rows): equal to the NumPy reference, and to ONNX Runtime in the "
          f"{ort_cases} it runs (8 bits with float zero points it refuses), within 1e-5",
          not failures and cases == 36 and ort_cases == 33 and worst["ours"] <= 1e-5 and worst["ort"] <= 1e-5,
          f"{'; '.join(failures)[:400]} worst vs NumPy {worst['ours']:.1e}, vs ONNX Runtime {worst['ort']:.1e}")


def builder(hf, out, precision):
    sh([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", hf, "-i", hf, "-o", out, "-p", precision,
        "-e", "cpu"])


def exact_copy(folder, out):
    """The builder's folder with every MatMulNBits at accuracy_level 0 (ONNX Runtime's f32 math)."""
    import onnx
    os.makedirs(out)
    for name in os.listdir(folder):
        if not name.startswith("model.onnx"):
            shutil.copy(os.path.join(folder, name), out)
    m = onnx.load(os.path.join(folder, "model.onnx"))
    for n in m.graph.node:
        for a in n.attribute:
            if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = 0
    onnx.save(m, os.path.join(out, "model.onnx"), save_as_external_data=True, location="model.onnx.data")


def genai_greedy(folder, prompt, new):
    import onnxruntime_genai as og
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt.encode()) + new)
    g = og.Generator(model, params)
    g.append_tokens(list(prompt.encode()))
    while not g.is_done():
        g.generate_next_token()
    return bytes(int(t) for t in g.get_sequence(0))


def model_checks(sdc, sdrun, tmp):
    import transformers
    import export_hf
    from test_llm_archs import byte_tokenizer, with_past_inputs
    hf = os.path.join(tmp, "hf")
    model = export_hf.build("llama", 0)
    model.save_pretrained(hf)
    byte_tokenizer(hf)
    int4, fp32, exact = (os.path.join(tmp, n) for n in ("int4", "fp32", "exact"))
    builder(hf, int4, "int4")
    builder(hf, fp32, "fp32")
    exact_copy(int4, exact)
    import onnx
    ops = [n.op_type for n in onnx.load(os.path.join(int4, "model.onnx"), load_external_data=False).graph.node]
    config = transformers.AutoConfig.from_pretrained(hf)
    ids = np.random.default_rng(5).integers(0, 256, (2, 16)).astype(np.int64)
    errs, sizes = {}, {}
    for name, folder in (("int4", int4), ("exact", exact), ("fp32", fp32)):
        path = os.path.join(folder, "model.onnx")
        feeds, dims = with_past_inputs(path, ids, config)
        plan = os.path.join(tmp, f"{name}.sdp")
        sh([sdc, "compile", path, "--shapes", "input_ids=2x16", *dims, "-o", plan])
        sizes[name] = os.path.getsize(plan)
        got = sdrun_logits(sdrun, plan, None, feeds, tmp, name)
        errs[name] = rel_err(got, ort_run(path, feeds)["logits"])
    check(f"genai int4 Llama ({ops.count('MatMulNBits')} MatMulNBits): logits equal ONNX Runtime's on the same file "
          "at accuracy_level 0 (1e-5), and within 2e-2 of its int8-activation math at the builder's level 4",
          ops.count("MatMulNBits") >= 7 and errs["exact"] <= 1e-5 and errs["int4"] <= 2e-2,
          f"relative err {errs['exact']:.1e} (level 0), {errs['int4']:.1e} (level 4); fp32 build {errs['fp32']:.1e}")
    check("the int4 plan keeps its weights packed: smaller than the fp32 build's plan",
          sizes["int4"] < 0.5 * sizes["fp32"], f"{sizes['int4']} vs {sizes['fp32']} bytes")
    kv = os.path.join(tmp, "kv.sdp")
    sh([sdc, "compile", os.path.join(exact, "model.onnx"), "--kv-cache", "64", "--kv-batch", "2",
        "--prefill-chunk", "8", "-o", kv])
    cmd = [sdrun, "generate", kv, "--temperature", "0", "--max-new-tokens", "16", "--threads", "2"]
    for p in PROMPTS:
        cmd += ["--prompt", p]
    got = subprocess.run(cmd, capture_output=True, timeout=300).stdout
    want = b"".join(genai_greedy(exact, p, 16) + b"\n" for p in PROMPTS)
    check("genai int4 Llama: greedy decoding through the KV cache (decode steps read the packed weights in place) "
          "equals onnxruntime-genai's on the same folder", got == want, f"{got!r} vs {want!r}")


def int4_weights(w):
    """sdc compile --quantize int4's quantization of w [out, in]: blocks of 32, each block's largest-magnitude
    value over -8 its scale, codes rounded to nearest even and clamped to [0, 15] around 8. Returns the codes
    less 8 [out, blocks * 32] and the scales [out, blocks]."""
    out, k = w.shape
    blocks = -(-k // 32)
    padded = np.zeros((out, blocks * 32), np.float32)
    padded[:, :k] = w
    b = padded.reshape(out, blocks, 32)
    most = np.take_along_axis(b, np.abs(b).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    scales = (most / np.float32(-8)).astype(np.float32)
    inverse = np.where(scales != 0, np.float32(1) / np.where(scales != 0, scales, 1), 0).astype(np.float32)
    codes = np.clip(np.rint(b * inverse[:, :, None]) + 8, 0, 15) - 8
    return codes.reshape(out, -1), scales


def quantize_flag(sdc, sdrun, tmp):
    """sdc compile --quantize int4 on a model of plain MatMuls: MatMulNBits over the compiler's own codes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(12)
    worst = 0.0
    for K, rows in ((96, 3), (200, 20)):
        w = rng.standard_normal((K, 48)).astype(np.float32)  # MatMul's [in, out]
        bias = rng.standard_normal(48).astype(np.float32)
        g = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["M"]), helper.make_node("Add", ["M", "b"], ["Y"])],
                              "mm", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [rows, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [rows, 48])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "b")])
        path = os.path.join(tmp, f"mm_{K}.onnx")
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        plan = path[:-5] + ".sdp"
        sh([sdc, "compile", path, "--quantize", "int4", "-o", plan])
        a = rng.standard_normal((rows, K)).astype(np.float32)
        got = sdrun_logits(sdrun, plan, None, {"A": a}, tmp, "q")
        codes, scales = int4_weights(w.T)
        from cpu_flags import has_vnni
        if has_vnni():
            want = int8_reference(a, codes, scales, K) + bias
        else:
            want = a @ (codes.reshape(48, -1, 32) * scales[:, :, None]).reshape(48, -1)[:, :K].T + bias
        worst = max(worst, rel_err(got, want))
    check("sdc compile --quantize int4 (plain MatMul + bias, K 96 and 200, 3 and 20 rows): MatMulNBits over the "
          "compiler's codes equals the reference quantization's product (1e-5)", worst <= 1e-5, f"{worst:.1e}")
    g = helper.make_graph([helper.make_node("Relu", ["A"], ["Y"])], "relu",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 8])])
    path = os.path.join(tmp, "relu.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    r = subprocess.run([sdc, "compile", path, "--quantize", "int4", "-o", path[:-5] + ".sdp"], capture_output=True,
                       text=True)
    check("--quantize int4 on a model without linear layers: compiled, with a warning that nothing was quantized",
          r.returncode == 0 and "--quantize int4 found no linear layer" in r.stderr, r.stderr.strip())


def quantize_llama(sdc, sdrun, tmp):
    """--quantize int4 on a transformers Llama's TorchScript export: every linear layer 4-bit, logits near
    PyTorch's with the same dequantized weights, and greedy decoding through the cache."""
    import torch
    import export_hf
    from export_hf import export
    model = export_hf.build("llama", 0)
    path = os.path.join(tmp, "llama.onnx")
    export(model, path, 17, 2, 16)
    plan, fp32 = os.path.join(tmp, "llama_int4.sdp"), os.path.join(tmp, "llama_fp32.sdp")
    sh([sdc, "compile", path, "--quantize", "int4", "--shapes", "input_ids=2x16", "-o", plan])
    sh([sdc, "compile", path, "--shapes", "input_ids=2x16", "-o", fp32])
    steps = [l.split() for l in sh([sdrun, "inspect", plan, "--kernels", "cpu"]).splitlines()]
    nbits = next((int(f[1]) for f in steps if len(f) >= 3 and f[0] == "MatMulNBits"), 0)
    linear = next((int(f[1]) for f in steps if len(f) >= 3 and f[0] in ("Linear", "LinearAdd")), 0)
    ids = np.random.default_rng(5).integers(0, 256, (2, 16)).astype(np.int64)
    got = sdrun_logits(sdrun, plan, None, ids, tmp, "int4")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                codes, scales = int4_weights(m.weight.numpy())
                k = m.weight.shape[1]
                m.weight.copy_(torch.tensor((codes.reshape(len(scales), -1, 32) * scales[:, :, None])
                                            .reshape(len(scales), -1)[:, :k]))
        want = model(torch.tensor(ids)).logits.numpy()
    check(f"--quantize int4 on a Llama export: {nbits} MatMulNBits steps and no f32 linear layer left, the plan "
          f"under half the fp32 plan's size, logits within 3e-2 of PyTorch's with the dequantized weights "
          f"(the activations' int8 rounding)", nbits >= 8 and linear == 0 and
          os.path.getsize(plan) < 0.5 * os.path.getsize(fp32) and rel_err(got, want) <= 3e-2,
          f"{nbits} MatMulNBits, {linear} Linear; {os.path.getsize(plan)} vs {os.path.getsize(fp32)} bytes; "
          f"relative err {rel_err(got, want):.1e}")
    kv = os.path.join(tmp, "llama_kv.sdp")
    sh([sdc, "compile", path, "--quantize", "int4", "--kv-cache", "64", "--prefill-chunk", "8", "-o", kv])
    r = subprocess.run([sdrun, "generate", kv, "--prompt", PROMPTS[0], "--temperature", "0", "--max-new-tokens", "12"],
                       capture_output=True, timeout=300)
    check("--quantize int4 --kv-cache: sdrun generate decodes through the cache", r.returncode == 0 and
          r.stdout.startswith(PROMPTS[0].encode()) and len(r.stdout) > len(PROMPTS[0]) + 8,
          f"{r.stdout!r} {r.stderr.decode()[-300:]}")
    for what, flags, must in [("--peft lora", ["--peft", "lora", "--target-modules", "q_proj"], ["--quantize int4", "--peft"]),
                              ("--precision bf16", ["--precision", "bf16"], ["--quantize int4", "--precision"]),
                              ("int3", [], ["'nf4'", "'int4'"])]:
        out = os.path.join(tmp, "refused.sdp")
        q = ["--quantize", "int3"] if what == "int3" else ["--quantize", "int4"]
        problems, line = clean_error_problems([sdc, "compile", path, *q, *flags, "-o", out], must, no_files=(out,))
        check(f"bad input: --quantize {'int3' if what == 'int3' else 'int4 with ' + what} is a one-line error",
              not problems, "; ".join(problems) or line)


def refusals(sdc, tmp):
    from onnx import TensorProto, helper, numpy_helper
    import onnx
    rng = np.random.default_rng(0)
    init, _ = nbits_case(rng, 64, 8, 4, 32, None, False)

    def model(name, attrs, inputs, tensors):
        path = os.path.join(tmp, name + ".onnx")
        node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", **attrs)
        g = helper.make_graph([node], "bad", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(v, k) for k, v in tensors.items()])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)
        return path
    base = dict(K=64, N=8, bits=4, block_size=32)
    g_idx = dict(init, g=np.zeros(64, np.int32))
    for what, path, must in [
            ("g_idx", model("gidx", base, ["A", "B", "scales", "", "g"], g_idx), ["g_idx"]),
            ("bits 3", model("bits3", dict(base, bits=3), ["A", "B", "scales"], init), ["bits 3"]),
            ("a B of the wrong size", model("short", dict(base, N=9), ["A", "B", "scales"], init), ["B", "N = 9"])]:
        out = path[:-5] + ".sdp"
        problems, line = clean_error_problems([sdc, "compile", path, "-o", out], must, no_files=(out,))
        check(f"bad input: MatMulNBits with {what} is a one-line error naming it", not problems,
              "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    import tempfile
    tmp = tempfile.mkdtemp(prefix="sd_int4_")
    try:
        node_checks(sdc, sdrun, tmp)
        int8_checks(sdc, sdrun, tmp)
        model_checks(sdc, sdrun, tmp)
        quantize_flag(sdc, sdrun, tmp)
        quantize_llama(sdc, sdrun, tmp)
        refusals(sdc, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("int4_models")


if __name__ == "__main__":
    sys.exit(main())
