#!/usr/bin/env python3
"""Float8, float4 and 4-/2-bit integers through Cast, against ml_dtypes (what
ONNX's reference uses), exhaustively where the types are small:

  float8     every f16 value (NaN, infinities, subnormals, ties included) cast
             f16 -> f8 -> f32, with saturate=1 and 0, for E4M3FN, E4M3FNUZ,
             E5M2 and E5M2FNUZ, and f16 -> f4 -> f32 for FLOAT4E2M1 (which
             always saturates): equal to ml_dtypes' round-to-nearest-even
             (clipped to the finite range first when saturating), NaN for NaN
  integers   every integer in [-40, 40] cast i32 -> int4/uint4/int2/uint2 ->
             i32: wrapped as ml_dtypes wraps, and the packed .pb files
             sdrun writes read back by onnx.numpy_helper
"""
import os
import shutil
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from e2e_util import report_checks, sh, tool_paths

RESULTS = []
FLOAT8 = {TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
          TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2, TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
          TensorProto.FLOAT4E2M1: ml_dtypes.float4_e2m1fn}
INTS = {TensorProto.INT4: ml_dtypes.int4, TensorProto.UINT4: ml_dtypes.uint4, TensorProto.INT2: ml_dtypes.int2,
        TensorProto.UINT2: ml_dtypes.uint2}


def cast_chain(path, in_type, mid_type, out_type, n, saturate=None):
    """x -> Cast(mid) -> y (the narrow values) -> Cast(out) -> z."""
    extra = {} if saturate is None else {"saturate": saturate}
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=mid_type, **extra), helper.make_node("Cast", ["y"], ["z"], to=out_type)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", in_type, [n])],
                          [helper.make_tensor_value_info("y", mid_type, [n]), helper.make_tensor_value_info("z", out_type, [n])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]), path)


def run(sdc, sdrun, model, x, tmp, tag):
    plan, out = os.path.join(tmp, tag + ".sdp"), os.path.join(tmp, tag)
    sh([sdc, "compile", model, "-o", plan])
    xin = os.path.join(tmp, tag + "_x.pb")
    with open(xin, "wb") as f:
        f.write(numpy_helper.from_array(x, "x").SerializeToString())
    sh([sdrun, "infer", plan, "--input", f"x={xin}", "--output-dir", out, "--output-format", "pb"])
    outs = []
    for i in range(2):
        t = TensorProto()
        with open(os.path.join(out, f"output_{i}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        outs.append(numpy_helper.to_array(t))
    return outs


def main():
    sdc, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_narrow_")
    try:
        halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
        for onnx_type, ml in FLOAT8.items():
            name = TensorProto.DataType.Name(onnx_type)
            info = ml_dtypes.finfo(ml)
            for saturate in (1, 0):
                model = os.path.join(tmp, f"{name}_{saturate}.onnx")
                cast_chain(model, TensorProto.FLOAT16, onnx_type, TensorProto.FLOAT, halves.size, saturate)
                narrow, wide = run(sdc, sdrun, model, halves, tmp, f"{name}_{saturate}")
                x = halves.astype(np.float32)
                saturating = saturate or onnx_type == TensorProto.FLOAT4E2M1  # float4 has no inf or NaN
                with np.errstate(all="ignore"):  # the NaNs and infinities among the f16 values
                    want = (np.clip(x, float(info.min), float(info.max)) if saturating else x).astype(ml)
                same_bits = (narrow.view(np.uint8) == want.view(np.uint8)) | (np.isnan(want.astype(np.float32))
                                                                               & np.isnan(narrow.astype(np.float32)))
                same_wide = np.array_equal(wide, want.astype(np.float32), equal_nan=True)
                bad = np.flatnonzero(~same_bits)
                RESULTS.append((f"f16 -> {name} (saturate={saturate}) -> f32: all 65536 f16 values round as ml_dtypes",
                                not bad.size and same_wide,
                                f"{bad.size} differ" + (f", first {x[bad[0]]!r}: {narrow[bad[0]]!r} vs "
                                                        f"{want[bad[0]]!r}" if bad.size else "")))
        ints = np.arange(-40, 41, dtype=np.int32)
        for onnx_type, ml in INTS.items():
            name = TensorProto.DataType.Name(onnx_type)
            model = os.path.join(tmp, f"{name}.onnx")
            cast_chain(model, TensorProto.INT32, onnx_type, TensorProto.INT32, ints.size)
            narrow, wide = run(sdc, sdrun, model, ints, tmp, name)
            want = ints.astype(ml)
            RESULTS.append((f"i32 -> {name} -> i32: [-40, 40] wrapped as ml_dtypes, packed .pb read back by onnx",
                            narrow.dtype == want.dtype and np.array_equal(narrow.astype(np.int32), want.astype(np.int32))
                            and np.array_equal(wide, want.astype(np.int32)),
                            f"first values {narrow[:6].astype(np.int32).tolist()} vs {want[:6].astype(np.int32).tolist()}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report_checks("test_narrow_types", RESULTS)


if __name__ == "__main__":
    sys.exit(main())
