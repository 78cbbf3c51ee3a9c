#!/usr/bin/env python3
"""The op harness, in the spirit of ggml's test-backend-ops.

Every kernel a backend registers is run, for every element type it claims, on
random inputs, edge shapes (zero-sized, scalar, broadcast) and NaN/Inf, through
the path a session takes (shape rule, KernelRegistry::bind, runKernel; see
ops_module.cc), and compared with a reference: ONNX's reference evaluator
(onnx.reference, plain NumPy loops) for ONNX ops, NumPy written here for sdc's
own contracts (backward ops, optimizers, fused ops). A kernel with no case, or
a claimed type no case ran, fails the run. Plan tensors are always dense and
contiguous (the runtime has no strided views), so there are no
non-contiguous cases to run.

On a GPU backend (--backend cuda) every case runs on device memory through the
kernel's prepare function and the device's stream, against the same
references, and each case runs twice and must give the same bits (the CPU runs
with 1 and 3 threads instead). A backend this machine cannot use fails, or
with --skip-if-absent exits 77, which CTest reports as skipped.

--bind-only checks, without a device, that the backend's registry binds every
case's operand types (CTest ops_cuda_bind).

  op_harness.py [--backend cpu|cuda] [--skip-if-absent] [--bind-only] [--op NAME ...] [--seed N] [-v]
"""
import argparse
import copy
import math
import re
import os
import sys
import warnings
import zlib

import ml_dtypes
import numpy as np

import _sdops

OPSET = 18
NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i8": np.int8,
      "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u16": np.uint16, "u32": np.uint32,
      "u64": np.uint64, "bool": np.bool_,
      # Narrow storage types (sdc holds one byte per element, as ml_dtypes does).
      "f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "f8e5m2": ml_dtypes.float8_e5m2,
      "f8e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "i4": ml_dtypes.int4, "u4": ml_dtypes.uint4, "i2": ml_dtypes.int2,
      "u2": ml_dtypes.uint2, "f4e2m1": ml_dtypes.float4_e2m1fn, "f8e8m0": ml_dtypes.float8_e8m0fnu}
FLOATS = ("f32", "f64", "f16", "bf16")
NARROW_TYPE = re.compile(r"f8|f4|[iu][42]$")
HALVES = ("f16", "bf16")
FLOAT_NAME = {np.dtype(NP[t]): t for t in FLOATS}
# Relative tolerances: f32/f64 kernels reassociate sums (blocked GEMMs,
# vectorized reductions); half results are computed in f32 and rounded once.
RTOL = {"f64": 1e-9, "f32": 2e-4, "f16": 2e-3, "bf16": 1.6e-2}
ATOL = {"f64": 1e-11, "f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.5, 0.5, 3.0]


# ONNX's TensorProto.DataType numbers. onnx is imported only to compute
# references, so a machine replaying saved ones (--references) needs no onnx.
ONNX_TYPE = {"f32": 1, "u8": 2, "i8": 3, "u16": 4, "i16": 5, "i32": 6, "i64": 7, "bool": 9, "f16": 10, "f64": 11,
             "u32": 12, "u64": 13, "bf16": 16, "f8e4m3fn": 17, "f8e4m3fnuz": 18, "f8e5m2": 19, "f8e5m2fnuz": 20,
             "u4": 21, "i4": 22, "f4e2m1": 23, "f8e8m0": 24, "u2": 25, "i2": 26}


def onnx_type(t):
    return ONNX_TYPE[t]


def rand(rng, shape, t, lo=-2.0, hi=2.0):
    """Random values of type t in [lo, hi] (integers: clipped to the type)."""
    if t == "f8e8m0":  # powers of two only (no sign, no zero): stay within [lo, hi] once rounded
        top = max(int(math.floor(math.log2(hi))) if hi > 0 else -8, -8)
        return np.ldexp(1.0, rng.integers(-8, top + 1, shape)).astype(NP[t])
    if t in FLOATS or t.startswith("f8") or t.startswith("f4"):
        return rng.uniform(lo, hi, shape).astype(NP[t])
    if t == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    info = ml_dtypes.iinfo(NP[t])
    a, b = max(info.min, math.floor(lo)), min(info.max, math.ceil(hi))
    return rng.integers(a, b + 1, shape, dtype=np.int64).astype(NP[t])


def specials(t, shape=(len(SPECIALS),)):
    return np.resize(np.array(SPECIALS, np.float64), shape).astype(NP[t])


def i64(*v):
    return np.array(v, np.int64)


class Case:
    """One run of an op: make(t, rng) builds the inputs for element type t."""

    def __init__(self, make, attrs=None, ref="onnx", outputs=1, types=None, label="", opset=OPSET, rtol=1.0,
                 onnx_op=None, compare=None, onnx_attrs=None, ref_via_f64=False, error=None, made_by_cpu_kernel=False):
        self.make, self.attrs, self.ref, self.outputs = make, attrs or {}, ref, outputs
        self.types, self.label, self.opset, self.rtol = types, label, opset, rtol
        self.onnx_op, self.compare = onnx_op, compare
        # The ONNX node's attributes where sdc's contract spells them differently
        # (or a function returning them, when building them needs onnx).
        self.onnx_attrs = onnx_attrs
        # Feed the reference f64 (for types it does not implement) and cast back.
        self.ref_via_f64 = ref_via_f64
        # The kernel must refuse these inputs with a message containing `error`.
        self.error = error
        # make() runs a CPU kernel (a gradient's saved forward states), whose
        # last bits depend on the CPU's vector width: saved references keep
        # these cases' inputs rather than remaking them on the GPU machine.
        self.made_by_cpu_kernel = made_by_cpu_kernel


def onnx_reference(op, case, inputs, ours):
    """Runs one ONNX node in onnx.reference; half inputs go in as f32."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    names, feeds, infos = [], {}, []
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        if x.dtype in (np.float16, ml_dtypes.bfloat16):
            x = x.astype(np.float32)
        if case.ref_via_f64 and x.dtype.kind in "iub":
            x = x.astype(np.float64)
        names.append(f"in{i}")
        feeds[f"in{i}"] = x
        infos.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    outs = [f"out{i}" for i in range(case.outputs)]
    out_infos = [helper.make_tensor_value_info(n, 0, None) for n in outs]
    onnx_attrs = case.onnx_attrs() if callable(case.onnx_attrs) else case.onnx_attrs
    node = helper.make_node(case.onnx_op or op, names, outs, **(onnx_attrs or case.attrs))
    graph = helper.make_graph([node], "g", infos, out_infos)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        got = ReferenceEvaluator(model).run(None, feeds)
    return cast_like(got, ours) if ours is not None else [np.asarray(g) for g in got]


def compare(ours, ref, t, case):
    if ours.shape != ref.shape:
        return f"shape {ours.shape}, reference {ref.shape}"
    name = FLOAT_NAME.get(ours.dtype)
    if name:
        # A half result is held to half tolerance; otherwise the case's float type sets it.
        tt = name if name in HALVES or t not in FLOATS else t
        a, b = ours.astype(np.float64), ref.astype(np.float64)
        # Infinities must match exactly, NaN where the reference has NaN.
        bad = ~np.isclose(a, b, rtol=RTOL[tt] * case.rtol, atol=ATOL[tt] * case.rtol, equal_nan=True)
        if bad.any():
            i = np.flatnonzero(bad)[0]
            return (f"{int(bad.sum())} of {a.size} elements differ, first at {np.unravel_index(i, a.shape)}: "
                    f"{a.flat[i]!r} vs reference {b.flat[i]!r}")
        return None
    if not np.array_equal(ours, ref):
        bad = ours != ref
        i = np.flatnonzero(bad)[0]
        return f"{int(bad.sum())} of {ours.size} elements differ, first: {ours.flat[i]!r} vs reference {ref.flat[i]!r}"
    return None


# Refusal cases a GPU backend accepted: data-dependent errors (an index out of
# range) that only the CPU kernels can report; the GPU kernels' fallback
# (a zero row, a NaN loss) is documented in their files.
GPU_ACCEPTED = []
# Cases whose result type the backend's kernel declares it does not produce
# (CUDA's Cast to the narrow types): a session runs those steps on the CPU.
LEFT_TO_CPU = set()


def left_to_cpu(backend, op, error):
    if backend != "cpu" and "does not produce" in str(error):
        LEFT_TO_CPU.add(f"{op} to {str(error).split('does not produce ')[1].split()[0]}")
        return True
    return False


# Saved references (--references FILE): the reference outputs of every case,
# written where the references run (--write-references, which needs
# onnx.reference and PyTorch but no GPU) and replayed on a machine that has
# the GPU but not those (scripts/gpu-check.sh --run). Keyed op/case/type; the
# inputs are made again from the case's seed and must hash as they did, or,
# for a case made by a CPU kernel, are saved with its references.
SAVED = {}


def case_key(op, ci, t):
    """Case ci of op with element type t: the key of its saved reference and its seed's stem."""
    return f"{op}/{ci}/{t}"


def case_seed(op, ci, t, seed):
    return zlib.crc32(f"{case_key(op, ci, t)}/{seed}".encode())


def claimed_cases(kernels):
    """(op, ci, case, t) for every case of every kernel and every type it
    claims that the case runs, refusal cases included."""
    for op in sorted(kernels):
        for ci, case in enumerate(CASES.get(op, [])):
            for t in kernels[op]["types"]:
                if case.types is None or t in case.types:
                    yield op, ci, case, t


def digest(inputs):
    return zlib.crc32(b"".join(np.ascontiguousarray(x).tobytes() + str(x.dtype).encode() for x in inputs
                               if x is not None))


def cast_like(got, ours):
    return [np.asarray(g).astype(o.dtype) if o is not None and o.dtype != np.asarray(g).dtype else np.asarray(g)
            for g, o in zip(got, ours)]


def reference(op, case, inputs, ours, t):
    if case.ref == "onnx":
        return onnx_reference(op, case, inputs, ours)
    return case.ref(inputs, case.attrs, t)


def run_case(backend, op, case, t, seed, key=None):
    saved = SAVED.get(key)
    inputs = saved["inputs"] if saved and "inputs" in saved else case.make(t, np.random.default_rng(seed))
    if saved and digest(inputs) != saved["digest"]:
        return "inputs differ from those of the saved references (another NumPy or ml_dtypes?)"
    try:
        ours = _sdops.run(backend, op, case.attrs, inputs, case.outputs)
    except RuntimeError as e:
        if case.error and case.error in str(e) or left_to_cpu(backend, op, e):
            return None
        return f"refused: {e}"
    if case.error:
        if backend != "cpu":  # a GPU kernel cannot stop mid-step over data (its documented fallback applies)
            GPU_ACCEPTED.append(f"{op} [{case.label}]")
            return None
        return f"accepted inputs it must refuse ({case.error})"
    # Results must not depend on the thread count (runs are reproducible on any machine).
    threaded = _sdops.run(backend, op, case.attrs, inputs, case.outputs, threads=3)
    for k, (a, b) in enumerate(zip(ours, threaded)):
        if a.tobytes() != b.tobytes():
            return f"output {k} differs between 1 and 3 threads"
    try:
        ref = reference(op, case, inputs, ours, t) if not saved or "ref" not in saved else \
            cast_like(saved["ref"], ours) if case.ref == "onnx" else saved["ref"]
    except Exception as e:  # a reference that cannot run this case is the harness's defect: report it
        return f"reference failed: {type(e).__name__}: {e}"
    if case.compare:
        return case.compare(ours, ref, inputs, t)
    for k, (a, b) in enumerate(zip(ours, ref)):
        err = compare(a, np.asarray(b), t, case)
        if err:
            return f"output {k}: {err}"
    return None


# ---- cases -------------------------------------------------------------------------------------------------------

def shapes_unary(lo=-2.0, hi=2.0, nan=True, **kw):
    """Random, zero-sized, scalar, and (for floats) NaN/Inf/±0 inputs."""
    kw.setdefault("types", None)
    cases = [Case(lambda t, r: [rand(r, (3, 5), t, lo, hi)], label="random", **kw),
             Case(lambda t, r: [rand(r, (0, 3), t, lo, hi)], label="zero-sized", **kw),
             Case(lambda t, r: [rand(r, (), t, lo, hi)], label="scalar", **kw),
             Case(lambda t, r: [rand(r, (2, 1031), t, lo, hi)], label="long rows (vector tails)", **kw)]
    if nan:
        cases.append(Case(lambda t, r: [specials(t)], label="NaN/Inf", **floats_of(kw)))
    return cases


def floats_of(kw):
    return dict(kw, types=[t for t in FLOATS if kw["types"] is None or t in kw["types"]])


def shapes_binary(lo=-2.0, hi=2.0, rhs=None, nan=True, **kw):
    rhs = rhs or (lambda r, shape, t: rand(r, shape, t, lo, hi))
    kw.setdefault("types", None)
    cases = [Case(lambda t, r: [rand(r, (3, 5), t, lo, hi), rhs(r, (3, 5), t)], label="random", **kw),
             Case(lambda t, r: [rand(r, (2, 1, 4), t, lo, hi), rhs(r, (3, 1), t)], label="broadcast", **kw),
             Case(lambda t, r: [rand(r, (0, 4), t, lo, hi), rhs(r, (1, 4), t)], label="zero-sized", **kw),
             Case(lambda t, r: [rand(r, (), t, lo, hi), rhs(r, (2, 3), t)], label="scalar", **kw)]
    if nan:
        cases.append(Case(lambda t, r: [specials(t), np.roll(specials(t), 3)], label="NaN/Inf", **floats_of(kw)))
    return cases


def nonzero(r, shape, t):
    v = rand(r, shape, t, 1, 4)
    if not t.startswith("u"):
        v = np.where(r.integers(0, 2, shape).astype(bool), v, -v).astype(v.dtype)
    return v


def numpy_ref(fn):
    """A float64 NumPy reference for ops whose onnx.reference computes in f32
    or rounds attributes to f32 (sdc's f64 kernels do neither)."""
    def ref(ins, attrs, t):
        with np.errstate(all="ignore"):
            return [np.asarray(fn(*[f64(x) for x in ins], **attrs)).astype(ins[0].dtype)]
    return ref


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu64(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


CASES = {}
for name, lo, hi in [("Exp", -3, 3), ("Log", 0.1, 4), ("Sqrt", 0, 4), ("Reciprocal", 0.5, 3), ("Sin", -3, 3),
                     ("Cos", -3, 3), ("Tan", -1.2, 1.2), ("Asin", -0.99, 0.99), ("Acos", -0.99, 0.99),
                     ("Atan", -3, 3), ("Sinh", -3, 3), ("Cosh", -3, 3), ("Asinh", -3, 3), ("Acosh", 1, 4),
                     ("Atanh", -0.95, 0.95), ("Tanh", -4, 4), ("Erf", -3, 3), ("Sigmoid", -6, 6),
                     ("HardSigmoid", -4, 4), ("HardSwish", -5, 5), ("Softplus", -5, 5), ("Softsign", -5, 5),
                     ("Mish", -5, 5), ("Floor", -5, 5), ("Ceil", -5, 5), ("Round", -5, 5), ("Neg", -5, 5),
                     ("Abs", -5, 5), ("Sign", -5, 5), ("Relu", -5, 5), ("IsNaN", -2, 2), ("IsInf", -2, 2)]:
    CASES[name] = shapes_unary(lo, hi)
CASES["Erf"] = shapes_unary(-3, 3, ref=numpy_ref(_erf))
CASES["Softsign"] = shapes_unary(-5, 5, ref=numpy_ref(lambda x: x / (1 + np.abs(x))))
CASES["HardSwish"] = shapes_unary(-5, 5, ref=numpy_ref(lambda x: x * np.clip(x / 6 + 0.5, 0, 1)))
CASES["HardSigmoid"] = (shapes_unary(-4, 4, attrs={"alpha": 0.25, "beta": 0.375}) +
                        [Case(lambda t, r: [rand(r, (3, 5), t, -4, 4)], label="default alpha 0.2, beta 0.5",
                              ref=numpy_ref(lambda x: np.clip(0.2 * x + 0.5, 0, 1)))])
CASES["Round"].append(Case(lambda t, r: [np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.4], NP[t])], label="halves to even",
                           types=FLOATS))
for name, attrs in [("LeakyRelu", {"alpha": 0.25}), ("Elu", {"alpha": 0.75}), ("Selu", {}), ("Celu", {"alpha": 1.5}),
                    ("ThresholdedRelu", {"alpha": 0.4})]:
    CASES[name] = shapes_unary(-3, 3, attrs=attrs)
CASES["Gelu"] = (shapes_unary(-4, 4, ref=numpy_ref(gelu64)) +
                 shapes_unary(-4, 4, nan=False, attrs={"approximate": "tanh"}, ref=numpy_ref(gelu64)))
# onnx.reference's Mean writes into its first operand, which fails on broadcasts.
CASES["Mean"] = shapes_binary(-4, 4, ref=numpy_ref(lambda *xs: sum(np.broadcast_arrays(*xs)) / len(xs)))
for name in ["Add", "Sub", "Mul", "Min", "Max", "Sum"]:
    CASES[name] = shapes_binary(-4, 4)
CASES["Max"].append(Case(lambda t, r: [rand(r, (2, 3), t), rand(r, (3,), t), rand(r, (1, 1), t)], label="three"))
CASES["Sum"].append(Case(lambda t, r: [rand(r, (2, 3), t, -3, 3)], label="one operand"))
CASES["Div"] = shapes_binary(-4, 4, rhs=nonzero)
CASES["Mod"] = (shapes_binary(-7, 7, rhs=nonzero, nan=False) +
                shapes_binary(-7, 7, rhs=nonzero, types=FLOATS, attrs={"fmod": 1}))
CASES["Pow"] = (shapes_binary(0.5, 3, rhs=lambda r, s, t: rand(r, s, t, 0, 3), types=FLOATS) +
                shapes_binary(0, 3, rhs=lambda r, s, t: rand(r, s, t, 0, 3), nan=False))
CASES["PRelu"] = [Case(lambda t, r: [rand(r, (2, 3, 4, 5), t, -3, 3), rand(r, (3, 1, 1), t, -2, 2)], label="per channel"),
                  Case(lambda t, r: [rand(r, (2, 3), t, -3, 3), rand(r, (3,), t, -2, 2)], label="broadcast")]
for name in ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]:
    CASES[name] = shapes_binary(-2, 2)
for name in ["And", "Or", "Xor"]:
    CASES[name] = shapes_binary(nan=False)
CASES["Not"] = shapes_unary(nan=False)
SAME_WIDTH = {"f32": "i32", "i32": "f32", "u32": "i32", "f64": "i64", "i64": "f64", "u64": "i64", "f16": "u16",
              "bf16": "i16", "i16": "u16", "u16": "i16", "i8": "u8", "u8": "i8", "bool": "u8"}
def shrink_ref(ins, attrs, t):
    x, bias, lambd = f64(ins[0]), attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    return [np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0)).astype(ins[0].dtype)]


CASES["Shrink"] = [Case(lambda t, r: [rand(r, (3, 5), t, -5, 5)], ref=shrink_ref, label="defaults"),
                   Case(lambda t, r: [rand(r, (3, 5), t, -5, 5)], attrs={"bias": 1.5, "lambd": 1.5}, ref=shrink_ref,
                        label="soft", types=FLOATS)]


def bit_cast_case(t):
    return Case(lambda t_, r: [rand(r, (3, 4), t, -100 if t not in ("u8", "u16", "u32", "u64", "bool") else 0, 100)],
                attrs={"to": onnx_type(SAME_WIDTH[t])}, types=[t], label=f"{t} -> {SAME_WIDTH[t]}",
                ref=lambda ins, attrs, t_: [ins[0].view(NP[SAME_WIDTH[t]])])


CASES["BitCast"] = [bit_cast_case(t) for t in SAME_WIDTH]
UNSIGNED = ("u8", "u16", "u32", "u64")
SIGNED = ("i8", "i16", "i32", "i64")


def bit_shift_ref(ins, attrs, t):
    """ONNX BitShift: signed right shifts are arithmetic; a shift that is
    negative or at least the width gives sign extension alone."""
    x, y = np.broadcast_arrays(*ins)
    bits = x.dtype.itemsize * 8
    out = np.zeros(x.shape, x.dtype)
    for idx in np.ndindex(x.shape):
        v, s = int(x[idx]), int(y[idx])
        if s < 0 or s >= bits:
            out[idx] = -1 if attrs["direction"] == "RIGHT" and v < 0 else 0
        elif attrs["direction"] == "RIGHT":
            out[idx] = v >> s
        else:
            wrapped = (v << s) & ((1 << bits) - 1)
            out[idx] = np.array(wrapped, np.uint64).astype(x.dtype) if x.dtype.kind == "i" else wrapped
    return [out]


CASES["BitShift"] = [Case(lambda t, r: [rand(r, (3, 4), t, 0, 200), rand(r, (3, 4), t, 0, 7)], attrs={"direction": d},
                          label=d, types=UNSIGNED) for d in ("LEFT", "RIGHT")]
CASES["BitShift"] += [Case(lambda t, r: [rand(r, (3, 4), t, -100, 100), rand(r, (3, 4), t, -2, 70)],
                           attrs={"direction": d}, ref=bit_shift_ref, label=f"signed {d}, out-of-range shifts",
                           types=SIGNED) for d in ("LEFT", "RIGHT")]
for name, fn in [("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor)]:
    CASES[name] = [Case(lambda t, r: [rand(r, (2, 3, 4), t, -100, 100), rand(r, (3, 1), t, -100, 100)],
                        ref=lambda ins, attrs, t, fn=fn: [fn(ins[0], ins[1])], label="broadcast",
                        types=UNSIGNED + SIGNED)]
CASES["BitwiseNot"] = [Case(lambda t, r: [rand(r, (3, 4), t, -100, 100)], ref=lambda ins, attrs, t: [np.invert(ins[0])],
                            types=UNSIGNED + SIGNED)]
CASES["Swish"] = (shapes_unary(-5, 5, ref=numpy_ref(lambda x: x / (1 + np.exp(-x)))) +
                  [Case(lambda t, r: [rand(r, (3, 5), t, -5, 5)], attrs={"alpha": 0.5}, label="alpha 0.5",
                        ref=lambda ins, attrs, t: [(f64(ins[0]) / (1 + np.exp(-0.5 * f64(ins[0])))).astype(ins[0].dtype)])])
# f32 only: onnx.reference computes the sample positions in float32.
CASES["GridSample"] = [
    Case(lambda t, r: [rand(r, (2, 3, 4, 5), t), rand(r, (2, 3, 6, 2), t, -1.2, 1.2)],
         attrs={"mode": m, "padding_mode": p, "align_corners": a}, label=f"2-D {m}, {p}, align_corners {a}",
         types=["f32"], rtol=10, opset=20)
    for m, p, a in (("linear", "zeros", 0), ("cubic", "reflection", 1), ("nearest", "border", 0),
                    ("cubic", "zeros", 0), ("linear", "reflection", 0))] + [
    Case(lambda t, r: [rand(r, (1, 2, 3, 4, 5), t), rand(r, (1, 2, 3, 2, 3), t, -1.1, 1.1)],
         attrs={"mode": "linear", "padding_mode": "border", "align_corners": 1}, label="3-D linear, border",
         types=["f32"], rtol=10, opset=20)]

CASES["AffineGrid"] = [
    Case(lambda t, r: [rand(r, (2, 2, 3), t), i64(2, 3, 4, 5)], attrs={"align_corners": a}, label=f"2-D align {a}",
         opset=20) for a in (0, 1)] + [
    Case(lambda t, r: [rand(r, (1, 3, 4), t), i64(1, 2, 3, 2, 4)], attrs={"align_corners": 1}, label="3-D",
         opset=20)]

# Ops of recent opsets and vision models, against onnx.reference.
def linear_attention_inputs(r, t, rule, hq=4, hkv=2, dk=3, dv=2, past=True, per_dim_decay=False, beta_last=None):
    b, steps = 2, 3
    ins = [rand(r, (b, steps, hq * dk), t, -1, 1), rand(r, (b, steps, hkv * dk), t, -1, 1),
           rand(r, (b, steps, hkv * dv), t, -1, 1), rand(r, (b, hkv, dk, dv), t, -1, 1) if past else None]
    ins.append(rand(r, (b, steps, hkv * dk if per_dim_decay else hkv), t, -1, 0) if "gated" in rule else None)
    ins.append(rand(r, (b, steps, beta_last or hkv), t, 0, 1) if "delta" in rule else None)
    while ins[-1] is None:
        ins.pop()
    return ins


CASES["LinearAttention"] = [
    Case(lambda t, r, rule=rule, kw=kw: linear_attention_inputs(r, t, rule, **kw), outputs=2, opset=27, rtol=5,
         attrs={"update_rule": rule, "q_num_heads": 4, "kv_num_heads": 2, **extra}, label=f"{rule} {label}")
    for rule, kw, extra, label in (
        ("linear", {}, {}, "GQA with past"), ("gated", {"per_dim_decay": True}, {"scale": 0.5}, "per-key decay"),
        ("delta", {"past": False}, {}, "no past"), ("gated_delta", {"beta_last": 1}, {}, "scalar beta"))] + [
    # d_v wider than the CUDA kernel's 256 threads: a thread walks two columns.
    Case(lambda t, r: linear_attention_inputs(r, t, "gated_delta", hq=2, hkv=1, dk=4, dv=260), outputs=2, opset=27,
         rtol=5, attrs={"update_rule": "gated_delta", "q_num_heads": 2, "kv_num_heads": 1}, types=["f32"],
         label="gated_delta, d_v 260")]
CASES["TensorScatter"] = [
    Case(lambda t, r: [rand(r, (2, 3, 5, 2), t), rand(r, (2, 3, 2, 2), t), i64(1, 3)], attrs={}, opset=24,
         label="linear"),
    Case(lambda t, r: [rand(r, (2, 4, 3), t), rand(r, (2, 3, 3), t), i64(3, 0)], attrs={"mode": "circular", "axis": 1},
         opset=24, label="circular"),
    Case(lambda t, r: [rand(r, (2, 4, 3), t), rand(r, (2, 3, 3), t), i64(2, 0)], attrs={"axis": 1}, opset=24,
         types=["f32"], error="writes position", label="past the end")]
CASES["Det"] = [Case(lambda t, r: [rand(r, (3, 3), t)], label="2-D"),
                Case(lambda t, r: [rand(r, (2, 4, 4), t)], label="batched"),
                Case(lambda t, r: [np.array([[1, 2], [2, 4]], NP[t])], label="singular")]
# onnx.reference's LRN walks the window for the first N channels only; N = C here.
CASES["LRN"] = [Case(lambda t, r: [rand(r, (3, 3, 2, 4), t)], attrs={"alpha": 2e-4, "beta": 0.75, "bias": 1.5, "size": s},
                     label=f"size {s}", opset=13) for s in (2, 3)]
CASES["MaxUnpool"] = [
    Case(lambda t, r: [np.array([[[[5, 6], [7, 8]]]], NP[t]), np.array([[[[5, 7], [13, 15]]]], np.int64)],
         attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, label="inferred shape"),
    Case(lambda t, r: [np.array([[[[5, 6], [7, 8]]]], NP[t]), np.array([[[[5, 7], [13, 15]]]], np.int64),
                       i64(1, 1, 5, 5)], attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, label="output_shape"),
    Case(lambda t, r: [np.array([[[[5, 6], [7, 8]]]], NP[t]), np.array([[[[5, 7], [13, 16]]]], np.int64)],
         attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, types=["f32"], error="out of range", label="bad index")]
CASES["Col2Im"] = [
    Case(lambda t, r: [rand(r, (1, 5, 5), t), i64(5, 5), i64(1, 5)], label="5x5 image, 1x5 blocks"),
    Case(lambda t, r: [rand(r, (2, 8, 4), t), i64(3, 3), i64(2, 2)],
         attrs={"pads": [1, 0, 0, 1], "strides": [2, 1], "dilations": [1, 2]}, label="pads, strides, dilations"),
    Case(lambda t, r: [rand(r, (1, 8, 8), t), i64(3, 3, 3), i64(2, 2, 2)], label="3-D image")]
CASES["RoiAlign"] = [
    Case(lambda t, r: [rand(r, (2, 2, 6, 7), t), np.array([[0.5, 1, 4, 5], [1.5, 0, 6.5, 3.2], [0, 0, 9, 9]], NP[t]),
                       i64(1, 0, 1)], attrs={"output_height": 3, "output_width": 2, "spatial_scale": 0.9,
                                             "mode": m, "coordinate_transformation_mode": ctm, "sampling_ratio": sr},
         opset=16, label=f"{m} {ctm} ratio {sr}", rtol=5)
    for m, ctm, sr in (("avg", "half_pixel", 2), ("max", "output_half_pixel", 0), ("avg", "output_half_pixel", 0))]
CASES["DeformConv"] = [
    Case(lambda t, r: [rand(r, (1, 2, 4, 5), t), rand(r, (4, 1, 2, 2), t), rand(r, (1, 16, 3, 4), t, -1.5, 1.5),
                       rand(r, (4,), t), rand(r, (1, 8, 3, 4), t, 0, 1)],
         attrs={"group": 2, "offset_group": 2}, opset=19, label="groups, bias, mask", rtol=5),
    Case(lambda t, r: [rand(r, (2, 1, 5, 5), t), rand(r, (2, 1, 3, 3), t), rand(r, (2, 18, 3, 3), t, -1, 1)],
         attrs={"pads": [1, 1, 1, 1], "strides": [2, 2]}, opset=19, label="pads, strides", rtol=5)]
CASES["CenterCropPad"] = [
    Case(lambda t, r: [rand(r, (5, 6, 3), t), i64(3, 9)], attrs={"axes": [0, 1]}, label="crop and pad"),
    Case(lambda t, r: [rand(r, (4, 5), t), i64(7, 2)], label="all axes")]
CASES["ReverseSequence"] = [
    Case(lambda t, r: [rand(r, (4, 3, 2), t), i64(4, 1, 3)], attrs={"batch_axis": 1, "time_axis": 0}, label="time major"),
    Case(lambda t, r: [rand(r, (3, 4), t), i64(0, 4, 2)], attrs={"batch_axis": 0, "time_axis": 1}, label="batch major"),
    Case(lambda t, r: [rand(r, (3, 4), t), i64(0, 5, 2)], attrs={"batch_axis": 0, "time_axis": 1}, types=["f32"],
         error="outside [0, 4]", label="length past the steps")]
CASES["TfIdfVectorizer"] = [
    Case(lambda t, r: [np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], NP[t])], label=f"{mode} skip {skip}",
         attrs={"mode": mode, "min_gram_length": lo, "max_gram_length": 2, "max_skip_count": skip,
                "ngram_counts": [0, 4], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6], "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
                **({"weights": [0.5, 1, 2, 1.5, 1, 3, 0.25]} if mode != "TF" else {})})
    for mode, lo, skip in (("TF", 1, 0), ("TF", 2, 5), ("IDF", 1, 3), ("TFIDF", 1, 5))]

# onnx.reference computes these in f32 whatever the input type: sdc's f64
# results are held to f32's tolerance there (RTOL f32 / f64 = 2e5).
for op in ("AffineGrid", "LinearAttention", "RoiAlign", "DeformConv"):
    CASES[op] = [c for c in CASES[op] if c.types is None or c.types != ["f64"]]
    for c in list(CASES[op]):
        if c.error is None:
            f64_case = copy.copy(c)
            f64_case.types, f64_case.rtol, f64_case.label = ["f64"], 2e5, c.label + " (f64 vs the f32 reference)"
            c.types = [t for t in (c.types or FLOATS) if t != "f64"]
            CASES[op].append(f64_case)

# Spectral ops (speech front ends), against onnx.reference.
ONNX_FLOAT_CODE = {"f32": 1, "f64": 11}
CASES["DFT"] = [
    Case(lambda t, r: [rand(r, (2, 8, 1), t), None, np.array(1, np.int64)], attrs={"axis": 1}, onnx_attrs={"inverse": 0},
         label="real, full spectrum", types=["f32", "f64"], rtol=10, opset=20),
    Case(lambda t, r: [rand(r, (2, 6, 2), t), np.array(8, np.int64), np.array(-2, np.int64)],
         attrs={"axis": -2, "inverse": 1}, onnx_attrs={"inverse": 1}, label="complex inverse, padded to 8",
         types=["f32", "f64"], rtol=10, opset=20),
    Case(lambda t, r: [rand(r, (3, 7, 1), t), None, np.array(1, np.int64)], attrs={"axis": 1, "onesided": 1},
         onnx_attrs={"onesided": 1}, label="real, one-sided", types=["f32", "f64"], rtol=10, opset=20),
    Case(lambda t, r: [rand(r, (2, 5, 2), t), None, np.array(1, np.int64)],
         attrs={"axis": 1, "inverse": 1, "onesided": 1}, onnx_attrs={"inverse": 1, "onesided": 1},
         label="inverse one-sided (irfft)", types=["f32", "f64"], rtol=10, opset=20)]
CASES["STFT"] = [
    Case(lambda t, r: [rand(r, (2, 40, 1), t), np.array(8, np.int64),
                       (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(NP[t]), np.array(16, np.int64)],
         attrs={"onesided": 1}, label="Hann window, hop 8", types=["f32", "f64"], rtol=10),
    Case(lambda t, r: [rand(r, (1, 20, 2), t), np.array(5, np.int64), None, np.array(8, np.int64)],
         attrs={"onesided": 0}, label="complex signal, no window", types=["f32", "f64"], rtol=10)]
for name in ("HannWindow", "HammingWindow", "BlackmanWindow"):
    CASES[name] = [Case(lambda t, r: [np.array(10, np.int64)], attrs={"periodic": p, "output_datatype": ONNX_FLOAT_CODE[t]},
                        label=f"size 10, {'periodic' if p else 'symmetric'}", types=[t])
                   for p in (1, 0) for t in ("f32", "f64")]
CASES["MelWeightMatrix"] = [
    Case(lambda t, r: [np.array(8, np.int64), np.array(64, np.int64), np.array(16000, np.int64),
                       np.array(0.0, np.float32), np.array(8000.0, np.float32)],
         attrs={"output_datatype": ONNX_FLOAT_CODE[t]}, label="8 mel bins of a 64-point DFT", types=[t])
    for t in ("f32", "f64")]

# Data-dependent selections: sized from the operand values (constants in a plan).
# Selections (NonZero, Compress, Unique, NonMaxSuppression) fill a prefix of
# results sized for the most they can keep and count it in a last result.
def nms_inputs(r, max_out, thresholds=True, batches=2, classes=3, boxes=9):
    corners = r.uniform(0, 1, (batches, boxes, 4)).astype(np.float32)
    ins = [corners, r.uniform(0, 1, (batches, classes, boxes)).astype(np.float32), np.array([max_out], np.int64)]
    return ins + [np.array([0.3], np.float32)] + ([np.array([0.25], np.float32)] if thresholds else [])


def counted(op, cases, axes):
    """The selections' sd form adds a last result counting the slices it
    filled along `axes` (one per ONNX output; None: not counted): the
    reference runs the ONNX node with its own outputs, and ours are compared
    on the counted prefix, the rest being zero."""
    def reference(inputs, attrs, t):
        return onnx_reference(op, Case(None, attrs=attrs, outputs=len(axes)), inputs, [np.zeros(0)] * len(axes))

    def compare_prefix(ours, ref, inputs, t):
        count = int(ours[-1])
        for k, (a, b, axis) in enumerate(zip(ours, ref, axes)):
            b = np.asarray(b).astype(a.dtype)
            if axis is not None:
                if np.take(a, range(count, a.shape[axis]), axis=axis).any():
                    return f"output {k}: the slices past the count are not zero"
                a = np.take(a, range(count), axis=axis)
            err = compare(a, b, t, Case(None))
            if err:
                return f"output {k}: {err}"
        return None

    for c in cases:
        c.outputs, c.ref, c.compare = len(axes) + 1, reference, compare_prefix
    return cases


# The larger cases span several of the CUDA kernels' scan tiles (4096
# elements) and block widths (256 threads).
CASES["NonZero"] = counted("NonZero", [
    Case(lambda t, r: [rand(r, (3, 4), t, -1, 1).round()], label="zeros among values"),
    Case(lambda t, r: [rand(r, (70, 80), t, -1, 1).round()], types=["f32"], label="5600 elements, several tiles"),
    Case(lambda t, r: [rand(r, (2, 3, 2), "bool")], label="bool 3-D", types=["bool"])], [1])
CASES["Compress"] = (
    counted("Compress", [Case(lambda t, r: [rand(r, (3, 4), t), np.array([1, 0, 1], bool)], attrs={"axis": 0},
                              label="rows")], [0])
    + counted("Compress", [Case(lambda t, r: [rand(r, (3, 4), t), np.array([0, 1, 1, 0], bool)], attrs={"axis": -1},
                                label="columns, negative axis")], [1])
    + counted("Compress", [Case(lambda t, r: [rand(r, (2, 3), t), np.array([1, 0, 0, 1], bool)],
                                label="flattened, condition shorter")], [0])
    + counted("Compress", [Case(lambda t, r: [rand(r, (5000, 2), t), r.random(5000) < 0.5], attrs={"axis": 0},
                                types=["f32"], label="5000 rows, several tiles")], [0]))
CASES["Unique"] = counted("Unique", [
    Case(lambda t, r: [rand(r, (9,), t, 0, 4).round()], label="sorted, flattened"),
    Case(lambda t, r: [rand(r, (9,), t, 0, 4).round()], attrs={"sorted": 0}, label="in order of first occurrence"),
    Case(lambda t, r: [np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]], NP[t])], attrs={"axis": 0}, label="unique rows"),
    Case(lambda t, r: [rand(r, (6000,), t, 0, 60).round()], types=["f32"], label="6000 values, several tiles"),
    Case(lambda t, r: [rand(r, (6000,), t, 0, 60).round()], attrs={"sorted": 0}, types=["f32"],
         label="6000 values in order of first occurrence"),
    Case(lambda t, r: [rand(r, (300, 2), t, 0, 3).round()], attrs={"axis": 0}, types=["f32"],
         label="300 rows, 2 columns")],
    [0, 0, None, 0])

# TopK whose k is only known at run time: values and indices span the axis, k counts.
CASES["TopKBounded"] = (
    counted("TopK", [Case(lambda t, r: [r.permutation(24).reshape(4, 6).astype(NP[t]), i64(k)],
                          attrs={"axis": 1, "largest": l}, label=f"k={k} of 6, largest {l}")
                     for k, l in ((3, 1), (6, 0), (0, 1))], [1, 1])
    + counted("TopK", [Case(lambda t, r: [r.permutation(24).reshape(4, 6).astype(NP[t]), i64(2)],
                            attrs={"axis": 0}, label="k=2 along axis 0")], [0, 0]))
CASES["TopKBounded"].append(Case(lambda t, r: [rand(r, (2, 6), t), i64(7)], attrs={"axis": 1}, outputs=3, types=["f32"],
                                 error="outside [0, 6]", label="k past the axis"))

CASES["NonMaxSuppression"] = counted("NonMaxSuppression", [
    Case(lambda t, r: nms_inputs(r, 4), types=["f32"], label="corners, thresholds"),
    Case(lambda t, r: nms_inputs(r, 9), attrs={"center_point_box": 1}, types=["f32"], label="center-point boxes"),
    Case(lambda t, r: nms_inputs(r, 2, thresholds=False), types=["f32"], label="no score threshold"),
    Case(lambda t, r: nms_inputs(r, 0), types=["f32"], label="max 0 selects nothing"),
    Case(lambda t, r: nms_inputs(r, 280, thresholds=False, batches=1, classes=2, boxes=300), types=["f32"],
         label="300 boxes, more than a block's threads")], [0])

# The ops unrolled control flow leaves (compiler/import/onnx/ControlFlowHandler.cpp).
CASES["IfSelect"] = [Case(lambda t, r, c=c: [np.array(c), rand(r, (2, 3), t), rand(r, (2, 3), t)],
                          ref=lambda ins, attrs, t: [ins[1] if ins[0] else ins[2]], label=f"condition {c}")
                     for c in (True, False)]
CASES["LoopGuard"] = [
    Case(lambda t, r: [rand(r, (2, 3), t), np.array(False)], attrs={"message": "loop ran past --max-trip 4"},
         ref=lambda ins, attrs, t: [ins[0]], label="within the bound"),
    Case(lambda t, r: [rand(r, (2, 3), t), np.array([True])], attrs={"message": "loop ran past --max-trip 4"},
         error="loop ran past --max-trip 4", label="past the bound")]
CASES["Clip"] = [
    Case(lambda t, r: [rand(r, (3, 5), t, -5, 5), np.array(1, NP[t]), np.array(3, NP[t])], label="min and max"),
    Case(lambda t, r: [rand(r, (3, 5), t, -5, 5), None, np.array(1, NP[t])], label="max only"),
    Case(lambda t, r: [rand(r, (3, 5), t, -5, 5)], label="neither"),
    Case(lambda t, r: [specials(t), np.array(-1, NP[t]), np.array(2, NP[t])], label="NaN/Inf", types=FLOATS)]
CASES["Where"] = [Case(lambda t, r: [rand(r, (2, 1, 4), "bool"), rand(r, (3, 1), t), rand(r, (2, 3, 4), t)],
                       label="broadcast"),
                  Case(lambda t, r: [rand(r, (0, 4), "bool"), rand(r, (0, 4), t), rand(r, (1, 4), t)],
                       label="zero-sized")]
for to in ["f32", "f64", "f16", "bf16", "i8", "i32", "i64", "u8", "u64", "bool", "f8e4m3fn", "f8e5m2fnuz", "i4",
           "u2", "f4e2m1", "f8e8m0"]:
    # Values in range of both types: out-of-range float-to-integer casts are
    # undefined in ONNX (sdc saturates, NumPy wraps).
    lo = 0 if to.startswith("u") or to == "bool" else -100
    hi = 100
    if to in ("i4", "u2"):
        lo, hi = int(ml_dtypes.iinfo(NP[to]).min), int(ml_dtypes.iinfo(NP[to]).max)
    # onnx.reference casts between two narrow types through neither: those pairs are left to test_narrow_types.
    wide = None if to in ("f32", "f64") else [t for t in NP if not NARROW_TYPE.match(t)] if NARROW_TYPE.match(to) else None
    CASES.setdefault("Cast", []).append(Case(lambda t, r, lo=lo, hi=hi: [rand(r, (3, 4), t, lo, hi)],
                                             attrs={"to": onnx_type(to)}, label=f"to {to}", types=wide))
    CASES.setdefault("CastLike", []).append(Case(lambda t, r, to=to, lo=lo, hi=hi: [rand(r, (3, 4), t, lo, hi),
                                                                             np.zeros((1,), NP[to])], label=f"like {to}",
                                                 types=wide))
CASES["Identity"] = shapes_unary(nan=False)
CASES["Dropout"] = [Case(lambda t, r: [rand(r, (3, 4), t)], label="inference: identity"),
                    Case(lambda t, r: [rand(r, (3, 4), t)], outputs=2, label="with mask")]

# Data movement.
CASES["Reshape"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t), i64(4, -1, 2)]),
                    Case(lambda t, r: [rand(r, (0, 3), t), i64(3, 0)], attrs={"allowzero": 1}, label="zero-sized")]
CASES["Flatten"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t)], attrs={"axis": a}, label=f"axis {a}") for a in (0, 2)]
CASES["Squeeze"] = [Case(lambda t, r: [rand(r, (2, 1, 3, 1), t), i64(1, -1)]),
                    Case(lambda t, r: [rand(r, (1, 3, 1), t)], label="all unit dims")]
CASES["Unsqueeze"] = [Case(lambda t, r: [rand(r, (2, 3), t), i64(0, 3)])]
CASES["Transpose"] = [Case(lambda t, r: [rand(r, (2, 3, 4, 5), t)], attrs={"perm": [0, 2, 3, 1]}),
                      Case(lambda t, r: [rand(r, (3, 4), t)], label="default perm"),
                      Case(lambda t, r: [rand(r, (0, 4), t)], label="zero-sized")]
CASES["Concat"] = [Case(lambda t, r: [rand(r, (2, 3), t), rand(r, (2, 1), t), rand(r, (2, 0), t)], attrs={"axis": 1}),
                   Case(lambda t, r: [rand(r, (1, 3), t), rand(r, (2, 3), t)], attrs={"axis": -2}, label="axis -2")]
CASES["Split"] = [Case(lambda t, r: [rand(r, (2, 6), t), i64(1, 2, 3)], attrs={"axis": 1}, outputs=3),
                  Case(lambda t, r: [rand(r, (4, 3), t)], attrs={"num_outputs": 2}, outputs=2, label="even")]
CASES["Slice"] = [Case(lambda t, r: [rand(r, (5, 6), t), i64(1, -1), i64(4, 0), i64(0, 1), i64(1, -2)],
                       label="negative step"),
                  Case(lambda t, r: [rand(r, (5, 6), t), i64(2), i64(1000)], label="clamped end"),
                  Case(lambda t, r: [rand(r, (5, 6), t), i64(3), i64(3), i64(1)], label="empty")]
CASES["Expand"] = [Case(lambda t, r: [rand(r, (3, 1), t), i64(2, 3, 4)])]
CASES["Tile"] = [Case(lambda t, r: [rand(r, (2, 3), t), i64(2, 3)])]
CASES["Pad"] = [Case(lambda t, r: [rand(r, (2, 3), t), i64(1, 0, 0, 2), np.array(1, NP[t])], label="constant"),
                Case(lambda t, r: [rand(r, (3, 4), t), i64(2, 1, 1, 2)], attrs={"mode": "reflect"}, label="reflect"),
                Case(lambda t, r: [rand(r, (3, 4), t), i64(1, 2, 2, 1)], attrs={"mode": "edge"}, label="edge")]
CASES["DepthToSpace"] = [Case(lambda t, r: [rand(r, (1, 8, 2, 3), t)], attrs={"blocksize": 2, "mode": m}, label=m)
                         for m in ("DCR", "CRD")]
CASES["SpaceToDepth"] = [Case(lambda t, r: [rand(r, (1, 2, 4, 6), t)], attrs={"blocksize": 2, "mode": m}, label=m, opset=28)
                         for m in ("DCR", "CRD")]
CASES["Trilu"] = [Case(lambda t, r: [rand(r, (2, 4, 5), t), i64(k)], attrs={"upper": u}, label=f"upper={u} k={k}")
                  for u in (0, 1) for k in (-1, 1)]
CASES["Shape"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t)]),
                  Case(lambda t, r: [rand(r, (2, 3, 4), t)], attrs={"start": 1, "end": -1}, label="start/end")]
CASES["Size"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t)]), Case(lambda t, r: [rand(r, (0, 3), t)], label="zero")]
CASES["Gather"] = [Case(lambda t, r: [rand(r, (5, 3), t), i64(4, 0, -1, 2)], attrs={"axis": 0}),
                   Case(lambda t, r: [rand(r, (2, 5, 3), t), np.array([[1, 4], [0, 0]], np.int64)], attrs={"axis": 1},
                        label="axis 1, 2-D indices")]
CASES["Gather"].append(Case(lambda t, r: [rand(r, (4, 3), t), i64(0, 4)], error="out of range",
                           label="index out of range"))
# Single elements of a 1-D table by int32 indices (NF4's lookup): the CPU's in-place path.
CASES["Gather"] += [Case(lambda t, r: [rand(r, (16,), t), r.integers(-16, 16, (2, 300)).astype(np.int32)],
                         attrs={"axis": 0}, label="1-D table, int32 indices"),
                    Case(lambda t, r: [rand(r, (16,), t), np.array([3, 16, 0], np.int32)], error="out of range",
                         label="1-D table, int32 index out of range")]
CASES["GatherElements"] = [Case(lambda t, r: [rand(r, (3, 4), t), r.integers(-4, 4, (3, 2))], attrs={"axis": 1})]
CASES["GatherND"] = [Case(lambda t, r: [rand(r, (3, 4, 2), t), np.array([[0, 1], [2, 3]], np.int64)]),
                     Case(lambda t, r: [rand(r, (2, 3, 4), t), np.array([[1], [2]], np.int64)],
                          attrs={"batch_dims": 1}, label="batch_dims 1")]
CASES["ScatterElements"] = [
    Case(lambda t, r: [rand(r, (3, 4), t), np.array([[1, 0], [3, 2], [0, 0]], np.int64), rand(r, (3, 2), t)],
         attrs={"axis": 1}),
    Case(lambda t, r: [rand(r, (3, 4), t), np.array([[1, 1], [0, 0], [2, 2]], np.int64), rand(r, (3, 2), t)],
         attrs={"axis": 1, "reduction": "add"}, label="add", types=[x for x in NP if x != "bool"])]
CASES["ScatterElements"].append(Case(lambda t, r: [rand(r, (3, 4), t), np.array([[4]], np.int64), rand(r, (1, 1), t)],
                                    attrs={"axis": 1}, error="out of range", label="index out of range"))
CASES["ScatterND"] = [Case(lambda t, r: [rand(r, (4, 3), t), np.array([[2], [0]], np.int64), rand(r, (2, 3), t)])]
CASES["OneHot"] = [Case(lambda t, r: [np.array([0, 2, -1, 1], np.int64), np.array(3, np.int64),
                                      np.array([0, 1], NP[t])], attrs={"axis": -1}, ref_via_f64=True)]
CASES["TopK"] = [Case(lambda t, r: [r.permutation(24).reshape(4, 6).astype(NP[t]), i64(3)], outputs=2,
                      attrs={"axis": a, "largest": l}, label=f"axis {a} largest {l}") for a in (1, 0) for l in (1, 0)]
# sdc's contract carries the value as a number and the type apart; ONNX as a one-element tensor.
CASES["ConstantOfShape"] = [Case(lambda t, r: [i64(2, 3)], label=f"value {t}", types=[t],
                                 attrs={"dtype": onnx_type(t), "value": 3.0},
                                 onnx_attrs=lambda t=t: {"value": __import__("onnx").helper.make_tensor(
                                     "v", onnx_type(t), [1], [3])})
                            for t in ["f32", "f64", "f16", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
                                      "bool"]]
CASES["ConstantOfShape"].append(Case(lambda t, r: [i64(3)], label="default f32 zeros", types=["f32"]))
CASES["ConstantOfShape"].append(Case(lambda t, r: [i64(0, 2)], label="zero-sized", types=["f32"]))
# ONNX's reference cannot build a bf16 tensor attribute; check it by value.
CASES["ConstantOfShape"].append(Case(lambda t, r: [i64(2, 2)], types=["bf16"], label="value bf16",
                                     attrs={"dtype": onnx_type("bf16"), "value": 2.5},
                                     ref=lambda ins, a, t: [np.full((2, 2), 2.5, ml_dtypes.bfloat16)]))
CASES["EyeLike"] = [Case(lambda t, r: [np.zeros((3, 4), NP[t])], attrs={"k": k}, label=f"k={k}")
                    for k in (0, 1, -2)]
CASES["Range"] = [Case(lambda t, r: [np.array(1, NP[t]), np.array(10, NP[t]), np.array(3, NP[t])]),
                  Case(lambda t, r: [np.array(5, NP[t]), np.array(5, NP[t]), np.array(1, NP[t])], label="empty")]
CASES["Range"].append(Case(lambda t, r: [np.array(4, NP[t]), np.array(-2, NP[t]), np.array(-2, NP[t])],
                           label="negative delta", types=[x for x in NP if not x.startswith("u") and x != "bool"]))
CASES["CumSum"] = [Case(lambda t, r, a=a: [rand(r, (3, 4), t, 0, 5), np.array(a, np.int64)], attrs={"exclusive": e, "reverse": v},
                        label=f"axis {a} exclusive {e} reverse {v}") for a in (1, 0) for e in (0, 1) for v in (0, 1)]


def cum_prod_ref(ins, attrs, t):
    x, axis = ins[0], int(ins[1])
    y = np.flip(x, axis) if attrs.get("reverse") else x
    if attrs.get("exclusive"):
        ones = np.ones_like(np.take(y, [0], axis))
        y = np.concatenate([ones, np.take(y, range(y.shape[axis] - 1), axis)], axis)
    out = np.cumprod(y, axis=axis, dtype=x.dtype)
    return [np.flip(out, axis) if attrs.get("reverse") else out]


CASES["CumProd"] = [Case(lambda t, r, a=a: [rand(r, (3, 4), t, 0, 3), np.array(a, np.int64)],
                         attrs={"exclusive": e, "reverse": v}, ref=cum_prod_ref,
                         label=f"axis {a} exclusive {e} reverse {v}") for a in (1, -2) for e in (0, 1) for v in (0, 1)]


# Linear algebra.
CASES["MatMul"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t, -3, 3), rand(r, (4, 5), t, -3, 3)], label="batched"),
                   Case(lambda t, r: [rand(r, (2, 1, 3, 4), t, -3, 3), rand(r, (3, 4, 2), t, -3, 3)],
                        label="broadcast batch"),
                   Case(lambda t, r: [rand(r, (4,), t, -3, 3), rand(r, (4, 3), t, -3, 3)], label="vector"),
                   Case(lambda t, r: [rand(r, (0, 4), t), rand(r, (4, 3), t)], label="zero rows"),
                   Case(lambda t, r: [rand(r, (3, 0), t), rand(r, (0, 2), t)], label="zero inner"),
                   Case(lambda t, r: [rand(r, (37, 70), t), rand(r, (70, 33), t)], label="blocked sizes",
                        types=FLOATS)]
CASES["Gemm"] = [Case(lambda t, r: [rand(r, (4, 3), t, -3, 3), rand(r, (5, 4), t, -3, 3), rand(r, (5,), t, -3, 3)],
                      attrs={"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, label="transposed, alpha, beta",
                      types=FLOATS),
                 Case(lambda t, r: [rand(r, (3, 4), t, -3, 3), rand(r, (4, 5), t, -3, 3), rand(r, (3, 1), t, -3, 3)],
                      label="column bias"),
                 Case(lambda t, r: [rand(r, (3, 4), t, -3, 3), rand(r, (4, 5), t, -3, 3)], label="no bias"),
                 # sd-accumulate-into-gemm: a C of the output's shape, the running sum.
                 Case(lambda t, r: [rand(r, (6, 5), t, -3, 3), rand(r, (8, 5), t, -3, 3), rand(r, (6, 8), t, -3, 3)],
                      attrs={"transB": 1, "alpha": 2.0, "beta": 1.0}, label="C of the output's shape", types=FLOATS),
                 # LoRA's backward after sd-scale-into-gemm: the scale as alpha, no C.
                 Case(lambda t, r: [rand(r, (64, 24), t, -3, 3), rand(r, (64, 8), t, -3, 3)],
                      attrs={"transA": 1, "alpha": 4.0}, label="alpha, no C", types=FLOATS)]


def linear_ref(ins, attrs, t):
    x, w = ins[0].astype(np.float64), ins[1].astype(np.float64)
    y = x @ (w.T if attrs.get("layout", "io") == "oi" else w)
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    return [y.astype(ins[0].dtype)]


CASES["Linear"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t, -3, 3), rand(r, (5, 4), t, -3, 3), rand(r, (5,), t)],
                        attrs={"layout": "oi"}, ref=linear_ref, label="oi with bias"),
                   Case(lambda t, r: [rand(r, (3, 4), t, -3, 3), rand(r, (4, 5), t, -3, 3)], ref=linear_ref,
                        label="io (default)"),
                   Case(lambda t, r: [rand(r, (0, 4), t), rand(r, (5, 4), t)], attrs={"layout": "oi"}, ref=linear_ref,
                        label="zero rows")]


def linear_add_ref(ins, attrs, t):
    y = f64(ins[0]) @ (f64(ins[1]).T if attrs.get("layout", "io") == "oi" else f64(ins[1]))
    if ins[2] is not None:
        y = y + f64(ins[2])
    return [(y + f64(ins[3])).astype(ins[0].dtype)]


# sd-accumulate-into-gemm's Linear: the product accumulated onto an addend of
# its shape (cuBLASLt's C beside the bias epilogue).
CASES["LinearAdd"] = [
    Case(lambda t, r: [rand(r, (2, 3, 4), t, -3, 3), rand(r, (8, 4), t, -3, 3), rand(r, (8,), t),
                       rand(r, (2, 3, 8), t, -3, 3)], attrs={"layout": "oi"}, ref=linear_add_ref, label="oi with bias"),
    Case(lambda t, r: [rand(r, (5, 4), t, -3, 3), rand(r, (4, 8), t, -3, 3), None, rand(r, (5, 8), t, -3, 3)],
         ref=linear_add_ref, label="io, no bias"),
    Case(lambda t, r: [rand(r, (37, 70), t), rand(r, (33, 70), t), rand(r, (33,), t), rand(r, (37, 33), t)],
         attrs={"layout": "oi"}, ref=linear_add_ref, label="blocked sizes", types=FLOATS),
    Case(lambda t, r: [rand(r, (0, 4), t), rand(r, (8, 4), t), None, rand(r, (0, 8), t)], attrs={"layout": "oi"},
         ref=linear_add_ref, label="zero rows"),
    # Refused: an addend of another shape, and none at all.
    Case(lambda t, r: [rand(r, (5, 4), t), rand(r, (8, 4), t), None, rand(r, (5, 4), t)], attrs={"layout": "oi"},
         types=["f32"], error="does not match the product", label="addend of another shape"),
    Case(lambda t, r: [rand(r, (5, 4), t), rand(r, (8, 4), t), rand(r, (8,), t)], attrs={"layout": "oi"},
         types=["f32"], error="needs an addend", label="no addend")]
CASES["Einsum"] = [Case(lambda t, r: [rand(r, (2, 3, 4), t, -3, 3), rand(r, (2, 4, 5), t, -3, 3)],
                        attrs={"equation": "bij,bjk->bik"}),
                   Case(lambda t, r: [rand(r, (3, 4), t, -3, 3)], attrs={"equation": "ij->ji"}, label="transpose"),
                   Case(lambda t, r: [rand(r, (3, 3), t, -3, 3)], attrs={"equation": "ii->i"}, label="diagonal"),
                   Case(lambda t, r: [rand(r, (3, 4), t, -3, 3), rand(r, (4,), t, -3, 3)],
                        attrs={"equation": "ij,j->i"}, label="matrix-vector")]

# Reductions.
for name in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
             "ReduceLogSumExp", "ReduceSumSquare"]:
    positive = name in ("ReduceLogSum", "ReduceL2")
    lo, hi = (0.5, 3) if positive else (-3, 3)
    CASES[name] = [Case(lambda t, r, lo=lo, hi=hi: [rand(r, (2, 3, 4), t, lo, hi), i64(0, 2)], label="axes 0,2"),
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (2, 3, 4), t, lo, hi), i64(-1)], attrs={"keepdims": 0},
                        label="last axis, no keepdims"),
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (2, 3, 4), t, lo, hi)], label="all axes"),
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (3, 1000), t, lo, hi), i64(1)], label="long rows",
                        types=FLOATS, rtol=4),
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (3, 4), t, lo, hi), np.zeros((0,), np.int64)],
                        attrs={"noop_with_empty_axes": 1}, label="no-op"),
                   Case(lambda t, r: [specials(t, (3, 3)), i64(1)], label="NaN/Inf", types=FLOATS),
                   # A middle run of axes (GQA's repeated KV heads in backward), and
                   # rows wider than one work item's columns.
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (2, 3, 4, 5), t, lo, hi), i64(1, 2)], label="middle axes"),
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (2, 3, 6000), t, lo, hi), i64(1)], types=FLOATS,
                        label="middle axis, wide rows"),
                   # Leading axes over trailing ones (a bias gradient's sum over
                   # rows: CUDA's column path, chunks of 64 rows and a partial one).
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (2, 150, 40), t, lo, hi), i64(0, 1)], types=FLOATS,
                        rtol=4, label="leading axes, 300 rows of 40"),
                   Case(lambda t, r, lo=lo, hi=hi: [rand(r, (130, 33), t, lo, hi), i64(0)], attrs={"keepdims": 0},
                        types=FLOATS, rtol=4, label="rows, no keepdims")]
    if name in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1"):
        CASES[name].append(Case(lambda t, r: [rand(r, (2, 0, 3), t), i64(2)], label="zero-sized, other axis"))
CASES["ReduceProd"][3].make = lambda t, r: [rand(r, (3, 1000), t, 0.999, 1.001), i64(1)]
# A row of -inf (a fully masked attention row) has max -inf, not the lowest finite value.
for name, fill in [("ReduceMax", -np.inf), ("ReduceMin", np.inf)]:
    CASES[name].append(Case(lambda t, r, fill=fill: [np.array([[fill, fill], [1.0, fill]], NP[t]), i64(1)],
                            label="rows of infinities", types=FLOATS))
for name in ["ArgMax", "ArgMin"]:
    CASES[name] = [Case(lambda t, r: [r.permutation(24).reshape(2, 3, 4).astype(NP[t]) % 7], attrs={"axis": a,
                        "keepdims": k, "select_last_index": s}, label=f"axis {a} keepdims {k} last {s}")
                   for a in (1, -1) for k in (0, 1) for s in (0, 1)]

# Softmax family and normalization.
for name in ["Softmax", "LogSoftmax", "Hardmax"]:
    CASES[name] = [Case(lambda t, r: [rand(r, (2, 3, 5), t, -5, 5)], attrs={"axis": a}, label=f"axis {a}")
                   for a in (-1, 1)]
    CASES[name].append(Case(lambda t, r: [rand(r, (3, 1001), t, -5, 5)], label="long rows"))
    CASES[name].append(Case(lambda t, r: [rand(r, (0, 5), t)], label="zero rows"))
CASES["Softmax"].append(Case(lambda t, r: [np.array([[0, -np.inf, 1], [np.nan, 0, 1]], NP[t])], label="-Inf and NaN",
                             types=FLOATS))
CASES["LayerNormalization"] = [
    Case(lambda t, r: [rand(r, (2, 3, 8), t), rand(r, (8,), t), rand(r, (8,), t)], attrs={"epsilon": 1e-5},
         label="last axis", rtol=5),
    Case(lambda t, r: [rand(r, (2, 3, 4), t), rand(r, (3, 4), t)], attrs={"axis": 1}, label="axis 1, no bias",
         rtol=5),
    Case(lambda t, r: [rand(r, (2, 8), t), rand(r, (8,), t), rand(r, (8,), t)], outputs=3, label="statistics",
         types=["f32", "f64"], rtol=5)]
def rms_norm_ref(ins, attrs, t):
    x, scale = f64(ins[0]), f64(ins[1])
    axes = tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim))
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + attrs.get("epsilon", 1e-5)) * scale
    return [y.astype(ins[0].dtype)]


CASES["RMSNormalization"] = [
    Case(lambda t, r: [rand(r, (2, 3, 8), t), rand(r, (8,), t)], attrs={"epsilon": 1e-5}, ref=rms_norm_ref,
         label="last axis", rtol=5),
    Case(lambda t, r: [rand(r, (2, 3, 4), t), rand(r, (3, 4), t)], attrs={"axis": 1}, ref=rms_norm_ref,
         label="axis 1", rtol=5),
    Case(lambda t, r: [rand(r, (2, 3, 4), t), rand(r, (1, 4), t)], attrs={"axis": 1}, ref=rms_norm_ref,
         label="broadcast scale", rtol=5)]
CASES["BatchNormalization"] = [Case(lambda t, r: [rand(r, (2, 3, 4, 2), t), rand(r, (3,), t), rand(r, (3,), t),
                                                  rand(r, (3,), t), rand(r, (3,), t, 0.5, 2)],
                                    attrs={"epsilon": 2.0 ** -10})]  # exact in f32, as ONNX attributes are
CASES["InstanceNormalization"] = [Case(lambda t, r: [rand(r, (2, 3, 5), t), rand(r, (3,), t), rand(r, (3,), t)],
                                       rtol=5)]
# onnx.reference's L1 norm sums signed values; the norm is of absolute values.
CASES["LpNormalization"] = [Case(lambda t, r: [rand(r, (3, 4), t)], attrs={"axis": a, "p": p}, label=f"axis {a} p {p}",
                                 ref=numpy_ref(lambda x, axis, p: x / (np.abs(x) ** p).sum(axis, keepdims=True) **
                                               (1 / p))) for a in (-1, 0) for p in (1, 2)]
def mvn64(x, axes=(0, 2, 3)):
    d = x - x.mean(tuple(axes), keepdims=True)
    return d / (np.sqrt((d * d).mean(tuple(axes), keepdims=True)) + 1e-9)


# onnx.reference's MVN adds an f32 epsilon to f64 values and refuses.
CASES["MeanVarianceNormalization"] = [Case(lambda t, r: [rand(r, (2, 3, 4, 2), t)], rtol=5, ref=numpy_ref(mvn64)),
                                      Case(lambda t, r: [rand(r, (2, 3, 4), t)], attrs={"axes": [2]}, rtol=5,
                                           label="axes [2]", ref=numpy_ref(mvn64))]

# Convolution and pooling (NCHW).
CONV = [("plain", (1, 3, 7, 6), (4, 3, 3, 3), {"kernel_shape": [3, 3]}),
        ("strides, pads, dilations", (2, 4, 9, 8), (6, 4, 3, 2),
         {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
        ("groups", (1, 4, 5, 5), (6, 2, 3, 3), {"kernel_shape": [3, 3], "group": 2, "pads": [1, 1, 1, 1]}),
        ("depthwise", (1, 4, 6, 6), (4, 1, 3, 3), {"kernel_shape": [3, 3], "group": 4, "auto_pad": "SAME_UPPER"}),
        ("1-D", (2, 3, 10), (2, 3, 4), {"kernel_shape": [4], "strides": [3]}),
        # f32 2-D convs are implicit GEMMs (conv_implicit.cc): strided ones
        # over phase planes, deep ones over several K blocks and row tiles.
        ("stride 2x3, dilation 3x2, uneven pads", (2, 20, 23, 19), (26, 20, 3, 3),
         {"kernel_shape": [3, 3], "strides": [2, 3], "pads": [2, 1, 0, 3], "dilations": [3, 2]}),
        ("k past one GEMM block, row tiles", (3, 40, 30, 11), (30, 40, 3, 3),
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ("1x1 stride 2", (2, 8, 9, 9), (5, 8, 1, 1), {"kernel_shape": [1, 1], "strides": [2, 2]}),
        ("1x1 in place, groups", (2, 16, 7, 9), (20, 8, 1, 1), {"kernel_shape": [1, 1], "group": 2})]
CASES["Conv"] = [Case(lambda t, r, x=x, w=w: [rand(r, x, t), rand(r, w, t), rand(r, (w[0],), t)], attrs=a, label=l,
                      rtol=5) for l, x, w, a in CONV]
CASES["Conv"].append(Case(lambda t, r: [rand(r, (1, 3, 5, 5), t), rand(r, (2, 3, 1, 1), t)],
                          attrs={"kernel_shape": [1, 1]}, label="1x1, no bias"))


def fused_conv_ref(ins, attrs, t):
    conv_attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
    y = onnx_reference("Conv", Case(None, attrs=conv_attrs), ins[:3], [ins[0]])[0].astype(np.float64)
    if len(ins) > 3 and ins[3] is not None:
        y = y + ins[3]
    act = attrs.get("activation", "")
    alpha, beta = attrs.get("activation_alpha"), attrs.get("activation_beta")
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "Clip":
        y = np.minimum(np.maximum(y, alpha), beta)
    elif act == "HardSwish":
        y = y * np.clip(y / 6 + 0.5, 0, 1)
    elif act == "HardSigmoid":
        y = np.clip(alpha * y + beta, 0, 1)
    elif act == "LeakyRelu":
        y = np.where(y >= 0, y, alpha * y)
    return [y.astype(ins[0].dtype)]


# Every epilogue activation, on a depthwise, a pointwise (written in place)
# and a 3x3 conv (copied out of the GEMM's grid), with bias and residual.
FUSED_ACTS = [("Clip", {"activation_alpha": -0.5, "activation_beta": 0.7}), ("HardSwish", {}),
              ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
              ("LeakyRelu", {"activation_alpha": 0.1})]
FUSED_SHAPES = [("depthwise", (1, 5, 7, 6), (5, 1, 3, 3), {"kernel_shape": [3, 3], "group": 5, "pads": [1, 1, 1, 1]}),
                ("1x1", (2, 6, 5, 4), (7, 6, 1, 1), {"kernel_shape": [1, 1]}),
                ("3x3 stride 2", (1, 6, 9, 9), (7, 6, 3, 3), {"kernel_shape": [3, 3], "strides": [2, 2],
                                                              "pads": [1, 1, 1, 1]})]


def conv_out_shape(x, w, a):
    p, s = a.get("pads", [0, 0, 0, 0]), a.get("strides", [1, 1])
    return (x[0], w[0]) + tuple((x[2 + i] + p[i] + p[2 + i] - w[2 + i]) // s[i] + 1 for i in range(2))


CASES["FusedConv"] = [
    Case(lambda t, r, x=x, w=w, a=a: [rand(r, x, t), rand(r, w, t), rand(r, (w[0],), t),
                                      rand(r, conv_out_shape(x, w, a), t)],
         attrs=dict(a, activation=act, **aa), ref=fused_conv_ref, label=f"{sl}, bias + residual + {act}", rtol=5)
    for sl, x, w, a in FUSED_SHAPES for act, aa in FUSED_ACTS] + [
    Case(lambda t, r: [rand(r, (1, 3, 6, 6), t), rand(r, (4, 3, 3, 3), t), rand(r, (4,), t)],
         attrs={"kernel_shape": [3, 3], "activation": "Relu"}, ref=fused_conv_ref, label="bias + Relu", rtol=5),
    Case(lambda t, r: [rand(r, (1, 3, 6, 6), t), rand(r, (4, 3, 3, 3), t), rand(r, (4,), t), rand(r, (1, 4, 4, 4), t)],
         attrs={"kernel_shape": [3, 3], "activation": "Relu"}, ref=fused_conv_ref, label="residual + Relu", rtol=5)]


def nan_inf_at_start(x):
    x = np.array(x)
    x.flat[[0, 5]] = [np.nan, np.inf]
    return x


# A NaN and an Inf through each fused activation: the bits of the unfused ops
# (HardSigmoid's epilogue once made 1 of a NaN where the op keeps it NaN).
CASES["FusedConv"] += [
    Case(lambda t, r, x=x, w=w, a=a: [nan_inf_at_start(rand(r, x, t)), rand(r, w, t), rand(r, (w[0],), t)],
         attrs=dict(a, activation=act, **aa), ref=fused_conv_ref, label=f"{sl}, NaN and Inf + {act}", rtol=5)
    for sl, x, w, a in FUSED_SHAPES[:2] for act, aa in FUSED_ACTS + [("Relu", {})]]
CASES["ConvTranspose"] = [
    Case(lambda t, r: [rand(r, (1, 3, 4, 4), t), rand(r, (3, 2, 3, 3), t), rand(r, (2,), t)],
         attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, rtol=5),
    Case(lambda t, r: [rand(r, (1, 4, 3, 3), t), rand(r, (4, 1, 2, 2), t)], attrs={"kernel_shape": [2, 2], "group": 2},
         label="groups", rtol=5, ref=lambda ins, a, t: [__import__("torch").nn.functional.conv_transpose2d(
             *[__import__("torch").tensor(f64(x)) for x in ins], groups=2).numpy().astype(ins[0].dtype)])]
POOL = [("plain", (1, 2, 6, 7), {"kernel_shape": [3, 3]}),
        ("strides, pads", (2, 3, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
        ("ceil mode", (1, 2, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        ("1-D", (2, 3, 9), {"kernel_shape": [3], "strides": [2]})]
CASES["MaxPool"] = [Case(lambda t, r, x=x: [rand(r, x, t, -9, 9)], attrs=a, label=l, ref_via_f64=True)
                    for l, x, a in POOL]
CASES["MaxPool"].append(Case(lambda t, r: [rand(r, (1, 2, 6, 6), t)], attrs={"kernel_shape": [2, 2], "dilations": [2, 2]},
                             label="dilations", ref_via_f64=True))
CASES["AveragePool"] = [Case(lambda t, r, x=x: [rand(r, x, t)], attrs=a, label=l) for l, x, a in POOL]
CASES["AveragePool"].append(Case(lambda t, r: [rand(r, (1, 2, 5, 5), t)], label="count_include_pad",
                                 attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}))
CASES["LpPool"] = [Case(lambda t, r: [rand(r, (1, 2, 5, 6), t)], attrs={"kernel_shape": [2, 3], "p": p}, label=f"p {p}")
                   for p in (1, 2, 3)]
GLOBAL_POOL = {"GlobalMaxPool": lambda x: x.max(tuple(range(2, x.ndim)), keepdims=True),
               "GlobalAveragePool": lambda x: x.mean(tuple(range(2, x.ndim)), keepdims=True),
               "GlobalLpPool": lambda x, p=2: (np.abs(x) ** p).sum(tuple(range(2, x.ndim)), keepdims=True) ** (1 / p)}
# onnx.reference has no GlobalLpPool and drops the spatial dim of 1-D GlobalMaxPool.
for name, fn in GLOBAL_POOL.items():
    CASES[name] = [Case(lambda t, r: [rand(r, (2, 3, 4, 5), t)], ref=numpy_ref(fn), label="2-D"),
                   Case(lambda t, r: [rand(r, (1, 2, 7), t)], label="1-D", ref=numpy_ref(fn))]
CASES["GlobalLpPool"].append(Case(lambda t, r: [rand(r, (1, 2, 3, 3), t)], attrs={"p": 3}, label="p 3",
                                  ref=numpy_ref(GLOBAL_POOL["GlobalLpPool"])))

# Losses (reductions as the training recipes use them).
CASES["NegativeLogLikelihoodLoss"] = [
    Case(lambda t, r: [rand(r, (4, 5), t, -3, 0), np.array([1, 0, 4, 2], np.int64)], attrs={"reduction": red},
         label=red) for red in ("mean", "sum", "none")]
CASES["NegativeLogLikelihoodLoss"].append(
    Case(lambda t, r: [rand(r, (2, 5, 3), t, -3, 0), np.array([[1, -100, 4], [0, 2, -100]], np.int64)],
         attrs={"ignore_index": -100}, label="ignore_index, [N, C, d]"))
CASES["SoftmaxCrossEntropyLoss"] = [
    Case(lambda t, r: [rand(r, (4, 5), t, -3, 3), np.array([1, 0, 4, 2], np.int64)], attrs={"reduction": red},
         label=red, rtol=5) for red in ("mean", "sum", "none")]
CASES["SoftmaxCrossEntropyLoss"].append(
    Case(lambda t, r: [rand(r, (2, 5, 3), t, -3, 3), np.array([[1, -1, 4], [0, 2, -1]], np.int64)],
         attrs={"ignore_index": -1}, label="ignore_index, [N, C, d]", rtol=5))

# Quantization.
CASES["QuantizeLinear"] = [
    Case(lambda t, r: [rand(r, (3, 4), t, -300, 300), np.array(2.5, NP[t]), np.array(3, NP[q])], label=f"to {q}",
         types=["f32"] if t_only else None)
    for q, t_only in (("u8", False), ("i8", False))]
CASES["QuantizeLinear"].append(Case(lambda t, r: [rand(r, (2, 3), t, -10, 10), np.array([0.5, 1.0, 2.0], NP[t]),
                                                  np.array([0, 1, 2], np.uint8)], attrs={"axis": 1},
                                    label="per axis"))
CASES["DequantizeLinear"] = [
    Case(lambda t, r: [rand(r, (3, 4), t, -100, 200), np.array(0.5, np.float32), np.array(3, NP[t])],
         label="zero point", types=["i8", "u8", "i32"], opset=19),
    Case(lambda t, r: [rand(r, (2, 3), t, -100, 100), np.array([0.5, 1.0, 2.0], np.float32)], attrs={"axis": 1},
         label="per axis", opset=19)]
# Blocked (opset 21): the scale and zero point have x's shape with `axis` in blocks of block_size.
CASES["QuantizeLinear"].append(Case(lambda t, r: [rand(r, (2, 5, 3), t, -10, 10), rand(r, (2, 3, 3), t, 0.5, 2),
                                                  rand(r, (2, 3, 3), "i8", -3, 3)],
                                    attrs={"axis": 1, "block_size": 2}, types=["f32"], opset=21, label="blocked"))
CASES["DequantizeLinear"].append(Case(lambda t, r: [rand(r, (4, 6), t, -100, 100), rand(r, (4, 2), "f32", 0.1, 2),
                                                    rand(r, (4, 2), t, -5, 5)],
                                      attrs={"axis": 1, "block_size": 3}, types=["i8", "u8"], opset=21,
                                      label="blocked"))
CASES["DynamicQuantizeLinear"] = [Case(lambda t, r: [rand(r, (3, 5), t, -4, 6)], outputs=3),
                                  Case(lambda t, r: [rand(r, (4,), t, 1, 6)], outputs=3, label="all positive")]
CASES["MatMulInteger"] = [
    Case(lambda t, r: [rand(r, (2, 3, 4), t, -50, 100), rand(r, (4, 5), t, -50, 100), np.array(3, NP[t]),
                       np.array(1, NP[t])], label="zero points"),
    Case(lambda t, r: [rand(r, (3, 4), t, -50, 100), rand(r, (4, 2), t, -50, 100)], label="none")]
CASES["QLinearMatMul"] = [Case(lambda t, r: [rand(r, (3, 4), t, 0, 100), np.array(0.05, np.float32),
                                             np.array(2, NP[t]), rand(r, (4, 5), t, 0, 100),
                                             np.array(0.02, np.float32), np.array(1, NP[t]),
                                             np.array(0.1, np.float32), np.array(4, NP[t])])]


def nbits_inputs(r, t, rows, K, N, bits, block, zeros, bias):
    """MatMulNBits's operands: A [rows, K], B packed [N, blocks, block * bits / 8] (low bits first), scales [N,
    blocks], zero points (None, packed u8 or f32) and bias."""
    blocks, per = -(-K // block), 8 // bits
    codes = r.integers(0, 1 << bits, (N, blocks * block)).astype(np.uint16)
    packed = sum(codes.reshape(N, -1, per)[:, :, i] << (i * bits) for i in range(per)).astype(np.uint8)
    zp = None
    if zeros == "packed":
        z = r.integers(0, 1 << bits, (N, blocks + -blocks % per)).astype(np.uint16)
        zp = sum(z.reshape(N, -1, per)[:, :, i] << (i * bits) for i in range(per)).astype(np.uint8)
    elif zeros == "float":
        zp = r.uniform(0, (1 << bits) - 1, (N, blocks)).astype(np.float32)
    return [rand(r, (rows, K), t), packed.reshape(N, blocks, -1), r.uniform(0.01, 0.1, (N, blocks)).astype(np.float32),
            zp, rand(r, (N,), t) if bias else None]


def nbits_ref(ins, attrs, t):
    """y = a W^T + bias with W[n, k] = (code - zero point) * scale of k's block, in float64."""
    a, b, scales, zp, bias = ins
    K, N, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    blocks, per = -(-K // block), 8 // bits
    codes = np.stack([(b.reshape(N, -1) >> (i * bits)) & ((1 << bits) - 1) for i in range(per)], axis=2).reshape(N, -1)
    if zp is None:
        z = np.full((N, blocks), 1 << (bits - 1), np.float64)
    elif zp.dtype == np.uint8:
        z = np.stack([(zp.reshape(N, -1) >> (i * bits)) & ((1 << bits) - 1) for i in range(per)], axis=2)
        z = z.reshape(N, -1)[:, :blocks].astype(np.float64)
    else:
        z = zp.astype(np.float64)
    w = ((codes.reshape(N, blocks, block) - z[:, :, None]) * scales.astype(np.float64)[:, :, None])
    y = a.astype(np.float64) @ w.reshape(N, -1)[:, :K].T + (0 if bias is None else bias.astype(np.float64))
    return [y.astype(np.float32)]


CASES["MatMulNBits"] = [
    Case(lambda t, r: nbits_inputs(r, t, 3, 72, 24, 4, 32, "packed", True), ref=nbits_ref, label="4 bits, K tail",
         attrs={"K": 72, "N": 24, "bits": 4, "block_size": 32}),
    Case(lambda t, r: nbits_inputs(r, t, 12, 64, 16, 2, 16, None, False), ref=nbits_ref, label="2 bits, many rows",
         attrs={"K": 64, "N": 16, "bits": 2, "block_size": 16}),
    Case(lambda t, r: nbits_inputs(r, t, 1, 64, 8, 8, 64, "float", True), ref=nbits_ref, label="8 bits, float zeros",
         attrs={"K": 64, "N": 8, "bits": 8, "block_size": 64}),
    Case(lambda t, r: nbits_inputs(r, t, 2, 64, 8, 4, 32, None, False)[:3] + [None, None], ref=nbits_ref,
         attrs={"K": 60, "N": 8, "bits": 4, "block_size": 32}, label="A not K wide", error="does not end in K")]
CASES["ConvInteger"] = [Case(lambda t, r: [rand(r, (1, 2, 5, 5), t, 0, 50), rand(r, (3, 2, 3, 3), t, 0, 20),
                                           np.array(2, NP[t])], attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})]
CASES["QLinearConv"] = [Case(lambda t, r: [rand(r, (1, 2, 5, 5), t, 0, 100), np.array(0.05, np.float32),
                                           np.array(3, NP[t]), rand(r, (3, 2, 3, 3), t, 0, 50),
                                           np.array(0.02, np.float32), np.array(2, NP[t]),
                                           np.array(0.2, np.float32), np.array(5, NP[t]),
                                           np.array([10, -20, 30], np.int32)], attrs={"kernel_shape": [3, 3]})]

# Resize.
CASES["Resize"] = [
    Case(lambda t, r: [rand(r, (1, 2, 3, 4), t), None, np.array([1, 1, 2, 1.5], np.float32)],
         attrs={"mode": "nearest"}, label="nearest, scales"),
    Case(lambda t, r: [rand(r, (1, 2, 3, 4), t), None, None, i64(1, 2, 5, 7)],
         attrs={"mode": "linear"}, label="linear, sizes"),
    Case(lambda t, r: [rand(r, (1, 1, 4, 4), t), None, np.array([1, 1, 0.5, 0.75], np.float32)],
         attrs={"mode": "linear", "coordinate_transformation_mode": "align_corners"}, label="linear align_corners"),
    Case(lambda t, r: [rand(r, (1, 1, 3, 3), t), None, np.array([1, 1, 2, 2], np.float32)],
         attrs={"mode": "cubic"}, label="cubic", rtol=5)] + [
    Case(lambda t, r, sc=sc: [rand(r, (1, 2, 9, 7), t), None, np.array([1, 1, sc, 0.45], np.float32)],
         attrs={"mode": m, "antialias": 1, "exclude_outside": ex}, label=f"{m} antialias x{sc}, exclude {ex}{note}",
         rtol=rtol, opset=19, types=types)
    # onnx.reference evaluates the antialiased cubic filter in f32 (a float32
    # scale times the taps): sdc's f64 result is held to f32's tolerance there.
    for m, sc, ex, types, rtol, note in (
        ("linear", 0.6, 0, None, 5, ""), ("linear", 1.5, 0, None, 5, ""), ("linear", 0.5, 1, None, 5, ""),
        ("cubic", 0.35, 1, ["f32", "f16", "bf16"], 5, ""), ("cubic", 0.35, 1, ["f64"], 2e5, " (f64 vs the f32 reference)"))]


# ---- sdc's own contracts: references in float64 (PyTorch autograd for the backward ops) -------------------------

def torch_vjp(fn, primals, cotangent, wrt):
    """Gradients of sum(fn(*primals) * cotangent) with respect to primals[wrt]."""
    import torch
    ps = [torch.tensor(np.asarray(p, np.float64), requires_grad=i in wrt) if p is not None else None
          for i, p in enumerate(primals)]
    y = fn(*ps)
    (y * torch.tensor(np.asarray(cotangent, np.float64))).sum().backward()
    return [ps[i].grad.numpy() for i in wrt]


def as_type(arrays, like):
    return [np.asarray(a).astype(like.dtype) for a in arrays]


def f64(x):
    return np.asarray(x, np.float64)


def softmax64(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


CASES["GeluGrad"] = [Case(lambda t, r: [rand(r, (3, 7), t), rand(r, (3, 7), t, -4, 4)], attrs={"approximate": a},
                          label=a, ref=lambda ins, at, t: as_type(torch_vjp(
                              lambda x: __import__("torch").nn.functional.gelu(x, approximate=at.get("approximate",
                                                                                                      "none")),
                              [ins[1]], ins[0], [0]), ins[0])) for a in ("none", "tanh")]


# GEMM epilogues (sd-fuse-gemm-epilogues). GELU and its derivative in f64.
GELU_K = np.sqrt(2 / np.pi)


def gelu64(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def gelu_grad64(x, approximate):
    if approximate == "tanh":
        t = np.tanh(GELU_K * (x + 0.044715 * x ** 3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * 0.044715 * x * x)
    return 0.5 * (1 + np.vectorize(math.erf)(x / np.sqrt(2))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


def linear_gelu_ref(ins, attrs, t, keep_pre):
    pre = f64(linear_ref([f64(x) if x is not None else None for x in ins[:3]], attrs, t)[0])
    if len(ins) > 3 and ins[3] is not None:  # the addend, summed before the GELU
        pre = pre + f64(ins[3])
    out = [gelu64(pre, attrs.get("approximate", "none"))] + ([pre] if keep_pre else [])
    return [o.astype(ins[0].dtype) for o in out]


def gemm_dgelu_ref(ins, attrs, t, bias_grad):
    a, b, pre = f64(ins[0]), f64(ins[1]), f64(ins[2])
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    product = a @ b + (f64(ins[3]) if len(ins) > 3 else 0)  # c, summed before the GELU's gradient
    grad = product * gelu_grad64(pre, attrs.get("approximate", "none"))
    out = [grad] + ([grad.sum(axis=0)] if bias_grad else [])
    return [o.astype(ins[0].dtype) for o in out]


# Shapes with n a multiple of 8 take cuBLASLt's epilogue for the tanh form; the
# erf form and other n run the parts (GEMM, then the GELU kernels).
CASES["LinearGelu"] = [
    Case(lambda t, r: [rand(r, (2, 3, 4), t, -2, 2), rand(r, (16, 4), t, -1, 1), rand(r, (16,), t)],
         attrs={"layout": "oi", "approximate": "tanh"}, outputs=2,
         ref=lambda ins, at, t: linear_gelu_ref(ins, at, t, True), label="tanh, bias, keeps the product"),
    Case(lambda t, r: [rand(r, (5, 4), t, -2, 2), rand(r, (4, 8), t, -1, 1)], attrs={"approximate": "tanh"},
         ref=lambda ins, at, t: linear_gelu_ref(ins, at, t, False), label="tanh, no bias, inference"),
    Case(lambda t, r: [rand(r, (6, 4), t, -2, 2), rand(r, (8, 4), t, -1, 1), rand(r, (8,), t)],
         attrs={"layout": "oi"}, outputs=2, ref=lambda ins, at, t: linear_gelu_ref(ins, at, t, True),
         label="erf (the parts)"),
    Case(lambda t, r: [rand(r, (3, 4), t, -2, 2), rand(r, (5, 4), t, -1, 1), rand(r, (5,), t)],
         attrs={"layout": "oi", "approximate": "tanh"}, outputs=2,
         ref=lambda ins, at, t: linear_gelu_ref(ins, at, t, True), label="n = 5 (the parts)"),
    # An addend (sd-accumulate-into-gemm's LinearAdd): cuBLASLt's C, beta 1, before the GELU.
    Case(lambda t, r: [rand(r, (2, 3, 4), t, -2, 2), rand(r, (16, 4), t, -1, 1), rand(r, (16,), t),
                       rand(r, (2, 3, 16), t, -1, 1)], attrs={"layout": "oi", "approximate": "tanh"}, outputs=2,
         ref=lambda ins, at, t: linear_gelu_ref(ins, at, t, True), label="tanh, bias, addend"),
    Case(lambda t, r: [rand(r, (5, 4), t, -2, 2), rand(r, (4, 8), t, -1, 1), None, rand(r, (5, 8), t, -1, 1)],
         ref=lambda ins, at, t: linear_gelu_ref(ins, at, t, False), label="erf, addend, inference (the parts)"),
    Case(lambda t, r: [rand(r, (5, 4), t), rand(r, (8, 4), t), None, rand(r, (5, 4), t)], attrs={"layout": "oi"},
         types=["f32"], error="does not match the product", label="addend of another shape")]
CASES["GemmDGelu"] = [
    Case(lambda t, r: [rand(r, (6, 5), t, -1, 1), rand(r, (16, 5), t, -1, 1), rand(r, (6, 16), t, -3, 3)],
         attrs={"transB": 1, "approximate": "tanh"}, outputs=2,
         ref=lambda ins, at, t: gemm_dgelu_ref(ins, at, t, True), label="tanh, bias gradient"),
    Case(lambda t, r: [rand(r, (5, 6), t, -1, 1), rand(r, (5, 8), t, -1, 1), rand(r, (6, 8), t, -3, 3)],
         attrs={"transA": 1, "approximate": "tanh"}, ref=lambda ins, at, t: gemm_dgelu_ref(ins, at, t, False),
         label="tanh, transA, no bias gradient"),
    Case(lambda t, r: [rand(r, (6, 5), t, -1, 1), rand(r, (8, 5), t, -1, 1), rand(r, (6, 8), t, -3, 3)],
         attrs={"transB": 1}, outputs=2, ref=lambda ins, at, t: gemm_dgelu_ref(ins, at, t, True),
         label="erf (the parts)"),
    Case(lambda t, r: [rand(r, (4, 5), t, -1, 1), rand(r, (5, 7), t, -1, 1), rand(r, (4, 7), t, -3, 3)],
         attrs={"approximate": "tanh"}, outputs=2, ref=lambda ins, at, t: gemm_dgelu_ref(ins, at, t, True),
         label="n = 7 (the parts)"),
    # A C of the product's shape (the input gradient's other product): cuBLASLt's C, beta 1.
    Case(lambda t, r: [rand(r, (6, 5), t, -1, 1), rand(r, (16, 5), t, -1, 1), rand(r, (6, 16), t, -3, 3),
                       rand(r, (6, 16), t, -1, 1)], attrs={"transB": 1, "approximate": "tanh"}, outputs=2,
         ref=lambda ins, at, t: gemm_dgelu_ref(ins, at, t, True), label="tanh, c, bias gradient"),
    Case(lambda t, r: [rand(r, (5, 6), t, -1, 1), rand(r, (5, 8), t, -1, 1), rand(r, (6, 8), t, -3, 3),
                       rand(r, (6, 8), t, -1, 1)], attrs={"transA": 1},
         ref=lambda ins, at, t: gemm_dgelu_ref(ins, at, t, False), label="erf, c (the parts)"),
    Case(lambda t, r: [rand(r, (6, 5), t), rand(r, (8, 5), t), rand(r, (6, 8), t), rand(r, (8,), t)],
         attrs={"transB": 1}, types=["f32"], error="does not match the product", label="c of another shape")]


def fused_elementwise_ref(ins, attrs, t):
    """The program run in f32, one IEEE operation at a time (as the fused kernels must)."""
    values = [np.asarray(x, np.float32) for x in ins]
    p = attrs["program"]
    ops = {0: np.add, 1: np.subtract, 2: np.multiply, 3: np.divide, 4: lambda a, b: np.negative(a),
           5: lambda a, b: np.where(a < 0, np.float32(0), a), 6: lambda a, b: 1 / (1 + np.exp(-f64(a))),
           7: lambda a, b: np.tanh(f64(a)), 8: lambda a, b: np.exp(f64(a)),
           9: lambda a, b: gelu64(f64(a), "none"), 10: lambda a, b: gelu64(f64(a), "tanh"),
           11: lambda a, b: f64(a) * gelu_grad64(f64(b), "none"), 12: lambda a, b: f64(a) * gelu_grad64(f64(b), "tanh"),
           13: lambda a, b: np.where(b > 0, a, np.float32(0))}
    for i in range(0, len(p), 3):
        a, b = values[p[i + 1]], values[p[i + 2]]
        with np.errstate(all="ignore"):
            values.append(np.asarray(ops[p[i]](a, b)).astype(np.float32))
    out = np.broadcast_to(values[-1], max((np.shape(x) for x in ins), key=np.size)).astype(np.float32)
    to = {16: ml_dtypes.bfloat16, 10: np.float16}.get(attrs.get("to", 1), np.float32)
    return [out.astype(to)]  # a half result rounded to nearest even, as Cast rounds


# Arithmetic is exact: compared bit for bit (rtol 0), NaN and Inf included.
CASES["FusedElementwise"] = [
    Case(lambda t, r: [rand(r, (3, 5), t, -2, 2), np.array(0.25, np.float32), rand(r, (3, 5), t, -2, 2)],
         attrs={"program": [2, 0, 1, 0, 2, 3]}, ref=fused_elementwise_ref, rtol=0, label="scale and add (LoRA)"),
    Case(lambda t, r: [rand(r, (2, 3, 4), t, 0.5, 2), rand(r, (2, 3, 4), t, -2, 2)],
         attrs={"program": [0, 0, 1, 2, 2, 2, 4, 3, 3, 3, 4, 0, 1, 5, 1]}, ref=fused_elementwise_ref, rtol=0,
         label="add, square, negate, divide, subtract"),
    Case(lambda t, r: [np.array([1.0, -0.0, np.inf, np.nan, 3.0], np.float32), np.array([0.0, 0.0, 1.0, 2.0, -np.inf],
                                                                                         np.float32)],
         attrs={"program": [3, 0, 1, 2, 2, 0]}, ref=fused_elementwise_ref, rtol=0, label="NaN, Inf, signed zero"),
    Case(lambda t, r: [np.array(2.0, np.float32), np.array(3.0, np.float32)], attrs={"program": [2, 0, 1, 0, 2, 0]},
         ref=fused_elementwise_ref, rtol=0, label="scalars only"),
    # Autocast chains: half operands and a half result (the casts around the chain).
    Case(lambda t, r: [rand(r, (3, 5), t, -2, 2), np.array(0.25, np.float32), rand(r, (3, 5), "f32", -2, 2)],
         attrs={"program": [2, 0, 1, 0, 2, 3], "to": 16}, ref=fused_elementwise_ref, rtol=0, types=["bf16"],
         label="bf16 in, bf16 out"),
    Case(lambda t, r: [rand(r, (2, 7), t, -2, 2), rand(r, (2, 7), t, -2, 2)],
         attrs={"program": [0, 0, 1, 3, 2, 0], "to": 10}, ref=fused_elementwise_ref, rtol=0, types=["f16"],
         label="f16 in, f16 out"),
    # Activations (approximations of the reference's f64 math: a tolerance).
    Case(lambda t, r: [rand(r, (3, 6), t, -3, 3), rand(r, (3, 6), t, -3, 3)],
         attrs={"program": [0, 0, 1, 10, 2, 2, 9, 0, 0, 0, 3, 4, 5, 5, 5, 6, 1, 1, 2, 6, 7]},
         ref=fused_elementwise_ref, label="add, gelu tanh and erf, relu, sigmoid, multiply"),
    Case(lambda t, r: [rand(r, (2, 9), t, -2, 2), rand(r, (2, 9), t, -3, 3)],
         attrs={"program": [11, 0, 1, 12, 0, 1, 7, 2, 2, 8, 3, 3, 0, 4, 5]}, ref=fused_elementwise_ref,
         label="gelu gradients, tanh, exp"),
    # Programs the CUDA kernel has compiled in (transformer steps'), on 37
    # elements: 9 vector packs and one left over, which the interpreter runs.
    Case(lambda t, r: [rand(r, (37,), t, -2, 2), rand(r, (37,), t, -2, 2), rand(r, (37,), t, -3, 3)],
         attrs={"program": [0, 0, 1, 12, 3, 2]}, ref=fused_elementwise_ref, label="add, tanh GELU gradient (compiled in)"),
    Case(lambda t, r: [rand(r, (37,), t, -2, 2), rand(r, (37,), t, -2, 2), np.array(2.0, np.float32),
                       rand(r, (37,), "f32", -2, 2)],
         attrs={"program": [2, 1, 2, 0, 0, 4, 0, 3, 5]}, ref=fused_elementwise_ref, rtol=0,
         label="base + LoRA * scale + residual (compiled in)"),
    Case(lambda t, r: [rand(r, (37,), t, -3, 3)], attrs={"program": [10, 0, 0], "to": 16}, ref=fused_elementwise_ref,
         types=["bf16"], label="tanh GELU to bf16 (compiled in)"),
    # LoRA's sum computed again by the GELU's gradient (bf16 products, the two gradients summed first).
    Case(lambda t, r: [rand(r, (37,), t, -2, 2), rand(r, (37,), t, -2, 2), np.array(2.0, np.float32),
                       rand(r, (37,), t, -2, 2), rand(r, (37,), t, -2, 2)],
         attrs={"program": [2, 1, 2, 0, 0, 5, 0, 3, 4, 12, 7, 6], "to": 16}, ref=fused_elementwise_ref,
         types=["bf16"], label="base + LoRA * scale, tanh GELU gradient of a sum (compiled in)"),
    Case(lambda t, r: [rand(r, (4,), t)], attrs={"program": [0, 0, 7]}, error="reads value 7", label="bad program"),
    # Relu's gradient after a sum of two gradients: dy where x > 0, +0 elsewhere (NaN x: 0; NaN dy passes).
    Case(lambda t, r: [np.array([1.0, -2.0, np.nan, 3.0, 0.5, -0.0, 7.0], np.float32),
                       np.array([0.5, 0.25, 1.0, np.nan, -1.0, 2.0, np.inf], np.float32),
                       np.array([1.0, 2.0, -0.0, 0.0, np.nan, -0.0, 1.0], np.float32)],
         attrs={"program": [0, 0, 1, 13, 3, 2]}, ref=fused_elementwise_ref, rtol=0, label="sum, then ReLU's gradient"),
    Case(lambda t, r: [rand(r, (4,), t)], attrs={"program": [14, 0, 0]}, error="opcode 14", label="bad opcode")]


def softmax_grad_ref(ins, attrs, t, log=False):
    dy, y = f64(ins[0]), f64(ins[1])
    axis = attrs.get("axis", -1)
    dx = dy - np.exp(y) * dy.sum(axis=axis, keepdims=True) if log else y * (dy - (dy * y).sum(axis=axis,
                                                                                            keepdims=True))
    return [dx.astype(ins[0].dtype)]


for name, log in (("SoftmaxGrad", False), ("LogSoftmaxGrad", True)):
    fwd = (lambda x, a: np.log(softmax64(x, a))) if log else softmax64
    CASES[name] = [Case(lambda t, r, fwd=fwd, a=a: [rand(r, (2, 3, 5), t), fwd(f64(rand(r, (2, 3, 5), t, -3, 3)), a)
                                                    .astype(NP[t])], attrs={"axis": a}, label=f"axis {a}",
                        ref=lambda ins, at, t, log=log: softmax_grad_ref(ins, at, t, log)) for a in (-1, 1)]


def layer_norm_grad_ref(ins, attrs, t):
    import torch
    dy, x, scale = ins
    axis = attrs.get("axis", -1) % x.ndim
    shape = x.shape[axis:]
    bias = np.zeros(shape)
    grads = torch_vjp(lambda x, s, b: torch.nn.functional.layer_norm(x, shape, s, b, attrs.get("epsilon", 1e-5)),
                      [x, scale, bias], dy, [0, 1, 2])
    return [g.astype(x.dtype) for g in grads]


CASES["LayerNormalizationGrad"] = [
    Case(lambda t, r: [rand(r, (2, 3, 8), t), rand(r, (2, 3, 8), t), rand(r, (8,), t)], outputs=3,
         ref=layer_norm_grad_ref, label="last axis", rtol=10),
    Case(lambda t, r: [rand(r, (2, 3, 4), t), rand(r, (2, 3, 4), t), rand(r, (3, 4), t)], outputs=3,
         attrs={"axis": 1, "epsilon": 1e-3}, ref=layer_norm_grad_ref, label="axis 1", rtol=10)]


def rms_norm_grad_ref(ins, attrs, t):
    import torch
    dy, x, scale = ins
    axes = tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim))
    eps = attrs.get("epsilon", 1e-5)
    grads = torch_vjp(lambda x, s: x / torch.sqrt((x * x).mean(dim=axes, keepdim=True) + eps) * s, [x, scale], dy,
                      [0, 1])
    return [g.astype(x.dtype) for g in grads]


CASES["RMSNormalizationGrad"] = [
    Case(lambda t, r: [rand(r, (2, 3, 8), t), rand(r, (2, 3, 8), t), rand(r, (8,), t)], outputs=2,
         ref=rms_norm_grad_ref, label="last axis", rtol=10),
    Case(lambda t, r: [rand(r, (2, 3, 4), t), rand(r, (2, 3, 4), t), rand(r, (3, 4), t)], outputs=2,
         attrs={"axis": 1, "epsilon": 1e-3}, ref=rms_norm_grad_ref, label="axis 1", rtol=10)]


# sd-half-elementwise's forms: an f32 x whose normalized result the kernel
# rounds to a half (out_type), and a half dy with f32 x and scale.
def layer_norm_ref(ins, attrs, t):
    x, scale = f64(ins[0]), f64(ins[1])
    axes = tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + attrs.get("epsilon", 1e-5)) * scale
    return [(y + (f64(ins[2]) if len(ins) > 2 else 0.0)).astype(ins[0].dtype)]


def rounded_to(ref):
    """The reference of an out_type step: the f32 result, rounded to the case's half type."""
    return lambda ins, attrs, t: [ref(ins, attrs, t)[0].astype(NP[t])]


for h in HALVES:
    out = {"out_type": ONNX_TYPE[h]}
    CASES["RMSNormalization"].append(
        Case(lambda t, r: [rand(r, (6, 40), "f32"), rand(r, (40,), "f32")], attrs={**out, "epsilon": 1e-5},
             ref=rounded_to(rms_norm_ref), types=[h], label=f"f32 x, {h} result"))
    CASES["LayerNormalization"].append(
        Case(lambda t, r: [rand(r, (6, 40), "f32"), rand(r, (40,), "f32"), rand(r, (40,), "f32")], attrs=out,
             ref=rounded_to(layer_norm_ref), types=[h], label=f"f32 x, {h} result"))
    CASES["RMSNormalizationGrad"].append(
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), "f32"), rand(r, (40,), "f32")], outputs=2,
             ref=rms_norm_grad_ref, types=[h], label=f"{h} dy, f32 x", rtol=10))
    CASES["LayerNormalizationGrad"].append(
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), "f32"), rand(r, (40,), "f32")], outputs=3,
             ref=layer_norm_grad_ref, types=[h], label=f"{h} dy, f32 x", rtol=10))
CASES["RMSNormalization"].append(
    Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (40,), t)], attrs={"out_type": 16}, ref=rms_norm_ref,
         types=["f16"], error="out_type", label="out_type of a half x"))


def plus_accumulate(ref):
    """A norm gradient's reference with dx added to its accumulate operand (sd-norm-grad-sum: dx rounded, then added)."""
    def wrapped(ins, attrs, t):
        outs = ref(ins[:3], attrs, t)
        return [(outs[0] + ins[3]).astype(ins[1].dtype)] + outs[1:]
    return wrapped


# The residual stream's gradient summed in by the norm's backward (f32 and f64;
# a half dy with it, as in autocast plans), and an accumulate of another type refused.
for name, ref, outs in (("LayerNormalizationGrad", layer_norm_grad_ref, 3), ("RMSNormalizationGrad", rms_norm_grad_ref, 2)):
    CASES[name] += [
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (40,), t), rand(r, (6, 40), t)],
             outputs=outs, ref=plus_accumulate(ref), types=["f32", "f64"], label="accumulate", rtol=10),
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), "f32"), rand(r, (40,), "f32"),
                           rand(r, (6, 40), "f32")], outputs=outs, ref=plus_accumulate(ref), types=["bf16"],
             label="bf16 dy, f32 x, accumulate", rtol=10),
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (40,), t), rand(r, (6, 40), "bf16")],
             outputs=outs, types=["f32"], error="accumulates into f32 or f64", label="bf16 accumulate")]


def summed_dy(ref):
    """A norm gradient's reference with dy given as summands (operands 4..,
    sd-norm-grad-sum): dy = ((grad + s1) + s2) + s3, each addition in f32 (f64
    for f64) of the widened values, as the Adds it replaces; then accumulate."""
    def wrapped(ins, attrs, t):
        wide = np.float64 if ins[0].dtype == np.float64 else np.float32
        dy = ins[0].astype(wide)
        for s in ins[4:]:
            dy = (dy + s.astype(wide)).astype(wide)
        outs = ref([dy, ins[1], ins[2]], attrs, t)
        if ins[3] is not None:
            outs[0] = (outs[0] + ins[3]).astype(ins[1].dtype)
        return outs
    return wrapped


# dy as the sum of the gradients of a value several products read (LoRA's
# base and adapter; q, k and v): two to four summands, f32/f64 or a half with
# an f32 x, with and without an accumulate operand; summands of another type refused.
for name, ref, outs in (("LayerNormalizationGrad", layer_norm_grad_ref, 3), ("RMSNormalizationGrad", rms_norm_grad_ref, 2)):
    CASES[name] += [
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (40,), t), None, rand(r, (6, 40), t)],
             outputs=outs, ref=summed_dy(ref), types=["f32", "f64"], label="dy of 2 summands", rtol=10),
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), "f32"), rand(r, (40,), "f32"), rand(r, (6, 40), "f32"),
                           rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (6, 40), t)],
             outputs=outs, ref=summed_dy(ref), types=list(HALVES), label="half dy of 4 summands, f32 x, accumulate",
             rtol=10),
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (40,), t), rand(r, (6, 40), t),
                           rand(r, (6, 40), t), rand(r, (6, 40), t)],
             outputs=outs, ref=summed_dy(ref), types=["f32"], label="dy of 3 summands, accumulate", rtol=10),
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), "f32"), rand(r, (40,), "f32"), None,
                           rand(r, (6, 40), "f32")], outputs=outs, types=["bf16"], error="dy's summand",
             label="summand of another type")]


def with_narrowed_dx(ref):
    """narrow_type: the reference's dx (after any accumulate) once more, rounded to the case's half type."""
    def wrapped(ins, attrs, t):
        outs = ref(ins, attrs, t)
        return outs + [outs[0].astype(NP[t])]
    return wrapped


# The residual stream's gradient written once more in half for the products before the norm (narrow_type):
# with an accumulate operand and dy summands, as sd-norm-grad-sum makes it; an f64 x refused.
for name, ref, outs in (("LayerNormalizationGrad", layer_norm_grad_ref, 3), ("RMSNormalizationGrad", rms_norm_grad_ref, 2)):
    for h in HALVES:
        CASES[name].append(
            Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), "f32"), rand(r, (40,), "f32"),
                               rand(r, (6, 40), "f32"), rand(r, (6, 40), t)], outputs=outs + 1,
                 attrs={"narrow_type": ONNX_TYPE[h]}, ref=with_narrowed_dx(summed_dy(ref)), types=[h],
                 label=f"{h} dy of 2 summands, f32 x, accumulate, {h} copy of dx", rtol=10))
    CASES[name].append(
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (40,), t)], outputs=outs + 1,
             attrs={"narrow_type": 16}, types=["f64"], error="narrow_type", label="narrow_type of an f64 x"))


def dx_only(ours, ref, inputs, t):
    """param_grads = 0: dscale and dbias are left unwritten; dx is compared."""
    err = compare(ours[0], np.asarray(ref[0]), t, Case(None, rtol=10))
    return f"output 0: {err}" if err else None


# Model-width rows: the CUDA kernels hold rows up to 1024 wide in a warp's
# registers (f32 and halves; 768 is GPT-2's width, 1024 the widest so held)
# and read wider ones through (1025); 9 rows leave a block's last warps idle.
for n in (768, 1024, 1025):
    CASES["LayerNormalization"].append(
        Case(lambda t, r, n=n: [rand(r, (9, n), t), rand(r, (n,), t), rand(r, (n,), t)], label=f"{n}-wide rows",
             rtol=5))
    CASES["RMSNormalization"].append(
        Case(lambda t, r, n=n: [rand(r, (9, n), t), rand(r, (n,), t)], ref=rms_norm_ref, label=f"{n}-wide rows",
             rtol=5))
    for name, ref, outs in (("LayerNormalizationGrad", layer_norm_grad_ref, 3),
                            ("RMSNormalizationGrad", rms_norm_grad_ref, 2)):
        CASES[name].append(
            Case(lambda t, r, n=n: [rand(r, (9, n), t), rand(r, (9, n), t), rand(r, (n,), t)], outputs=outs, ref=ref,
                 types=["f32", "bf16"], label=f"{n}-wide rows", rtol=10))
        # An autocast plan's form: a bf16 dy of two summands, f32 x, the
        # residual's gradient accumulated, a bf16 copy of dx.
        CASES[name].append(
            Case(lambda t, r, n=n: [rand(r, (9, n), t), rand(r, (9, n), "f32"), rand(r, (n,), "f32"),
                                    rand(r, (9, n), "f32"), rand(r, (9, n), t)], outputs=outs + 1,
                 attrs={"narrow_type": ONNX_TYPE["bf16"]}, ref=with_narrowed_dx(summed_dy(ref)), types=["bf16"],
                 label=f"{n}-wide rows, bf16 dy of 2 summands, f32 x, accumulate, bf16 copy of dx", rtol=10))


# Frozen norm parameters (LoRA): their gradients are not computed (param_grads = 0).
for name, ref, outs in (("LayerNormalizationGrad", layer_norm_grad_ref, 3), ("RMSNormalizationGrad", rms_norm_grad_ref, 2)):
    CASES[name].append(
        Case(lambda t, r: [rand(r, (6, 40), t), rand(r, (6, 40), t), rand(r, (40,), t), rand(r, (6, 40), t)],
             outputs=outs, attrs={"param_grads": 0}, ref=plus_accumulate(ref), types=["f32", "f64"],
             compare=dx_only, label="no parameter gradients, accumulate"))


def swiglu_packed_ref(ins, attrs, t):
    x = ins[0]
    f = x.shape[-1] // 2
    return swiglu_ref([x[..., :f], x[..., f:]], attrs, t)


def swiglu_packed_grad_ref(ins, attrs, t):
    dy, x = ins
    f = x.shape[-1] // 2
    dg, du = swiglu_grad_ref([dy, x[..., :f], x[..., f:]], attrs, t)
    return [np.concatenate([dg, du], axis=-1)]


def sigmoid64(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def swiglu_ref(ins, attrs, t):
    g, u = f64(ins[0]), f64(ins[1])
    with np.errstate(invalid="ignore", over="ignore"):  # silu(-inf) = -inf * 0 = NaN, as the kernel gives
        return [(g * sigmoid64(g) * u).astype(ins[0].dtype)]


def swiglu_grad_ref(ins, attrs, t):
    dy, g, u = f64(ins[0]), f64(ins[1]), f64(ins[2])
    s = sigmoid64(g)
    return [(dy * u * (s + g * s * (1 - s))).astype(ins[0].dtype), (dy * g * s).astype(ins[0].dtype)]


CASES["SwiGLU"] = [
    Case(lambda t, r: [rand(r, (3, 5, 7), t, -8, 8), rand(r, (3, 5, 7), t)], ref=swiglu_ref, label="3-D"),
    Case(lambda t, r: [rand(r, (40000,), t, -30, 30), rand(r, (40000,), t)], ref=swiglu_ref,
         label="long, saturated gates (several threads' chunks)"),
    Case(lambda t, r: [np.array(SPECIALS, NP[t]), np.ones(len(SPECIALS), NP[t])], ref=swiglu_ref,
         label="NaN and infinities", types=["f32", "f64"])]
CASES["SwiGLUGrad"] = [
    Case(lambda t, r: [rand(r, (3, 5, 7), t), rand(r, (3, 5, 7), t, -8, 8), rand(r, (3, 5, 7), t)], outputs=2,
         ref=swiglu_grad_ref, label="3-D"),
    Case(lambda t, r: [rand(r, (40000,), t), rand(r, (40000,), t, -30, 30), rand(r, (40000,), t)], outputs=2,
         ref=swiglu_grad_ref, label="long, saturated gates")]
# Packed gate and up (sd-pack-swiglu): x [..., 2F].
CASES["SwiGLUPacked"] = [
    Case(lambda t, r: [rand(r, (4, 16), t, -8, 8)], ref=swiglu_packed_ref, label="rows"),
    Case(lambda t, r: [rand(r, (2, 3, 10), t, -8, 8)], ref=swiglu_packed_ref, label="3-D"),
    Case(lambda t, r: [rand(r, (3, 4098), t, -30, 30)], ref=swiglu_packed_ref, label="wide rows, saturated gates"),
    Case(lambda t, r: [rand(r, (3, 2048), t, -8, 8)], ref=swiglu_packed_ref, label="wide rows in vector packs"),
    Case(lambda t, r: [rand(r, (4, 7), t)], ref=swiglu_packed_ref, error="even", label="odd last axis")]
CASES["SwiGLUPackedGrad"] = [
    Case(lambda t, r: [rand(r, (4, 8), t), rand(r, (4, 16), t, -8, 8)], ref=swiglu_packed_grad_ref, label="rows"),
    Case(lambda t, r: [rand(r, (2, 3, 5), t), rand(r, (2, 3, 10), t, -8, 8)], ref=swiglu_packed_grad_ref,
         label="3-D"),
    Case(lambda t, r: [rand(r, (3, 2049), t), rand(r, (3, 4098), t, -30, 30)], ref=swiglu_packed_grad_ref,
         label="wide rows, saturated gates"),
    Case(lambda t, r: [rand(r, (3, 1024), t), rand(r, (3, 2048), t, -8, 8)], ref=swiglu_packed_grad_ref,
         label="wide rows in vector packs")]


def rotary_ref(ins, attrs, t):
    """sd.rotary: each pair (p, q) of the last axis rotated by its position's
    angle; `transposed` rotates the other way (the gradient)."""
    x, cos, sin = f64(ins[0]), f64(ins[1]), f64(ins[2])
    pos = ins[3] if len(ins) > 3 else None
    d, w = x.shape[-1], cos.shape[-1]
    if pos is not None:
        cos, sin = cos[pos], sin[pos]  # [B, S, W]
    if w * 2 == d:  # one angle per pair: spread it to both features of the pair
        spread = (lambda a: np.repeat(a, 2, axis=-1)) if attrs.get("interleaved") else \
            (lambda a: np.concatenate([a, a], axis=-1))
        cos, sin = spread(cos), spread(sin)
    cos = cos.reshape(cos.shape[:1] + (1,) * (x.ndim - 3) + cos.shape[1:])
    sin = sin.reshape(cos.shape)

    def rot(v):  # forward's rot(x): [-x2, x1] (halves) or (-x[2i+1], x[2i]) (pairs)
        if attrs.get("interleaved"):
            out = np.empty_like(v)
            out[..., 0::2], out[..., 1::2] = -v[..., 1::2], v[..., 0::2]
            return out
        return np.concatenate([-v[..., d // 2:], v[..., :d // 2]], axis=-1)

    if attrs.get("transposed"):  # x * cos + rot^T(x * sin), rot^T = -rot
        y = x * cos - rot(x * sin)
    else:
        y = x * cos + rot(x) * sin
    return [y.astype(ins[0].dtype)]


def rotary_angles(r, t, rows, w):
    angles = r.uniform(-3.0, 3.0, (rows, w))
    return np.cos(angles).astype(NP[t]), np.sin(angles).astype(NP[t])


CASES["Rotary"] = [
    Case(lambda t, r: [rand(r, (2, 3, 5, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, t, 5, 8)]],
         ref=rotary_ref, label="rotate-half, one table for the batch"),
    Case(lambda t, r: [rand(r, (2, 3, 5, 8), t), *[a.reshape(2, 5, 4) for a in rotary_angles(r, t, 10, 4)]],
         attrs={"interleaved": 1}, ref=rotary_ref, label="interleaved, half width, per batch item"),
    Case(lambda t, r: [rand(r, (2, 3, 4, 6), t), *rotary_angles(r, t, 7, 6),
                       np.array([[0, 1, 2, 0], [3, 4, 5, 6]], np.int64)],
         attrs={"transposed": 1}, ref=rotary_ref, label="positions, transposed"),
    Case(lambda t, r: [rand(r, (2, 5, 6), t), *rotary_angles(r, t, 4, 3),
                       np.array([[0, 1, 2, 3, 0], [1, 0, 1, 2, 3]], np.int64)],
         attrs={"interleaved": 1, "transposed": 1}, ref=rotary_ref, label="3-D, positions, interleaved"),
    Case(lambda t, r: [rand(r, (1, 2, 3, 4), t), *rotary_angles(r, t, 3, 4), np.array([[0, 3, 1]], np.int64)],
         ref=rotary_ref, label="position past the table", error="outside the cos/sin table")]
# sd-half-elementwise's form: a half x, the f32 tables.
CASES["Rotary"] += [
    Case(lambda t, r: [rand(r, (2, 3, 5, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, "f32", 5, 8)]],
         attrs={"transposed": tr}, ref=rotary_ref, types=["bf16", "f16"],
         label="half x, f32 tables" + (", transposed" if tr else "")) for tr in (0, 1)]


def rotary_f32_of_half(ins, attrs, t):
    """out_type 1: the half x's rotation in f32, not rounded back."""
    return rotary_token_major_ref([ins[0].astype(np.float32)] + list(ins[1:]), attrs, t)[0]


def rotary_token_major_ref(ins, attrs, t):
    """seq_axis 1: x [B, S, H, D] rotated as its head-major [B, H, S, D] view."""
    x = ins[0].transpose(0, 2, 1, 3)
    return [rotary_ref([x] + list(ins[1:]), attrs, t)[0].transpose(0, 2, 1, 3)]


# sd-attention-layout's form: token-major x [B, S, H, D].
CASES["Rotary"] += [
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, t, 5, 8)]],
         attrs={"seq_axis": 1, "transposed": tr}, ref=rotary_token_major_ref,
         label="token-major" + (", transposed" if tr else "")) for tr in (0, 1)] + [
    Case(lambda t, r: [rand(r, (2, 4, 3, 6), t), *rotary_angles(r, t, 7, 6),
                       np.array([[0, 1, 2, 0], [3, 4, 5, 6]], np.int64)],
         attrs={"seq_axis": 1}, ref=rotary_token_major_ref, label="token-major, positions"),
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, "f32", 5, 8)]],
         attrs={"seq_axis": 1}, ref=rotary_token_major_ref, types=["bf16", "f16"], label="token-major, half x"),
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, t, 5, 8)]],
         attrs={"seq_axis": 3}, ref=rotary_token_major_ref, error="seq_axis", label="seq_axis on the features")]
# An f32 x (LoRA's f32 sum) whose rotated result the kernel rounds (out_type).
CASES["Rotary"] += [
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), "f32"), *[a.reshape(1, 5, 8) for a in rotary_angles(r, "f32", 5, 8)]],
         attrs={"out_type": ONNX_TYPE[h], "seq_axis": 1, "transposed": tr}, ref=rounded_to(rotary_token_major_ref),
         types=[h], label=f"token-major f32 x, {h} result" + (", transposed" if tr else ""))
    for h in HALVES for tr in (0, 1)]
# A half x (attention's bf16 dq, dk) whose f32 result the kernel keeps (out_type 1).
CASES["Rotary"] += [
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, "f32", 5, 8)]],
         attrs={"out_type": 1, "seq_axis": 1, "transposed": 1},
         ref=lambda ins, attrs, t: [rotary_f32_of_half(ins, attrs, t)], types=list(HALVES),
         label="token-major half x, f32 result")]

# sd-qkv-attention's form: the heads of a fused q|k|v [B, S, P, D], the first
# rotated_heads rotated (q and k), the rest (v) passed through as they are.
def rotary_some_heads_ref(ins, attrs, t):
    n = attrs["rotated_heads"]
    plain = {k: v for k, v in attrs.items() if k != "rotated_heads"}
    x = ins[0]
    y = rotary_token_major_ref([x[:, :, :n]] + list(ins[1:]), plain, t)[0]
    return [np.concatenate([y, x[:, :, n:].astype(y.dtype)], axis=2)]


CASES["Rotary"] += [
    Case(lambda t, r: [rand(r, (2, 5, 6, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, t, 5, 8)]],
         attrs={"seq_axis": 1, "rotated_heads": 4, "transposed": tr}, ref=rotary_some_heads_ref,
         label="fused q|k|v heads, v passed through" + (", transposed" if tr else "")) for tr in (0, 1)] + [
    Case(lambda t, r: [rand(r, (2, 4, 4, 6), t), *rotary_angles(r, t, 7, 6),
                       np.array([[0, 1, 2, 0], [3, 4, 5, 6]], np.int64)],
         attrs={"seq_axis": 1, "rotated_heads": 3, "interleaved": 1}, ref=rotary_some_heads_ref,
         label="fused q|k|v heads, positions, interleaved"),
    Case(lambda t, r: [rand(r, (2, 5, 6, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, "f32", 5, 8)]],
         attrs={"seq_axis": 1, "rotated_heads": 4}, ref=rotary_some_heads_ref, types=["bf16", "f16"],
         label="fused q|k|v heads, half x"),
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), t), *[a.reshape(1, 5, 8) for a in rotary_angles(r, t, 5, 8)]],
         attrs={"seq_axis": 1, "rotated_heads": 4}, ref=rotary_some_heads_ref, error="rotated_heads",
         label="more rotated heads than heads")]
# Head widths whose halves split into vector packs (the CUDA kernel's packed path).
CASES["Rotary"] += [
    Case(lambda t, r: [rand(r, (2, 6, 4, 16), t), *rotary_angles(r, t, 9, 8),
                       np.array([[0, 1, 2, 3, 4, 5], [8, 7, 6, 5, 4, 3]], np.int64)],
         attrs={"seq_axis": 1, "transposed": tr}, ref=rotary_token_major_ref,
         label="D 16, positions, half-width table" + (", transposed" if tr else "")) for tr in (0, 1)] + [
    Case(lambda t, r: [rand(r, (2, 5, 6, 16), t), *[a.reshape(1, 5, 16) for a in rotary_angles(r, "f32", 5, 16)]],
         attrs={"seq_axis": 1, "rotated_heads": 4}, ref=rotary_some_heads_ref, types=["bf16", "f16"],
         label="D 16, fused q|k|v heads, half x, f32 tables")]


def cached_attention_ref(ins, attrs, t):
    """sd.cached_attention: each token's key and value go to its row's cache slot
    positions[b, t] first; then its query attends to slots 0..positions[b, t],
    query head h reading kv head h // (H / Hkv)."""
    q, k, v, kc, vc = (f64(x) for x in ins[:5])
    pos = ins[5]
    kc, vc = kc.copy(), vc.copy()
    b_, h_, t_, _ = q.shape
    group = h_ // k.shape[1]
    for b in range(b_):
        for i in range(t_):
            kc[b, :, pos[b, i]] = k[b, :, i]
            vc[b, :, pos[b, i]] = v[b, :, i]
    y = np.zeros(q.shape[:3] + (v.shape[3],))
    for b in range(b_):
        for h in range(h_):
            for i in range(t_):
                p = pos[b, i]
                s = kc[b, h // group, :p + 1] @ q[b, h, i] * attrs["scale"]
                w = np.exp(s - s.max())
                y[b, h, i] = (w / w.sum()) @ vc[b, h // group, :p + 1]
    return [a.astype(np.float32) for a in (y, kc, vc)]


def cached_attention_inputs(r, t, pos, heads=4, kv_heads=2, d=6, dv=5, length=9, fill=True):
    b, steps = pos.shape
    caches = [rand(r, (b, kv_heads, length, w), t) if fill else np.zeros((b, kv_heads, length, w), NP[t])
              for w in (d, dv)]
    return [rand(r, (b, heads, steps, d), t), rand(r, (b, kv_heads, steps, d), t), rand(r, (b, kv_heads, steps, dv), t),
            *caches, pos]


CASES["CachedAttention"] = [
    Case(lambda t, r: cached_attention_inputs(r, t, np.array([[0, 1, 2, 3], [0, 1, 2, 3]], np.int64), fill=False),
         attrs={"scale": 0.4}, ref=cached_attention_ref, outputs=3, types=["f32"],
         label="prefill from an empty cache, grouped heads"),
    Case(lambda t, r: cached_attention_inputs(r, t, np.array([[5], [8]], np.int64), heads=2, kv_heads=2),
         attrs={"scale": 0.4}, ref=cached_attention_ref, outputs=3, types=["f32"],
         label="decode at per-row positions, the last slot included"),
    Case(lambda t, r: cached_attention_inputs(r, t, np.array([[3, 4, 5], [1, 2, 6]], np.int64), heads=3, kv_heads=1),
         attrs={"scale": 1.0}, ref=cached_attention_ref, outputs=3, types=["f32"],
         label="a chunk continuing a filled cache, each row at its own positions"),
    Case(lambda t, r: cached_attention_inputs(r, t, np.array([[2], [9]], np.int64)), attrs={"scale": 0.4},
         ref=cached_attention_ref, outputs=3, types=["f32"], label="position past the cache",
         error="outside the key/value cache")]


def gather_grad_ref(ins, attrs, t):
    dy, idx = f64(ins[0]), ins[1]
    shape, axis = attrs["data_shape"], attrs.get("axis", 0)
    out = np.zeros(shape)
    idx = np.where(idx < 0, idx + shape[axis], idx)
    moved = np.moveaxis(out, axis, 0)
    dyv = np.moveaxis(dy.reshape(shape[:axis] + list(idx.shape) + shape[axis + 1:]), list(range(axis,
                      axis + idx.ndim)), list(range(idx.ndim)))
    np.add.at(moved, idx, dyv)
    return [out.astype(ins[0].dtype)]


CASES["GatherGrad"] = [
    Case(lambda t, r: [rand(r, (4, 3), t), i64(4, 0, -1, 0)], attrs={"axis": 0, "data_shape": [5, 3]},
         ref=gather_grad_ref, label="repeated indices"),
    Case(lambda t, r: [rand(r, (2, 2, 2, 3), t), np.array([[1, 4], [1, 1]], np.int64)],
         attrs={"axis": 1, "data_shape": [2, 5, 3]}, ref=gather_grad_ref, label="axis 1, 2-D indices")]


def resize_grad_ref(ins, attrs, t):
    """ResizeGrad against Resize's Jacobian in onnx.reference: dx[k] = sum(Resize(e_k) * dy)
    for each basis tensor e_k of x's shape, in f64."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    dy, roi, scales = f64(ins[0]), ins[1], ins[2]
    shape = list(attrs["input_shape"])
    feeds = {"x": np.zeros(shape), "roi": roi, "scales": scales,
             "sizes": np.array(dy.shape, np.int64) if scales is None else None}
    names = [n if v is not None else "" for n, v in feeds.items()]
    feeds = {n: v for n, v in feeds.items() if v is not None}
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in feeds.items()]
    node = helper.make_node("Resize", names, ["y"], **{k: v for k, v in attrs.items() if k != "input_shape"})
    graph = helper.make_graph([node], "g", infos, [helper.make_tensor_value_info("y", 0, None)])
    run = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]))
    dx = np.zeros(int(np.prod(shape)))
    for k in range(dx.size):
        feeds["x"] = np.eye(1, dx.size, k).reshape(shape)
        dx[k] = float((np.asarray(run.run(None, feeds)[0], np.float64) * dy).sum())
    return [dx.reshape(shape).astype(ins[0].dtype)]


CASES["ResizeGrad"] = [
    Case(lambda t, r: [rand(r, (1, 2, 6, 6), t), None, np.array([1, 1, 2, 1.5], np.float32)],
         attrs={"mode": "linear", "input_shape": [1, 2, 3, 4]}, ref=resize_grad_ref, label="linear up, scales"),
    Case(lambda t, r: [rand(r, (1, 1, 3, 3), t), None, None],
         attrs={"mode": "linear", "coordinate_transformation_mode": "align_corners", "input_shape": [1, 1, 5, 4]},
         ref=resize_grad_ref, label="linear down, align_corners, sizes"),
    Case(lambda t, r: [rand(r, (1, 2, 6, 8), t), None, np.array([1, 1, 2, 2], np.float32)],
         attrs={"mode": "nearest", "input_shape": [1, 2, 3, 4]}, ref=resize_grad_ref, label="nearest up"),
    Case(lambda t, r: [rand(r, (1, 1, 3, 3), t), None, np.array([1, 1, 0.5, 0.6], np.float32)],
         attrs={"mode": "cubic", "antialias": 1, "input_shape": [1, 1, 6, 5]}, ref=resize_grad_ref, rtol=5,
         label="cubic antialias down", types=["f32"])]  # onnx.reference's antialiased cubic is f32 (see Resize)


def grid_sample_grad_ref(ins, attrs, t):
    """GridSampleGrad against PyTorch's grid_sample backward (dx and dgrid), in f64."""
    import torch
    dy, x, grid = ins
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(attrs.get("mode", "linear"), attrs.get("mode"))
    sample = lambda x_, g_: torch.nn.functional.grid_sample(x_, g_, mode=mode,
                                                             padding_mode=attrs.get("padding_mode", "zeros"),
                                                             align_corners=bool(attrs.get("align_corners", 0)))
    return as_type(torch_vjp(sample, [x, grid], dy, [0, 1]), x)


# f32 only, as GridSample; the grid reaches past [-1, 1] so that padding acts.
CASES["GridSampleGrad"] = [
    Case(lambda t, r: [rand(r, (2, 3, 3, 4), t), rand(r, (2, 3, 4, 5), t), rand(r, (2, 3, 4, 2), t, -1.3, 1.3)],
         attrs={"mode": m, "padding_mode": p, "align_corners": a}, ref=grid_sample_grad_ref, outputs=2,
         label=f"2-D {m}, {p}, align_corners {a}", types=["f32"], rtol=10)
    for m, p, a in (("linear", "zeros", 0), ("linear", "border", 1), ("linear", "reflection", 0),
                    ("cubic", "zeros", 1), ("nearest", "zeros", 0))] + [
    Case(lambda t, r: [rand(r, (1, 2, 2, 3, 2), t), rand(r, (1, 2, 3, 4, 5), t), rand(r, (1, 2, 3, 2, 3), t, -1.2, 1.2)],
         attrs={"mode": "linear", "padding_mode": "border", "align_corners": 0}, ref=grid_sample_grad_ref, outputs=2,
         label="3-D linear, border", types=["f32"], rtol=10)]


def conv_grad_weight_ref(ins, attrs, t):
    import torch
    dy, x = ins
    k = attrs["kernel_shape"]
    groups = attrs.get("group", 1)
    w = np.zeros((dy.shape[1], x.shape[1] // groups, *k))
    pads = attrs.get("pads", [0] * (2 * len(k)))
    conv = torch.nn.functional.conv2d if len(k) == 2 else torch.nn.functional.conv1d
    assert pads[:len(k)] == pads[len(k):], "symmetric pads only in this reference"
    return as_type(torch_vjp(lambda x_, w_: conv(x_, w_, None, attrs.get("strides", 1), pads[:len(k)],
                                                 attrs.get("dilations", 1), groups), [x, w], dy, [1]), dy)


def conv_out(x, k, s=1, p=0, d=1):
    return (x + 2 * p - d * (k - 1) - 1) // s + 1


CASES["ConvGradWeight"] = [
    Case(lambda t, r: [rand(r, (2, 4, 5, 4), t), rand(r, (2, 3, 7, 6), t)], attrs={"kernel_shape": [3, 3]},
         ref=conv_grad_weight_ref, label="plain", rtol=5),
    Case(lambda t, r: [rand(r, (1, 6, conv_out(8, 3, 2, 1), conv_out(7, 2, 1, 1, 2)), t), rand(r, (1, 4, 8, 7), t)],
         attrs={"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 1, 1, 1], "dilations": [1, 2], "group": 2},
         ref=conv_grad_weight_ref, label="strides, pads, dilations, groups", rtol=5)]


def pool_grad_ref(ins, attrs, t, kind):
    import torch
    dy, x = ins
    k, s = attrs["kernel_shape"], attrs.get("strides", attrs["kernel_shape"])
    pads = attrs.get("pads", [0] * 4)
    if kind == "max":
        fn = lambda x_: torch.nn.functional.max_pool2d(x_, k, s, pads[:2])
    else:
        fn = lambda x_: torch.nn.functional.avg_pool2d(x_, k, s, pads[:2],
                                                       count_include_pad=bool(attrs.get("count_include_pad", 0)))
    return as_type(torch_vjp(fn, [x], dy, [0]), dy)


for name, kind in (("MaxPoolGrad", "max"), ("AveragePoolGrad", "avg")):
    CASES[name] = [Case(lambda t, r: [rand(r, (2, 3, 3, 3), t), rand(r, (2, 3, 6, 7), t)],
                        attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, label="plain",
                        ref=lambda ins, a, t, kind=kind: pool_grad_ref(ins, a, t, kind)),
                   Case(lambda t, r: [rand(r, (1, 2, 4, 3), t), rand(r, (1, 2, 7, 5), t)],
                        attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                        label="overlapping, padded", ref=lambda ins, a, t, kind=kind: pool_grad_ref(ins, a, t, kind))]
CASES["AveragePoolGrad"].append(Case(lambda t, r: [rand(r, (1, 2, 4, 3), t), rand(r, (1, 2, 7, 5), t)],
                                     attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                            "count_include_pad": 1}, label="count_include_pad",
                                     ref=lambda ins, a, t: pool_grad_ref(ins, a, t, "avg")))


def sce_grad_ref(ins, attrs, t):
    import torch
    dloss, logits, labels = ins
    red, ignore = attrs.get("reduction", "mean"), attrs.get("ignore_index", -100)
    lab = torch.tensor(labels)
    return as_type(torch_vjp(lambda x: torch.nn.functional.cross_entropy(x, lab, reduction=red, ignore_index=ignore),
                             [logits], dloss, [0]), logits)


CASES["SoftmaxCrossEntropyLossGrad"] = [
    Case(lambda t, r: [rand(r, (), t, 0.5, 2), rand(r, (4, 5), t, -3, 3), np.array([1, 0, 4, 2], np.int64)],
         attrs={"reduction": "mean"}, ref=sce_grad_ref, label="mean"),
    Case(lambda t, r: [rand(r, (), t, 0.5, 2), rand(r, (2, 5, 3), t, -3, 3),
                       np.array([[1, -1, 4], [0, 2, -1]], np.int64)],
         attrs={"reduction": "sum", "ignore_index": -1}, ref=sce_grad_ref, label="sum, ignore_index, [N, C, d]"),
    Case(lambda t, r: [rand(r, (), t, 0.5, 2), rand(r, (2, 5), t, -3, 3), np.array([-1, -1], np.int64)],
         attrs={"reduction": "mean", "ignore_index": -1}, ref=sce_grad_ref, label="every label ignored")]


def sce_rows64(x, labels):
    """Per-row softmax (f64) of [N, C] logits and the rows' cross-entropy."""
    x = f64(x)
    p = softmax64(x, 1)
    return p, -np.log(p[np.arange(len(labels)), labels])


def sce_kept_rows(labels, attrs):
    """The rows whose label is not ignore_index (every row without one)."""
    return labels != attrs["ignore_index"] if "ignore_index" in attrs else np.ones(len(labels), bool)


def sce_f32_loss_ref(ins, attrs, t):
    """SoftmaxCrossEntropyLoss with f32_loss: half logits, an f32 loss."""
    kept = sce_kept_rows(ins[1], attrs)
    losses = sce_rows64(ins[0][kept], ins[1][kept])[1]
    return [np.array(losses.mean() if attrs.get("reduction", "mean") == "mean" else losses.sum(), np.float32)]


def sce_grad_f32_dloss_ref(ins, attrs, t):
    """SoftmaxCrossEntropyLossGrad with an f32 dloss on half logits: a half gradient."""
    dloss, logits, labels = float(ins[0]), ins[1], ins[2]
    kept = sce_kept_rows(labels, attrs)
    p = np.zeros(logits.shape)
    p[kept] = sce_rows64(logits[kept], labels[kept])[0]
    p[np.flatnonzero(kept), labels[kept]] -= 1
    scale = dloss / max(int(kept.sum()), 1) if attrs.get("reduction", "mean") == "mean" else dloss
    return [(p * scale).astype(logits.dtype)]


# sd-half-elementwise's forms: the logits bf16/f16, the loss and its gradient f32.
CASES["SoftmaxCrossEntropyLoss"] += [
    Case(lambda t, r: [rand(r, (6, 37), t, -4, 4), np.array([1, 0, 36, 2, 5, 9], np.int64)],
         attrs={"reduction": red, "f32_loss": 1}, ref=sce_f32_loss_ref, types=["bf16", "f16"],
         label=f"{red}, half logits, f32 loss") for red in ("mean", "sum")]
CASES["SoftmaxCrossEntropyLossGrad"] += [
    Case(lambda t, r: [np.array(1.7, np.float32), rand(r, (6, 37), t, -4, 4), np.array([1, 0, 36, 2, 5, 9], np.int64)],
         attrs={"reduction": red}, ref=sce_grad_f32_dloss_ref, types=["bf16", "f16"],
         label=f"{red}, f32 dloss, half logits") for red in ("mean", "sum")]
# Vocabulary-wide rows (the CUDA kernels read a row whose width is a multiple
# of 4 as vectors, and gather its statistics in one pass): wide score ranges,
# an ignored row.
WIDE_LABELS = np.array([3, 2047, -100, 0, 1024], np.int64)
CASES["SoftmaxCrossEntropyLoss"] += [
    Case(lambda t, r: [rand(r, (5, 2048), t, -30, 30), WIDE_LABELS], attrs={"reduction": "mean", "ignore_index": -100},
         label="vocabulary rows", rtol=5, types=["f32", "f64"]),
    Case(lambda t, r: [rand(r, (5, 2048), t, -30, 30), WIDE_LABELS],
         attrs={"reduction": "sum", "ignore_index": -100, "f32_loss": 1}, ref=sce_f32_loss_ref, types=["bf16", "f16"],
         label="vocabulary rows, half logits, f32 loss")]
CASES["SoftmaxCrossEntropyLossGrad"] += [
    Case(lambda t, r: [rand(r, (), t, 0.5, 2), rand(r, (5, 2048), t, -30, 30), WIDE_LABELS],
         attrs={"reduction": "mean", "ignore_index": -100}, ref=sce_grad_ref, label="vocabulary rows",
         types=["f32", "f64"]),
    Case(lambda t, r: [np.array(1.7, np.float32), rand(r, (5, 2048), t, -30, 30), WIDE_LABELS],
         attrs={"reduction": "sum", "ignore_index": -100}, ref=sce_grad_f32_dloss_ref, types=["bf16", "f16"],
         label="vocabulary rows, f32 dloss, half logits")]


def skipped_update(ins, skip, state, grad):
    """fp16's found-Inf flag (operand `skip`) given and set: the state
    operands come back unchanged and the gradient zeroed; None otherwise."""
    if len(ins) <= skip or not bool(ins[skip]):
        return None
    return [np.array(ins[i], np.float32) for i in state] + [np.zeros_like(np.array(ins[grad], np.float32))]


def adamw_ref(ins, attrs, t):
    if (kept := skipped_update(ins, 8, [0, 2, 3], 1)) is not None:
        return kept
    p, g, m, v = (f64(x) for x in ins[:4])
    step, lr, wd, gs = (float(x) for x in ins[4:8])
    b1, b2, eps = attrs.get("beta1", 0.9), attrs.get("beta2", 0.999), attrs.get("epsilon", 1e-8)
    wd = wd if attrs.get("decay", 1) else 0.0
    g = g * gs
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr / (1 - b1 ** step) * m / (np.sqrt(v) / math.sqrt(1 - b2 ** step) + eps)
    return [x.astype(np.float32) for x in (p, m, v, np.zeros_like(g))]


def sgd_ref(ins, attrs, t):
    if (kept := skipped_update(ins, 7, [0, 2], 1)) is not None:
        return kept
    p, g, buf = (f64(x) for x in ins[:3])
    step, lr, wd, gs = (float(x) for x in ins[3:7])
    mu, damp, nesterov = attrs.get("momentum", 0.0), attrs.get("dampening", 0.0), attrs.get("nesterov", 0)
    wd = wd if attrs.get("decay", 1) else 0.0
    d = g * gs + wd * p
    b = np.zeros_like(d)
    if mu:
        b = d if step <= 1 else buf * mu + d * (1 - damp)
        d = d + mu * b if nesterov else b
    return [x.astype(np.float32) for x in (p - lr * d, b, np.zeros_like(g))]


def scalars(*v):
    return [np.array(x, np.float32) for x in v]


CASES["AdamW"] = [Case(lambda t, r, s=s: [rand(r, (3, 4), t), rand(r, (3, 4), t), rand(r, (3, 4), t, -0.1, 0.1),
                                          rand(r, (3, 4), t, 0, 0.1)] + scalars(s, 1e-2, 0.1, 0.5), outputs=4,
                       attrs=a, ref=adamw_ref, label=f"step {s} {a}")
                  for s in (1, 7) for a in ({}, {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6, "decay": 0})]
CASES["SGD"] = [Case(lambda t, r, s=s: [rand(r, (3, 4), t), rand(r, (3, 4), t), rand(r, (3, 4), t)] +
                     scalars(s, 0.1, 0.01, 2.0), outputs=3, attrs=a, ref=sgd_ref, label=f"step {s} {a}")
                for s in (1, 3) for a in ({}, {"momentum": 0.9}, {"momentum": 0.9, "dampening": 0.1},
                                          {"momentum": 0.9, "nesterov": 1})]


def with_inf_gradient(tensors):
    g = np.array(tensors[1])
    g.flat[[0, 5]] = [np.inf, np.nan]
    return [tensors[0], g] + list(tensors[2:])


# fp16's skip operand: set, the state keeps its bits whatever the gradient
# holds (here Inf and NaN); clear, the update is the usual one.
CASES["AdamW"] += [Case(lambda t, r, k=k: (with_inf_gradient if k else list)(
                            [rand(r, (3, 4), t), rand(r, (3, 4), t), rand(r, (3, 4), t, -0.1, 0.1),
                             rand(r, (3, 4), t, 0, 0.1)]) + scalars(3, 1e-2, 0.1, 0.5) + [np.array(k, np.bool_)],
                        outputs=4, ref=adamw_ref, label=f"skip {k}")
                   for k in (True, False)]
CASES["SGD"] += [Case(lambda t, r, k=k: (with_inf_gradient if k else list)(
                          [rand(r, (3, 4), t), rand(r, (3, 4), t), rand(r, (3, 4), t)]) +
                      scalars(3, 0.1, 0.01, 2.0) + [np.array(k, np.bool_)],
                      outputs=3, attrs={"momentum": 0.9}, ref=sgd_ref, label=f"skip {k}")
                 for k in (True, False)]


def grouped_adamw_ref(ins, attrs, t):
    """GroupedAdamW: AdamW on each of its N tensors (params, grads, exp_avgs,
    exp_avg_sqs after the 5 scalars), results params, exp_avgs, exp_avg_sqs, grads."""
    n = (len(ins) - 5) // 4
    skip = [] if ins[4] is None else [ins[4]]
    outs = [adamw_ref([ins[5 + k * n + i] for k in range(4)] + list(ins[:4]) + skip,
                      dict(attrs, decay=attrs["decay"][i]), t) for i in range(n)]
    return [outs[i][k] for k in range(4) for i in range(n)]


def adamw_group(r, t, shapes, grad=list):
    """Params, grads, exp_avgs and exp_avg_sqs of tensors of `shapes`, grouped by kind."""
    ts = [[rand(r, s, t), grad([rand(r, s, t)])[0], rand(r, s, t, -0.1, 0.1), rand(r, s, t, 0, 0.1)] for s in shapes]
    return [x[k] for k in range(4) for x in ts]


def inf_gradient(tensors):
    g = np.array(tensors[0])
    g.flat[[0, 2]] = [np.inf, np.nan]
    return [g]


# Three tensors, one of them spanning many of a GPU launch's blocks, decay per tensor.
GROUP_SHAPES = [(3, 4), (70000,), (5,)]
CASES["GroupedAdamW"] = [Case(lambda t, r, s=s: scalars(s, 1e-2, 0.1, 0.5) + [None] + adamw_group(r, t, GROUP_SHAPES),
                              outputs=12, attrs=dict(a, decay=[0, 1, 1]), ref=grouped_adamw_ref,
                              label=f"step {s} {a}")
                         for s in (1, 7) for a in ({}, {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6})]
CASES["GroupedAdamW"] += [Case(lambda t, r, k=k: scalars(3, 1e-2, 0.1, 0.5) + [np.array(k, np.bool_)] +
                               adamw_group(r, t, GROUP_SHAPES, inf_gradient if k else list),
                               outputs=12, attrs={"decay": [1, 1, 0]}, ref=grouped_adamw_ref, label=f"skip {k}")
                          for k in (True, False)]
CASES["GroupedAdamW"] += [
    Case(lambda t, r: scalars(1, 1e-2, 0.1, 0.5) + [None] + adamw_group(r, t, GROUP_SHAPES), outputs=12,
         attrs={"decay": [1, 1]}, ref=grouped_adamw_ref, label="decay flags for 2 of 3 tensors",
         error="decay flags"),
    Case(lambda t, r: scalars(1, 1e-2, 0.1, 0.5) + [None] + adamw_group(r, t, [(3, 4), (2, 6)])[:7] +
         [rand(r, (2, 5), t)], outputs=8, attrs={"decay": [1, 1]}, ref=grouped_adamw_ref,
         label="an exp_avg_sq of another size", error="differ"),
]


def grouped_cast_ref(ins, attrs, t):
    to = {16: ml_dtypes.bfloat16, 10: np.float16}[attrs["to"]]
    with np.errstate(over="ignore"):  # beyond f16's range: Inf, as the kernels round
        return [np.asarray(x, np.float32).astype(to) for x in ins]


def same_bits(ours, ref, inputs, t):
    """Equal bit for bit (NaN for NaN: payloads may differ)."""
    for k, (a, b) in enumerate(zip(ours, ref)):
        a, b = np.asarray(a), np.asarray(b).astype(np.asarray(a).dtype)
        nan_a, nan_b = np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32))
        if a.shape != b.shape or not np.array_equal(nan_a, nan_b) or a[~nan_a].tobytes() != b[~nan_b].tobytes():
            return f"output {k}: not the reference's bits"
    return None


def rounding_edges(r):
    """f32 values at and around half-way points of bf16 and f16, and specials."""
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, -(1 + 2.0 ** -8)], np.float32)
    special = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 3.4e38, 70000.0, 1e-40, 6e-8], np.float32)
    return np.concatenate([ties, special, rand(r, (50,), "f32", -1e5, 1e5)])


# sd-group-weight-casts' step: tensors of several sizes (one over many of a GPU launch's blocks).
CASES["GroupedCast"] = [Case(lambda t, r: [rand(r, (8, 24), t), rounding_edges(r), rand(r, (70000,), t, -300, 300),
                                           rand(r, (3,), t)],
                             attrs={"to": to}, outputs=4, ref=grouped_cast_ref, compare=same_bits, label=f"to {to}")
                        for to in (16, 10)]
CASES["GroupedCast"] += [
    Case(lambda t, r: [rand(r, (3,), t), rand(r, (2,), t)], attrs={"to": 11}, outputs=2, ref=grouped_cast_ref,
         label="to f64", error="only bf16"),
    Case(lambda t, r: [rand(r, (3,), t), rand(r, (2,), "f64")], attrs={"to": 16}, outputs=2, ref=grouped_cast_ref,
         label="an f64 operand", error="not f32"),
]


def grad_scale_ref(ins, attrs, t):
    tokens, max_norm = max(1.0, float(ins[0])), float(ins[1])
    norm = math.sqrt(sum(float((f64(g) ** 2).sum()) for g in ins[2:])) / tokens
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
    return [np.array(coef / tokens, np.float32), np.array(norm, np.float32)]


CASES["GradScale"] = [Case(lambda t, r, m=m: [np.array(12, np.float32), np.array(m, np.float32), rand(r, (3, 4), t),
                                              rand(r, (70000,), t), rand(r, (5,), t)], outputs=2, ref=grad_scale_ref,
                           label=f"max_norm {m}") for m in (0.0, 0.05, 1e6)]
CASES["GradScale"].append(Case(lambda t, r: [np.array(0, np.float32), np.array(1, np.float32), rand(r, (3,), t)],
                               outputs=2, ref=grad_scale_ref, label="no tokens counted"))


# OSFT (sd-peft-osft): U [out, k], S [k], V [k, in] for the frozen high and the trainable low half.
# Recurrence: one direction of an ONNX RNN/GRU/LSTM after its input projection
# (compiler/import/onnx/RecurrentHandler.cpp), against the ONNX equations in
# PyTorch f64; RecurrenceGrad against autograd through the same reference.
RNN_ACTS = {"Sigmoid": lambda x, a, b: x.sigmoid(), "Tanh": lambda x, a, b: x.tanh(),
            "Relu": lambda x, a, b: x.relu(), "Affine": lambda x, a, b: a * x + b,
            "LeakyRelu": lambda x, a, b: x.clamp(min=0) + a * x.clamp(max=0),
            "ThresholdedRelu": lambda x, a, b: x * (x > a), "ScaledTanh": lambda x, a, b: a * (b * x).tanh(),
            "HardSigmoid": lambda x, a, b: (a * x + b).clamp(0, 1), "Softsign": lambda x, a, b: x / (1 + x.abs()),
            "Elu": lambda x, a, b: x.clamp(min=0) + a * (x.clamp(max=0).exp() - 1),
            "Softplus": lambda x, a, b: (1 + x.exp()).log()}


def recurrence_ref(xw, r, h0, c0, p, rbh, lens, attrs):
    import torch
    S, B, _ = xw.shape
    H = r.shape[1]
    names = attrs["activations"].split(",")
    fns = [lambda x, n=n, a=a, b=b: RNN_ACTS[n](x, a, b)
           for n, a, b in zip(names, attrs["activation_alpha"], attrs["activation_beta"])]
    clip = attrs.get("clip", 0.0)
    gate = lambda k, x: fns[k](x.clamp(-clip, clip) if clip > 0 else x)
    h = h0 if h0 is not None else torch.zeros(B, H, dtype=xw.dtype)
    c = c0 if c0 is not None else torch.zeros(B, H, dtype=xw.dtype)
    ys = [None] * S
    for t in (reversed(range(S)) if attrs.get("reverse") else range(S)):
        cn = c
        if attrs["cell"] == "LSTM":
            g = xw[t] + h @ r.T
            i_, o_, f_, c_ = g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H], g[:, 3 * H:]
            if p is not None:
                i_, f_ = i_ + p[:H] * c, f_ + p[2 * H:] * c
            i = gate(0, i_)
            f = 1 - i if attrs.get("input_forget") else gate(0, f_)
            cn = f * c + i * gate(1, c_)
            if p is not None:
                o_ = o_ + p[H:2 * H] * cn
            hn = gate(0, o_) * fns[2](cn)
        elif attrs["cell"] == "GRU":
            zr = xw[t, :, :2 * H] + h @ r[:2 * H].T
            z, rr = gate(0, zr[:, :H]), gate(0, zr[:, H:])
            if attrs.get("linear_before_reset"):
                hh = h @ r[2 * H:].T + (rbh if rbh is not None else 0)
                pre = xw[t, :, 2 * H:] + rr * hh
            else:
                pre = xw[t, :, 2 * H:] + (rr * h) @ r[2 * H:].T
            cand = gate(1, pre)
            hn = (1 - z) * cand + z * h
        else:
            hn = gate(0, xw[t] + h @ r.T)
        if lens is not None:
            live = torch.tensor(t < np.asarray(lens))[:, None]
            ys[t], h, c = torch.where(live, hn, torch.zeros_like(hn)), torch.where(live, hn, h), torch.where(live, cn, c)
        else:
            ys[t], h, c = hn, hn, cn
    if attrs["cell"] != "LSTM":
        c = torch.zeros(B, H, dtype=xw.dtype)
    return torch.stack(ys), h, c


RNN_SETUPS = [  # label, attrs, S, B, H, with (h0, c0, peepholes, reset bias, lens)
    ("LSTM: peepholes, clip, sequence_lens, reverse, initial states",
     {"cell": "LSTM", "activations": "Sigmoid,Tanh,Tanh", "activation_alpha": [0.0] * 3,
      "activation_beta": [0.0] * 3, "clip": 1.5, "reverse": 1}, 5, 3, 4, (True, True, True, False, True)),
    ("LSTM: input_forget, HardSigmoid/ScaledTanh",
     {"cell": "LSTM", "activations": "HardSigmoid,ScaledTanh,Softsign", "activation_alpha": [0.2, 1.5, 0.0],
      "activation_beta": [0.5, 0.7, 0.0], "input_forget": 1}, 4, 2, 3, (False, False, False, False, False)),
    ("GRU: reset after the product, sequence_lens",
     {"cell": "GRU", "activations": "Sigmoid,Tanh", "activation_alpha": [0.0] * 2, "activation_beta": [0.0] * 2},
     5, 3, 4, (True, False, False, False, True)),
    ("GRU: linear_before_reset with its bias, reverse",
     {"cell": "GRU", "activations": "Sigmoid,Tanh", "activation_alpha": [0.0] * 2, "activation_beta": [0.0] * 2,
      "linear_before_reset": 1, "reverse": 1}, 4, 2, 5, (True, False, False, True, False)),
    ("RNN: LeakyRelu, clip",
     {"cell": "RNN", "activations": "LeakyRelu", "activation_alpha": [0.1], "activation_beta": [0.0], "clip": 2.0},
     4, 2, 3, (True, False, False, False, False))]


def rnn_inputs(t, r, attrs, S, B, H, which):
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[attrs["cell"]]
    h0, c0, peep, rbh, lens = which
    return [rand(r, (S, B, gates * H), t), rand(r, (gates * H, H), t, -0.5, 0.5),
            rand(r, (B, H), t) if h0 else None, rand(r, (B, H), t) if c0 else None,
            rand(r, (3 * H,), t, -0.5, 0.5) if peep else None, rand(r, (H,), t) if rbh else None,
            np.array([S, 1, 3][:B], np.int32) if lens else None]


def recurrence_forward_ref(ins, attrs, t):
    import torch
    args = [torch.tensor(f64(x)) if x is not None and x.dtype != np.int32 else x for x in ins]
    return [o.numpy().astype(ins[0].dtype) for o in recurrence_ref(*args, attrs)]


def recurrence_grad_case(label, attrs, S, B, H, which):
    fwd = {}

    def make(t, r):
        ins = rnn_inputs(t, r, attrs, S, B, H, which)
        saved = _sdops.run("cpu", "Recurrence", attrs, ins, 4)[3]
        cot = [rand(r, (S, B, H), t), rand(r, (B, H), t), rand(r, (B, H), t) if attrs["cell"] == "LSTM" else None]
        fwd["ins"], fwd["cot"] = ins, cot
        return [cot[0], saved, ins[1], cot[1], cot[2], ins[4], ins[6]]

    def ref(ins, a, t):
        import torch
        x = fwd["ins"]
        H_ = x[1].shape[1]
        wrt = [0, 1, 2, 3, 4, 5]
        # An absent initial state is zeros, and the kernel still gives its gradient.
        x = list(x)
        for i in (2, 3):
            if x[i] is None:
                x[i] = np.zeros((B, H_), x[0].dtype)
        ps = [torch.tensor(f64(v), requires_grad=True) if v is not None and i in wrt else v
              for i, v in enumerate(x)]
        outs = recurrence_ref(*ps, attrs)
        total = sum((o * torch.tensor(f64(cv))).sum() for o, cv in zip(outs, fwd["cot"]) if cv is not None)
        total.backward()
        shapes = [x[0].shape, x[1].shape, (B, H_), (B, H_), (3 * H_,), (H_,)]
        return [(ps[i].grad.numpy() if ps[i] is not None and ps[i].grad is not None else np.zeros(shapes[i]))
                .astype(x[0].dtype) for i in range(6)]
    return Case(make, attrs=attrs, outputs=6, ref=ref, label=label, types=["f32"], rtol=10, made_by_cpu_kernel=True)


CASES["Recurrence"] = [
    Case(lambda t, r, a=a, S=S, B=B, H=H, w=w: rnn_inputs(t, r, a, S, B, H, w), attrs=a, outputs=4, label=label,
         types=["f32"], ref=recurrence_forward_ref, rtol=10,
         compare=lambda ours, ref, ins, t: next((f"output {k}: {e}" for k in range(3)
                                                 if (e := compare(ours[k], ref[k], t, Case(None, rtol=10)))), None))
    for label, a, S, B, H, w in RNN_SETUPS]
CASES["RecurrenceGrad"] = [recurrence_grad_case(*s) for s in RNN_SETUPS]


def osft_factors(r, t, out=6, inp=8, k=2, low=3):
    return [rand(r, (out, k), t), rand(r, (k,), t), rand(r, (k, inp), t), rand(r, (out, low), t), rand(r, (low,), t),
            rand(r, (low, inp), t)]


def osft_forward(x, uh, sh, vh, ul, sl, vl, bias=None):
    y = ((x @ vh.T) * sh) @ uh.T + ((x @ vl.T) * sl) @ ul.T
    return y if bias is None else y + bias


CASES["OsftLinear"] = [
    Case(lambda t, r: [rand(r, (2, 3, 8), t)] + osft_factors(r, t) + [rand(r, (6,), t)], label="3-D input, bias",
         ref=lambda ins, attrs, t: [osft_forward(*[f64(a) for a in ins]).astype(ins[0].dtype)]),
    Case(lambda t, r: [rand(r, (5, 8), t)] + osft_factors(r, t) + [None], label="no bias",
         ref=lambda ins, attrs, t: [osft_forward(*[f64(a) for a in ins[:7]]).astype(ins[0].dtype)]),
    Case(lambda t, r: [rand(r, (0, 8), t)] + osft_factors(r, t) + [None], label="no rows",
         ref=lambda ins, attrs, t: [np.zeros((0, 6), ins[0].dtype)])]


def osft_linear_grad_ref(ins, attrs, t):
    dy, x, *factors = ins
    grads = torch_vjp(lambda x, *f: osft_forward(x, *f), [x] + factors, dy, [0, 4, 5, 6])
    return [g.astype(x.dtype) for g in grads]


CASES["OsftLinearGrad"] = [
    Case(lambda t, r: [rand(r, (2, 3, 6), t), rand(r, (2, 3, 8), t)] + osft_factors(r, t), outputs=4,
         ref=osft_linear_grad_ref, label="3-D input", rtol=10),
    Case(lambda t, r: [rand(r, (4, 9), t), rand(r, (4, 5), t)] + osft_factors(r, t, out=9, inp=5, k=3, low=2),
         outputs=4, ref=osft_linear_grad_ref, label="wide output", rtol=10)]


def osft_compose(uh, sh, vh, ul, sl, vl):
    return (uh * sh) @ vh + (ul * sl) @ vl


CASES["OsftCompose"] = [Case(lambda t, r: osft_factors(r, t), label="6x8 from ranks 2 and 3",
                             ref=lambda ins, attrs, t: [osft_compose(*[f64(a) for a in ins]).astype(ins[0].dtype)])]
CASES["OsftComposeGrad"] = [
    Case(lambda t, r: [rand(r, (6, 8), t)] + osft_factors(r, t)[3:], outputs=3, rtol=10, label="rank 3",
         ref=lambda ins, attrs, t: [g.astype(ins[0].dtype) for g in torch_vjp(
             lambda ul, sl, vl: (ul * sl) @ vl, ins[1:], ins[0], [0, 1, 2])])]


def osft_coefficients_ref(ins, attrs, t):
    out = []
    for (x, h), side in zip(zip(ins[0::2], ins[1::2]), attrs["sides"]):
        out.append((f64(h).T @ f64(x) if side == 0 else f64(x) @ f64(h).T).ravel())
    return [np.concatenate(out).astype(ins[0].dtype)]


def osft_deflate_ref(ins, attrs, t):
    c, out, off = f64(ins[0]), [], 0
    for (x, h), side in zip(zip(ins[1::2], ins[2::2]), attrs["sides"]):
        x, h = f64(x), f64(h)
        if side == 0:
            n = h.shape[1] * x.shape[1]
            out.append(x - h @ c[off:off + n].reshape(h.shape[1], x.shape[1]))
        else:
            n = x.shape[0] * h.shape[0]
            out.append(x - c[off:off + n].reshape(x.shape[0], h.shape[0]) @ h)
        off += n
    return [o.astype(ins[0].dtype) for o in out]


CASES["OsftCoefficients"] = [
    Case(lambda t, r: [rand(r, (7, 3), t), rand(r, (7, 2), t), rand(r, (3, 9), t), rand(r, (4, 9), t)],
         attrs={"sides": [0, 1]}, ref=osft_coefficients_ref, label="a U pair and a V pair")]
CASES["OsftDeflate"] = [
    Case(lambda t, r: [rand(r, (18,), t), rand(r, (7, 3), t), rand(r, (7, 2), t), rand(r, (3, 9), t),
                       rand(r, (4, 9), t)], attrs={"sides": [0, 1]}, outputs=2, ref=osft_deflate_ref,
         label="a U pair and a V pair"),
    Case(lambda t, r: [rand(r, (12,), t), rand(r, (3, 9), t), rand(r, (4, 9), t)], attrs={"sides": [1]},
         ref=osft_deflate_ref, label="one V pair")]


# Alone (the harness has no communicator: a world of one) AllReduce and Broadcast are the
# identity; test/e2e/test_ranks.py runs it across MPI ranks.
CASES["AllReduce"] = [Case(lambda t, r: [rand(r, (3, 4), t), rand(r, (70001,), t), rand(r, (), t)], outputs=3,
                           ref=lambda ins, attrs, t: [x.copy() for x in ins], label="three tensors, world of one"),
                      Case(lambda t, r: [rand(r, (3, 4), t), rand(r, (70001,), t)], outputs=2, attrs={"async": 1},
                           ref=lambda ins, attrs, t: [x.copy() for x in ins], label="async, world of one")]
CASES["WaitCollectives"] = [Case(lambda t, r: [rand(r, (3, 4), t), rand(r, (70001,), t)], outputs=2,
                                 ref=lambda ins, attrs, t: [x.copy() for x in ins], label="nothing pending, world of one")]
CASES["ReduceToOwner"] = [Case(lambda t, r: [rand(r, (5, 3), t)], ref=lambda ins, attrs, t: [ins[0].copy()],
                               label="world of one")]
CASES["Broadcast"] = [Case(lambda t, r: [rand(r, (3, 4), t), rand(r, (70001,), t)], outputs=2, attrs={"root": 0},
                           ref=lambda ins, attrs, t: [x.copy() for x in ins], label="two tensors, world of one")]
# --shard params alone: one rank holds every row, so a gather copies and a scatter adds.
CASES["AllGatherRows"] = [Case(lambda t, r: [rand(r, (5, 3), t)], ref=lambda ins, attrs, t: [ins[0].copy()],
                               label="world of one"),
                          Case(lambda t, r: [rand(r, (0, 3), t)], ref=lambda ins, attrs, t: [ins[0].copy()],
                               label="no rows")]
CASES["ReduceScatterRows"] = [Case(lambda t, r: [rand(r, (5, 3), t), rand(r, (5, 3), t)],
                                   ref=lambda ins, attrs, t: [ins[0] + ins[1]], label="world of one")]


def seeded_dropout_ref(ins, attrs, t):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
    from test_lora_dropout import keep_mask
    x, rng = ins[0], [int(v) for v in ins[1]]
    p = attrs.get("ratio", 0.0)
    # [seed, counter, row offset, rows]: element i is global element offset + i.
    offset = rng[2] * (x.size // rng[3]) if len(rng) == 4 and rng[3] > 0 else 0
    keep = keep_mask(rng[0], rng[1], attrs.get("stream", 0), offset + x.size, p)[offset:].reshape(x.shape)
    return [np.where(keep, f64(x) * (1.0 / (1.0 - p)), 0.0).astype(x.dtype)]


CASES["SeededDropout"] = [Case(lambda t, r: [rand(r, (4, 33), t), i64(7, c)], attrs={"ratio": p, "stream": 3},
                               ref=seeded_dropout_ref, label=f"ratio {p} counter {c}")
                          for p, c in ((0.1, 0), (0.5, 12), (0.0, 1))]
# Rows 8..11 of a global batch (int64[4] state): the mask of those global rows.
CASES["SeededDropout"] += [Case(lambda t, r: [rand(r, (4, 5, 6), t), i64(7, 3, 8, 4)], attrs={"ratio": 0.3, "stream": 1},
                                ref=seeded_dropout_ref, label="rows 8-11 of the global batch"),
                           Case(lambda t, r: [rand(r, (4, 5, 6), t), i64(7, 3, 8, 7)], attrs={"ratio": 0.3},
                                ref=seeded_dropout_ref, error="whole rows", label="120 elements are not 7 rows")]


def seeded_random_ref(ins, attrs, t):
    """SeededRandom's draws (sd/ops/counter_rng.h, rebuilt in test_lora_dropout)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
    from test_lora_dropout import normal, uniform
    like, rng = ins[0], [int(v) for v in ins[1]]
    offset = rng[2] * (like.size // rng[3]) if len(rng) == 4 and rng[3] > 0 else 0
    a, b = np.float32(attrs.get("a", 0.0)), np.float32(attrs.get("b", 1.0))  # float math, as the kernels
    stream = attrs.get("stream", 0)
    if attrs.get("normal", 0):
        z = a + b * normal(rng[0], rng[1], stream, offset + like.size)[offset:]
    else:
        z = a + (b - a) * uniform(rng[0], rng[1], stream, offset + like.size)[offset:]
    return [z.reshape(like.shape).astype(like.dtype)]


CASES["SeededRandom"] = [Case(lambda t, r: [rand(r, (4, 33), t), i64(7, 2)], attrs=a, ref=seeded_random_ref, label=l)
                         for a, l in (({"stream": 3}, "uniform [0, 1)"), ({"a": -2.0, "b": 3.0}, "uniform [-2, 3)"),
                                      ({"normal": 1, "a": 0.5, "b": 2.0, "stream": 1}, "normal mean 0.5 scale 2"))]
CASES["SeededRandom"] += [Case(lambda t, r: [rand(r, (4, 5, 6), t), i64(7, 3, 8, 4)], attrs={"normal": 1},
                               ref=seeded_random_ref, label="rows 8-11 of the global batch")]
# The draws are float math (logf and cosf, whose last bit NumPy's float32 need
# not share): f64 results are held to f32's tolerance (RTOL f32 / f64 = 2e5).
for c in list(CASES["SeededRandom"]):
    f64_case = copy.copy(c)
    f64_case.types, f64_case.rtol, f64_case.label = ["f64"], 2e5, c.label + " (f64: float draws)"
    c.types = [t for t in FLOATS if t != "f64"]
    CASES["SeededRandom"].append(f64_case)


def attention_scores(ins, attrs):
    """The scaled scores with the mask's fill and packed sequences' -inf (f64)."""
    q, kt = f64(ins[0]), f64(ins[1])
    s = q @ kt * attrs.get("scale", 1.0)
    if len(ins) > 3 and ins[3] is not None:
        s = np.where(ins[3], attrs.get("mask_value", -np.inf), s)
    if len(ins) > 4 and ins[4] is not None:
        pos = ins[4]
        T = s.shape[-1]
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        for b in range(pos.shape[0]):
            s[b] = np.where(j < (i - pos[b][:, None]), -np.inf, s[b])
    return s


def row_lse(s):
    """Each row's natural-log log-sum-exp, -inf for a row of -inf."""
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(np.isneginf(m), -np.inf, m + np.log(np.exp(s - np.where(np.isneginf(m), 0, m)).sum(-1,
                                                                                                 keepdims=True)))
    return out[..., 0].astype(np.float32)


def attention_lse_ref(ins, attrs, t):
    """Attention with its second result: y and each row's log-sum-exp."""
    if attrs.get("layout") == "bshd":
        heads = list(heads_first(*ins[:3])) + list(ins[3:])
        return [attention_bshd_ref(ins, attrs, t)[0], row_lse(attention_scores(heads, attrs))]
    return [attention_ref(ins, attrs, t)[0], row_lse(attention_scores(ins, attrs))]


def attention_ref(ins, attrs, t):
    s = attention_scores(ins, attrs)
    y = softmax64(s, -1) @ f64(ins[2])
    if attrs.get("zero_masked_rows"):  # a query with every key masked: 0, not NaN
        y = np.where(np.isneginf(s).all(-1, keepdims=True), 0.0, y)
    return [y.astype(np.float32)]


def attention_grad_ref(ins, attrs, t):
    import torch
    dy, q, kt, v = ins[:4]
    mask = ins[4] if len(ins) > 4 else None
    if attrs.get("zero_masked_rows") and mask is not None:
        # Rows with every key masked give 0 and pass no gradient: the same as
        # leaving them unmasked with no incoming gradient.
        full = np.broadcast_to(mask.all(-1, keepdims=True), dy.shape[:-1] + (1,))
        dy = np.where(full, 0, dy).astype(dy.dtype)
        mask = mask & ~mask.all(-1, keepdims=True)

    # Packed sequences (positions [B, T]): -inf before each query's first key.
    positions = ins[5] if len(ins) > 5 else None
    before = None
    if positions is not None:
        T = dy.shape[-2]
        i, j = np.arange(T)[:, None], np.arange(kt.shape[-1])[None, :]
        before = np.stack([j < (i - p[:, None]) for p in positions])
        before = torch.tensor(before.reshape(before.shape[:1] + (1,) * (dy.ndim - 3) + before.shape[1:]))

    def fwd(q_, kt_, v_):
        s = q_ @ kt_ * attrs.get("scale", 1.0)
        if mask is not None:
            s = s.masked_fill(torch.tensor(mask), attrs.get("mask_value", -math.inf))
        if before is not None:
            s = s.masked_fill(before, -math.inf)
        return torch.softmax(s, -1) @ v_
    return [g.astype(np.float32) for g in torch_vjp(fwd, [q, kt, v], dy, [0, 1, 2])]


def causal(T):
    return np.triu(np.ones((T, T), bool), 1)


def padded_rows():
    """[2, 1, 4, 6] masks (true = hidden): batch 0 hides keys 4-5, batch 1
    hides every key of queries 2 and 3 (padding queries) and key 0."""
    m = np.zeros((2, 1, 4, 6), bool)
    m[0, :, :, 4:] = True
    m[1, :, :, 0] = True
    m[1, :, 2:, :] = True
    return m


CASES["Attention"] = [
    Case(lambda t, r: [rand(r, (2, 3, 5, 4), t), rand(r, (2, 3, 4, 5), t), rand(r, (2, 3, 5, 6), t)],
         attrs={"scale": 0.5}, ref=attention_ref, label="no mask"),
    Case(lambda t, r: [rand(r, (2, 2, 9, 4), t), rand(r, (2, 2, 4, 9), t), rand(r, (2, 2, 9, 4), t), causal(9)],
         attrs={"scale": 0.5}, ref=attention_ref, label="causal"),
    Case(lambda t, r: [rand(r, (2, 2, 6, 4), t), rand(r, (2, 2, 4, 6), t), rand(r, (2, 2, 6, 4), t), causal(6),
                       np.array([[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3]], np.int64)],
         attrs={"scale": 0.5}, ref=attention_ref, label="causal, packed sequences"),
    Case(lambda t, r: [rand(r, (1, 5, 4), t), rand(r, (1, 4, 7), t), rand(r, (1, 7, 3), t),
                       r.integers(0, 2, (5, 7)).astype(bool) & ~np.eye(5, 7, dtype=bool)],
         attrs={"mask_value": -1e4}, ref=attention_ref, label="arbitrary mask, finite fill"),
    Case(lambda t, r: [rand(r, (2, 1, 4, 4), t), rand(r, (2, 1, 4, 6), t), rand(r, (2, 1, 6, 3), t), padded_rows()],
         attrs={"zero_masked_rows": 1}, ref=attention_ref, label="padding hides every key of some rows: zeros")]
CASES["AttentionGrad"] = [
    Case(lambda t, r: [rand(r, (2, 3, 5, 6), t), rand(r, (2, 3, 5, 4), t), rand(r, (2, 3, 4, 5), t),
                       rand(r, (2, 3, 5, 6), t)], attrs={"scale": 0.5}, outputs=3, ref=attention_grad_ref,
         label="no mask", rtol=5),
    Case(lambda t, r: [rand(r, (1, 2, 9, 4), t), rand(r, (1, 2, 9, 4), t), rand(r, (1, 2, 4, 9), t),
                       rand(r, (1, 2, 9, 4), t), causal(9)], attrs={"scale": 0.5}, outputs=3, ref=attention_grad_ref,
         label="causal", rtol=5),
    Case(lambda t, r: [rand(r, (2, 1, 4, 3), t), rand(r, (2, 1, 4, 4), t), rand(r, (2, 1, 4, 6), t),
                       rand(r, (2, 1, 6, 3), t), padded_rows()], attrs={"zero_masked_rows": 1}, outputs=3,
         ref=attention_grad_ref, label="padding hides every key of some rows: no gradient from them", rtol=5)]


# Layout bshd: token-major q [B, T, H, d], keys as rows k [B, S, Hkv, d], v [B,
# S, Hkv, dv]; the references move them into the default layout (each key/value
# head repeated for its H / Hkv query heads) and the results back, a shared
# head's gradients summed over its query heads.
def heads_first(q, k, v):
    group = q.shape[2] // k.shape[2]
    kh = np.repeat(k.transpose(0, 2, 1, 3), group, axis=1)
    return q.transpose(0, 2, 1, 3), kh.transpose(0, 1, 3, 2), np.repeat(v.transpose(0, 2, 1, 3), group, axis=1)


def attention_bshd_ref(ins, attrs, t):
    y = attention_ref(list(heads_first(*ins[:3])) + list(ins[3:]), attrs, t)[0]
    return [y.transpose(0, 2, 1, 3)]


def attention_grad_bshd_ref(ins, attrs, t):
    dy, q, k, v = ins[:4]
    group = q.shape[2] // k.shape[2]
    dq, dkt, dv = attention_grad_ref([dy.transpose(0, 2, 1, 3)] + list(heads_first(q, k, v)) + list(ins[4:]), attrs, t)

    def shared(g):  # [B, H, S, .] -> [B, S, Hkv, .], summed over each key/value head's query heads
        b, h, s_, c = g.shape
        return g.reshape(b, h // group, group, s_, c).sum(2).transpose(0, 2, 1, 3)
    return [dq.transpose(0, 2, 1, 3), shared(dkt.transpose(0, 1, 3, 2)).astype(np.float32),
            shared(dv).astype(np.float32)]


BSHD = {"layout": "bshd"}
CASES["Attention"] += [
    Case(lambda t, r: [rand(r, (2, 5, 4, 8), t), rand(r, (2, 7, 2, 8), t), rand(r, (2, 7, 2, 6), t)],
         attrs={**BSHD, "scale": 0.5}, ref=attention_bshd_ref, label="bshd, 2 query heads per key head"),
    Case(lambda t, r: [rand(r, (2, 9, 4, 8), t), rand(r, (2, 9, 2, 8), t), rand(r, (2, 9, 2, 8), t), causal(9)],
         attrs={**BSHD, "scale": 0.5}, ref=attention_bshd_ref, label="bshd, causal, grouped heads"),
    Case(lambda t, r: [rand(r, (2, 6, 2, 8), t), rand(r, (2, 6, 1, 8), t), rand(r, (2, 6, 1, 8), t), causal(6),
                       np.array([[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3]], np.int64)],
         attrs={**BSHD, "scale": 0.5}, ref=attention_bshd_ref, label="bshd, causal, packed sequences, one key head"),
    Case(lambda t, r: [rand(r, (2, 4, 2, 8), t), rand(r, (2, 6, 2, 8), t), rand(r, (2, 6, 2, 8), t), padded_rows()],
         attrs={**BSHD, "zero_masked_rows": 1}, ref=attention_bshd_ref, label="bshd, padding mask per batch row"),
    Case(lambda t, r: [rand(r, (1, 4, 3, 8), t), rand(r, (1, 4, 2, 8), t), rand(r, (1, 4, 2, 8), t)],
         attrs=BSHD, ref=attention_bshd_ref, error="not a multiple", label="bshd, 3 query heads over 2 key heads")]
CASES["AttentionGrad"] += [
    Case(lambda t, r: [rand(r, (2, 5, 4, 6), t), rand(r, (2, 5, 4, 8), t), rand(r, (2, 7, 2, 8), t),
                       rand(r, (2, 7, 2, 6), t)], attrs={**BSHD, "scale": 0.5}, outputs=3, ref=attention_grad_bshd_ref,
         label="bshd, 2 query heads per key head", rtol=5),
    Case(lambda t, r: [rand(r, (1, 9, 4, 8), t), rand(r, (1, 9, 4, 8), t), rand(r, (1, 9, 1, 8), t),
                       rand(r, (1, 9, 1, 8), t), causal(9)], attrs={**BSHD, "scale": 0.5}, outputs=3,
         ref=attention_grad_bshd_ref, label="bshd, causal, one key head", rtol=5),
    Case(lambda t, r: [rand(r, (2, 4, 2, 8), t), rand(r, (2, 4, 2, 8), t), rand(r, (2, 6, 2, 8), t),
                       rand(r, (2, 6, 2, 8), t), padded_rows()], attrs={**BSHD, "zero_masked_rows": 1}, outputs=3,
         ref=attention_grad_bshd_ref, label="bshd, padding hides every key of some rows", rtol=5)]


# The row statistics (sd-attention-stats): Attention's second result, and
# AttentionGrad given the forward's y and statistics (the CPU recomputes; a
# fused backward reads them, so they must be the forward's).
def with_forward(make, attrs):
    """AttentionGrad inputs from `make` (dy, q, kt, v, mask) plus positions
    (none), the forward's y in the case's type and its f32 statistics."""
    def full(t, r):
        ins = make(t, r)
        y, lse = attention_lse_ref(ins[1:], attrs, t)
        return ins + [None] * (6 - len(ins)) + [y.astype(NP[t]), lse]
    return full


CASES["Attention"] += [
    Case(lambda t, r: [rand(r, (2, 2, 9, 8), t), rand(r, (2, 2, 8, 9), t), rand(r, (2, 2, 9, 8), t), causal(9)],
         attrs={"scale": 0.5}, outputs=2, ref=attention_lse_ref, label="causal, row statistics"),
    Case(lambda t, r: [rand(r, (2, 9, 4, 8), t), rand(r, (2, 9, 2, 8), t), rand(r, (2, 9, 2, 8), t), causal(9)],
         attrs={**BSHD, "scale": 0.5}, outputs=2, ref=attention_lse_ref, label="bshd, causal, row statistics"),
    Case(lambda t, r: [rand(r, (2, 6, 2, 8), t), rand(r, (2, 6, 1, 8), t), rand(r, (2, 6, 1, 8), t), causal(6),
                       np.array([[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3]], np.int64)],
         attrs={**BSHD, "scale": 0.5}, outputs=2, ref=attention_lse_ref, label="bshd, packed, row statistics"),
    Case(lambda t, r: [rand(r, (2, 1, 4, 4), t), rand(r, (2, 1, 4, 6), t), rand(r, (2, 1, 6, 3), t), padded_rows()],
         attrs={"zero_masked_rows": 1}, outputs=2, ref=attention_lse_ref,
         label="rows that see no key: statistics -inf")]
_causal_bshd = {**BSHD, "scale": 0.5}


# Masks that differ between items with a finite fill (CUDA: cuDNN's SDPA
# takes them as a bias per batch row or per item): right padding under the
# causal band with transformers' fill (the float minimum), one [B, 1, T, S]
# mask shared by a row's heads; and an arbitrary mask per item.
def causal_padding(lengths, T):
    m = np.repeat(causal(T)[None, None], len(lengths), axis=0)
    for b, n in enumerate(lengths):
        m[b, :, :, n:] = True
    return m


def mask_per_item(r, shape):
    """A random [..., T, S] mask that leaves each row its diagonal key."""
    return r.integers(0, 2, shape).astype(bool) & ~np.eye(shape[-2], shape[-1], dtype=bool)


HF_FILL = {"mask_value": float(np.finfo(np.float32).min)}
CASES["Attention"] += [
    Case(lambda t, r: [rand(r, (2, 6, 4, 8), t), rand(r, (2, 6, 2, 8), t), rand(r, (2, 6, 2, 8), t),
                       causal_padding([6, 4], 6)], attrs={**_causal_bshd, **HF_FILL}, ref=attention_bshd_ref,
         label="bshd, causal band and right padding per batch row, the float minimum as fill"),
    Case(lambda t, r: [rand(r, (2, 2, 5, 8), t), rand(r, (2, 2, 8, 7), t), rand(r, (2, 2, 7, 8), t),
                       mask_per_item(r, (2, 2, 5, 7))], attrs={"mask_value": -1e4}, ref=attention_ref,
         label="a mask per item, finite fill")]
CASES["AttentionGrad"] += [
    Case(lambda t, r: [rand(r, (2, 6, 4, 8), t), rand(r, (2, 6, 4, 8), t), rand(r, (2, 6, 2, 8), t),
                       rand(r, (2, 6, 2, 8), t), causal_padding([6, 4], 6)], attrs={**_causal_bshd, **HF_FILL},
         outputs=3, ref=attention_grad_bshd_ref, label="bshd, causal band and right padding per batch row", rtol=5),
    Case(lambda t, r: [rand(r, (2, 2, 5, 8), t), rand(r, (2, 2, 5, 8), t), rand(r, (2, 2, 8, 7), t),
                       rand(r, (2, 2, 7, 8), t), mask_per_item(r, (2, 2, 5, 7))], attrs={"mask_value": -1e4},
         outputs=3, ref=attention_grad_ref, label="a mask per item, finite fill", rtol=5),
    Case(lambda t, r: [rand(r, (2, 6, 2, 8), t), rand(r, (2, 6, 2, 8), t), rand(r, (2, 6, 1, 8), t),
                       rand(r, (2, 6, 1, 8), t), causal(6), np.array([[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3]],
                                                                     np.int64)],
         attrs=_causal_bshd, outputs=3, ref=attention_grad_bshd_ref, label="bshd, causal, packed sequences", rtol=5)]
CASES["AttentionGrad"] += [
    Case(with_forward(lambda t, r: [rand(r, (1, 2, 9, 8), t), rand(r, (1, 2, 9, 8), t), rand(r, (1, 2, 8, 9), t),
                                    rand(r, (1, 2, 9, 8), t), causal(9)], {"scale": 0.5}),
         attrs={"scale": 0.5}, outputs=3, ref=attention_grad_ref, label="causal, the forward's statistics", rtol=5),
    Case(with_forward(lambda t, r: [rand(r, (2, 9, 4, 8), t), rand(r, (2, 9, 4, 8), t), rand(r, (2, 9, 2, 8), t),
                                    rand(r, (2, 9, 2, 8), t), causal(9)], _causal_bshd),
         attrs=_causal_bshd, outputs=3, ref=attention_grad_bshd_ref, label="bshd, causal, the forward's statistics",
         rtol=5)]


# QkvAttention (sd-qkv-attention): layout bshd on one qkv [B, T, H + 2 Hkv, d]
# holding each token's q, then k, then v heads; the references split it and
# run layout bshd's, and the gradient's three results go back side by side.
def qkv_parts(qkv, attrs):
    kv = attrs["kv_heads"]
    h = qkv.shape[2] - 2 * kv
    return [qkv[:, :, :h], qkv[:, :, h:h + kv], qkv[:, :, h + kv:]]


def qkv_attention_ref(ins, attrs, t):
    return attention_bshd_ref(qkv_parts(ins[0], attrs) + list(ins[1:]), attrs, t)


def qkv_attention_lse_ref(ins, attrs, t):
    return attention_lse_ref(qkv_parts(ins[0], attrs) + list(ins[1:]), {**attrs, **BSHD}, t)


def qkv_attention_grad_ref(ins, attrs, t):
    grads = attention_grad_bshd_ref([ins[0]] + qkv_parts(ins[1], attrs) + list(ins[2:3]), attrs, t)
    return [np.concatenate(grads, axis=2)]


def with_qkv_forward(make, attrs):
    """QkvAttentionGrad inputs (dy, qkv, mask) plus positions (none), the
    forward's y in the case's type and its f32 statistics."""
    def full(t, r):
        ins = make(t, r)
        y, lse = qkv_attention_lse_ref(ins[1:], attrs, t)
        return ins + [None] * (4 - len(ins)) + [y.astype(NP[t]), lse]
    return full


_qkv = {"scale": 0.5, "kv_heads": 2}
CASES["QkvAttention"] = [
    Case(lambda t, r: [rand(r, (2, 9, 8, 8), t), causal(9)], attrs=_qkv, ref=qkv_attention_ref,
         label="causal, 4 query heads over 2 key/value heads"),
    Case(lambda t, r: [rand(r, (2, 5, 12, 8), t)], attrs={"scale": 0.5, "kv_heads": 4}, ref=qkv_attention_ref,
         label="no mask, one key/value head per query head (GPT-2's c_attn)"),
    Case(lambda t, r: [rand(r, (2, 6, 4, 8), t), causal(6), np.array([[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3]], np.int64)],
         attrs={"scale": 0.5, "kv_heads": 1}, ref=qkv_attention_ref,
         label="causal, packed sequences, one key/value head (multi-query)"),
    Case(lambda t, r: [rand(r, (2, 4, 6, 8), t), padded_rows()[:, :, :, :4]], attrs={"zero_masked_rows": 1, "kv_heads": 2},
         ref=qkv_attention_ref, label="padding mask per batch row"),
    Case(lambda t, r: [rand(r, (2, 9, 8, 8), t), causal(9)], attrs=_qkv, outputs=2, ref=qkv_attention_lse_ref,
         label="causal, row statistics"),
    Case(lambda t, r: [rand(r, (1, 4, 7, 8), t)], attrs={"kv_heads": 2}, ref=qkv_attention_ref,
         error="multiple of", label="3 query heads over 2 key/value heads")]
CASES["QkvAttentionGrad"] = [
    Case(lambda t, r: [rand(r, (2, 9, 4, 8), t), rand(r, (2, 9, 8, 8), t), causal(9)], attrs=_qkv, outputs=1,
         ref=qkv_attention_grad_ref, label="causal, 4 query heads over 2 key/value heads", rtol=5),
    Case(lambda t, r: [rand(r, (2, 5, 3, 8), t), rand(r, (2, 5, 9, 8), t)], attrs={"scale": 0.5, "kv_heads": 3},
         outputs=1, ref=qkv_attention_grad_ref, label="no mask, GPT-2's c_attn", rtol=5),
    Case(lambda t, r: [rand(r, (1, 9, 4, 8), t), rand(r, (1, 9, 6, 8), t), causal(9)],
         attrs={"scale": 0.5, "kv_heads": 1}, outputs=1, ref=qkv_attention_grad_ref,
         label="causal, one key/value head (multi-query)", rtol=5),
    Case(with_qkv_forward(lambda t, r: [rand(r, (2, 9, 4, 8), t), rand(r, (2, 9, 8, 8), t), causal(9)], _qkv),
         attrs=_qkv, outputs=1, ref=qkv_attention_grad_ref, label="causal, the forward's statistics", rtol=5)]


# ---- driver -----------------------------------------------------------------------------------------------------

def bind_only(backend):
    """Every case of every kernel the backend registers, for every type it
    claims, through the shape rule and the backend's binding, without running:
    a registry that refuses the operand types of a case its kernel should
    take shows here on machines without the device."""
    problems, runs = [], 0
    kernels = {k["op"]: k for k in _sdops.kernels(backend)}
    for op, ci, case, t in claimed_cases(kernels):
        if case.error:
            continue
        inputs = case.make(t, np.random.default_rng(zlib.crc32(case_key(op, ci, t).encode())))
        runs += 1
        try:
            _sdops.run(backend, op, case.attrs, inputs, case.outputs, bind_only=True)
        except RuntimeError as e:
            if not left_to_cpu(backend, op, e):
                problems.append(f"{op} [{case.label or 'case ' + str(ci)}] {t}: {e}")
    if LEFT_TO_CPU:
        print(f"op harness ({backend}): results left to the CPU's kernel: {', '.join(sorted(LEFT_TO_CPU))}")
    for p in problems:
        print("FAIL", p)
    print(f"op harness ({backend}, binding only): {len(kernels)} kernels, {runs} cases bound, {len(problems)} problems")
    return 1 if problems else 0


class _PortableOnly:
    """A meta-path finder that refuses every module outside the places a GPU
    machine's copy of the harness has: the standard library, NumPy and
    ml_dtypes (the bundle's python/run)."""
    def __init__(self):
        # The standard library (the interpreter's, not a virtual environment's,
        # whose site-packages it does not hold), NumPy and ml_dtypes.
        self.stdlib = os.path.realpath(os.path.dirname(os.__file__))
        self.packages = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep for m in (np, ml_dtypes))

    def portable(self, origin):
        if origin is None or origin in ("built-in", "frozen"):
            return True
        path = os.path.realpath(origin)
        if path.startswith(self.stdlib + os.sep):
            return "-packages" not in path[len(self.stdlib):]
        return path.startswith(self.packages)

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and not self.portable(spec.origin):
            raise ImportError(f"{name} is not where the references replay")
        return None  # the usual finders import it


def numpy_alone_gives(op, case, inputs, t, ref):
    """Whether case.ref computes `ref` again, bit for bit, with only the
    standard library, NumPy and ml_dtypes importable (what the GPU machine
    runs it with): every other loaded module hidden (None in sys.modules
    stops an import), every other import refused."""
    finder = _PortableOnly()
    hidden = {name: m for name, m in list(sys.modules.items())
              if m is not None and name not in ("__main__", "_sdops") and not finder.portable(getattr(m, "__file__", None))}
    sys.modules.update(dict.fromkeys(hidden))
    sys.meta_path.insert(0, finder)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            again = reference(op, case, inputs, None, t)
    except ImportError:
        return False
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(hidden)
    return len(again) == len(ref) and all(
        np.asarray(a).dtype == np.asarray(b).dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
        for a, b in zip(again, ref))


def write_references(backend, path):
    """Every case the backend's kernels would run (seed 0): its inputs' digest
    and its reference outputs, into one pickle file (no device needed)."""
    import pickle
    saved, runs = {}, 0
    for op, ci, case, t in claimed_cases({k["op"]: k for k in _sdops.kernels(backend)}):
        if case.error:
            continue
        inputs = case.make(t, np.random.default_rng(case_seed(op, ci, t, 0)))
        try:
            ref = reference(op, case, inputs, None, t)
        except Exception as e:
            print(f"FAIL {op} [{case.label or 'case ' + str(ci)}] {t}: reference failed: {e}")
            return 1
        entry = saved[case_key(op, ci, t)] = {"digest": digest(inputs)}
        # A reference NumPy alone computes is made again where the references
        # replay (the carried file stays small: GroupedAdamW's and the
        # collectives' references are most of its bytes); one that needs
        # onnx.reference or PyTorch is saved.
        if case.ref == "onnx" or not numpy_alone_gives(op, case, inputs, t, ref):
            entry["ref"] = [np.asarray(r) for r in ref]
        if case.made_by_cpu_kernel:
            entry["inputs"] = inputs
        runs += 1
    with open(path, "wb") as f:
        pickle.dump(saved, f, protocol=4)
    kept = sum("ref" in e for e in saved.values())
    print(f"op harness ({backend}): references of {runs} cases written to {path} "
          f"({kept} saved, {runs - kept} made again by NumPy where they replay)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--skip-if-absent", action="store_true",
                    help="exit 77 (skipped) when the backend is not usable on this machine")
    ap.add_argument("--bind-only", action="store_true",
                    help="check only that the backend's kernels bind every case's operand types (no device needed)")
    ap.add_argument("--op", action="append", help="run only these ops (repeatable)")
    ap.add_argument("--seed", type=int, default=0, help="varies every case's random inputs (default 0)")
    ap.add_argument("--write-references", metavar="FILE",
                    help="write every --backend case's inputs' digest and reference outputs to FILE (no device needed)")
    ap.add_argument("--references", metavar="FILE",
                    help="take reference outputs from FILE (written by --write-references) where it has them")
    ap.add_argument("--saved-only", action="store_true",
                    help="with --references: run only the cases FILE has (the backend they were written for)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.bind_only:
        return bind_only(args.backend)
    if args.write_references:
        return write_references(args.backend, args.write_references)
    if args.references:
        import pickle
        with open(args.references, "rb") as f:
            SAVED.update(pickle.load(f))
    reason = _sdops.unavailable_reason(args.backend)
    if reason:
        print(f"op harness ({args.backend}): skipped: {reason}")
        return 77 if args.skip_if_absent else 1

    kernels = {k["op"]: k for k in _sdops.kernels(args.backend)}
    # Loop and If steps run other entries of their plan, so the session runs
    # them, not a kernel (test_control_flow checks them against ONNX Runtime).
    schemas = {s["name"] for s in _sdops.schemas()} - {"Loop", "If"}
    problems = []
    if args.backend == "cpu" and set(kernels) != schemas:
        problems.append(f"schemas without a CPU kernel: {sorted(schemas - set(kernels))}; "
                        f"kernels without a schema: {sorted(set(kernels) - schemas)}")
    missing = sorted(set(kernels) - set(CASES))
    if missing:
        problems.append(f"kernels with no harness case: {missing}")
    stale = sorted(set(CASES) - set(kernels))
    if stale and not args.op and args.backend == "cpu":
        problems.append(f"cases for ops the {args.backend} backend does not register: {stale}")
    elif stale and not args.op:  # a GPU backend covers a subset; plans needing the rest are refused at session creation
        print(f"op harness ({args.backend}): {len(stale)} ops have no {args.backend} kernel yet: {' '.join(stale)}")
    runs = 0
    for op in sorted(kernels):
        if args.op and op not in args.op or op not in CASES:
            continue
        claimed = kernels[op]["types"]
        tested = set()
        for ci, case in enumerate(CASES[op]):
            for t in claimed:
                if case.types is not None and t not in case.types:
                    continue
                if args.saved_only and case_key(op, ci, t) not in SAVED:
                    continue
                tested.add(t)
                runs += 1
                err = run_case(args.backend, op, case, t, seed=case_seed(op, ci, t, args.seed),
                               key=case_key(op, ci, t) if args.seed == 0 else None)
                where = f"{op} [{case.label or 'case ' + str(ci)}] {t}"
                if err:
                    problems.append(f"{where}: {err}")
                elif args.verbose:
                    print(f"ok  {where}")
        untested = [t for t in claimed if t not in tested]
        if untested and not args.saved_only:
            problems.append(f"{op}: claims {untested}, which no case runs")
    if LEFT_TO_CPU:
        print(f"op harness ({args.backend}): results left to the CPU's kernel: {', '.join(sorted(LEFT_TO_CPU))}")
    if GPU_ACCEPTED:
        print(f"op harness ({args.backend}): data-dependent refusals left to the CPU: {sorted(set(GPU_ACCEPTED))}")
    for p in problems:
        print("FAIL", p)
    print(f"op harness ({args.backend}): {len(kernels)} kernels, {runs} runs, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
