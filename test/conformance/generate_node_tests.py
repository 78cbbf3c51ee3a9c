#!/usr/bin/env python3
"""Writes the backend node tests of the installed `onnx` wheel (current
opsets, far newer than Debian's libonnx 1.12 test data) as test-data folders:
OUT/node/<test>/model.onnx and test_data_set_N/{input,output}_K.pb, the layout
ONNX's own generate-data tool writes. The wheel ships the node cases as
Python generators, not data, so the data is made here, once per onnx version
(OUT/VERSION records it)."""
import argparse
import os
import shutil
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node


def serialize(value, value_info):
    t = value_info.type
    if t.HasField("sequence_type"):
        return numpy_helper.from_list(value, value_info.name).SerializeToString()
    if t.HasField("optional_type"):
        return numpy_helper.from_optional(value, value_info.name).SerializeToString()
    if t.HasField("map_type"):
        return numpy_helper.from_dict(value, value_info.name).SerializeToString()
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, value_info.name).SerializeToString()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder to write node/<test>/ into")
    a = ap.parse_args()
    stamp = os.path.join(a.out, "VERSION")
    if os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        return 0
    root = os.path.join(a.out, "node")
    shutil.rmtree(root, ignore_errors=True)
    cases = node.collect_testcases()
    for case in cases:
        d = os.path.join(root, case.name)
        os.makedirs(d)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        for i, (inputs, outputs) in enumerate(case.data_sets):
            ds = os.path.join(d, f"test_data_set_{i}")
            os.makedirs(ds)
            for kind, values, infos in (("input", inputs, case.model.graph.input),
                                        ("output", outputs, case.model.graph.output)):
                for j, v in enumerate(values):
                    with open(os.path.join(ds, f"{kind}_{j}.pb"), "wb") as f:
                        f.write(serialize(v, infos[j]))
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"generate_node_tests: {len(cases)} node tests of onnx {onnx.__version__} in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
