#!/usr/bin/env python3
"""Compares a GPU run with the CPU references of a gpu-check bundle, with the
standard library only (the GPU machine may have no NumPy): .npy float32
arrays, metrics.jsonl losses and f32 safetensors files.

  gpu_compare.py logits A.npy B.npy RTOL ATOL
  gpu_compare.py losses A.jsonl B.jsonl RTOL
  gpu_compare.py weights A.safetensors B.safetensors ATOL
  gpu_compare.py same A B            (byte-identical files)
Prints one line; exit 0 when within tolerance."""
import array
import ast
import json
import struct
import sys


def load_npy(path):
    data = open(path, "rb").read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    hlen = struct.unpack("<H", data[8:10])[0] if data[6] == 1 else struct.unpack("<I", data[8:12])[0]
    start = 10 + hlen if data[6] == 1 else 12 + hlen
    header = ast.literal_eval(data[start - hlen:start].decode("latin1"))
    if header["descr"] != "<f4":
        raise ValueError(f"{path}: {header['descr']}, expected <f4")
    values = array.array("f")
    values.frombytes(data[start:])
    return values


def load_safetensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {info['dtype']}, expected F32")
        a, b = info["data_offsets"]
        values = array.array("f")
        values.frombytes(data[8 + n + a:8 + n + b])
        tensors[name] = values
    return tensors


def losses(path):
    return [json.loads(line)["loss"] for line in open(path) if '"loss"' in line]


def main(argv):
    kind = argv[1]
    if kind == "logits":
        a, b, rtol, atol = load_npy(argv[2]), load_npy(argv[3]), float(argv[4]), float(argv[5])
        worst = max((abs(x - y) - (atol + rtol * abs(y)) for x, y in zip(a, b)), default=0.0)
        diff = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
        ok = len(a) == len(b) and worst <= 0
        print(f"{len(a)} values, max |diff| {diff:.3g}")
    elif kind == "losses":
        a, b, rtol = losses(argv[2]), losses(argv[3]), float(argv[4])
        rel = max((abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b)), default=float("inf"))
        ok = len(a) == len(b) and len(a) > 0 and rel <= rtol
        print(f"{len(a)} losses, max relative diff {rel:.3g}")
    elif kind == "weights":
        a, b, atol = load_safetensors(argv[2]), load_safetensors(argv[3]), float(argv[4])
        diff = max((abs(x - y) for k in b for x, y in zip(a.get(k, []), b[k])), default=0.0)
        ok = set(a) == set(b) and all(len(a[k]) == len(b[k]) for k in b) and diff <= atol
        print(f"{len(b)} tensors, max |diff| {diff:.3g}")
    elif kind == "same":
        ok = open(argv[2], "rb").read() == open(argv[3], "rb").read()
        print("identical" if ok else "differ")
    else:
        print(f"unknown comparison '{kind}'")
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"cannot compare: {e}")
        sys.exit(1)
