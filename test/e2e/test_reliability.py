#!/usr/bin/env python3
"""Issue 11's defects, each as the reproduction that once broke: checkpoints
of different runs, manifest tampering, memory and file-size limits, torn
adapter folders, NaN/Inf adapters and weights, FIFOs and /dev/zero as inputs,
two writers on one folder, output paths checked before training, metrics after
a resume, duplicate JSON keys and crafted safetensors. Every failure must be a
clean one-line error (e2e_util.clean_error_problems): no hang, no signal, no
file left behind."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

from e2e_util import leftovers, export_tiny_gpt, ROOT, clean_error_problems, tool_paths

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append((name, [] if ok else [detail or "failed"]))


def expect_clean_error(name, cmd, must_contain=(), no_files=(), timeout=60):
    problems, line = clean_error_problems(cmd, must_contain, no_files, timeout)
    RESULTS.append((name, problems))
    return line


def run(cmd, timeout=120, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        return None


def limited(kind, amount, cmd):
    """cmd under `ulimit -<kind> <amount>` (v: KiB of address space, f: 1 KiB blocks of file size)."""
    return ["sh", "-c", f'ulimit -{kind} {amount}; exec "$@"', "sh"] + cmd


# CRC32C (Castagnoli), to re-sign manifests the way an attacker or a bit flip
# in RAM before the checksum would: the manifest then verifies and its values
# must still be checked.
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


SELF_KEY = ',"manifest_crc32c":'


def edit_manifest(folder, old, new, resign):
    path = os.path.join(folder, "manifest.json")
    text = open(path).read()
    if SELF_KEY not in text:  # a manifest without a checksum (sdrun before issue 11): edit it as it is
        open(path, "w").write(text.replace(old, new, 1))
        return
    body = text[:text.rindex(SELF_KEY)]
    assert old in body, (old, body[:200])
    body = body.replace(old, new, 1)
    crc = crc32c(body.encode()) if resign else int(text[text.rindex(SELF_KEY) + len(SELF_KEY):-2])
    open(path, "w").write(body + SELF_KEY + str(crc) + "}\n")


def checkpoints(folder):
    return sorted((int(n.split("-")[1]) for n in os.listdir(folder) if n.startswith("checkpoint-")))


def read_st(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


def poison_adapter(src, dst, value):
    """Copy of adapter folder src whose first lora_A tensor is all `value`."""
    shutil.copytree(src, dst)
    header, data = read_st(os.path.join(dst, "adapter_model.safetensors"))
    name = sorted(k for k in header if k.endswith("lora_A.weight"))[0]
    a, b = header[name]["data_offsets"]
    data = data[:a] + np.full((b - a) // 4, value, np.float32).tobytes() + data[b:]
    write_st(os.path.join(dst, "adapter_model.safetensors"), header, data)
    return name


def main():
    sdc, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_reliability_")
    gpt = export_tiny_gpt(tmp)
    plan = os.path.join(tmp, "lora.sdp")
    subprocess.run([sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv", "--lora-r", "4", "--shapes",
                    "input_ids=2x8", "--infer-shapes", "input_ids=1x8", "-o", plan], check=True)
    data = os.path.join(tmp, "train.jsonl")
    with open(data, "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"l{i} hi"}) + "\n")
    train = [sdrun, "train", plan, "--data", data, "--threads", "1"]

    # --- Defect 2: checkpoints of one run pruned or resumed by another.
    d = os.path.join(tmp, "ck")
    subprocess.run(train + ["--steps", "20", "--checkpoint-dir", d, "--checkpoint-every", "5"], check=True,
                   capture_output=True)
    before = checkpoints(d)
    expect_clean_error("a fresh run refuses a folder holding another run's checkpoints",
                       train + ["--steps", "6", "--checkpoint-dir", d, "--checkpoint-every", "2"],
                       ["already holds", "--resume"])
    check("... and leaves that run's checkpoints alone", checkpoints(d) == before == [15, 20], f"{before} -> {checkpoints(d)}")
    expect_clean_error("--resume with --steps below the checkpoint's step (trained nothing, exit 0)",
                       train + ["--steps", "10", "--checkpoint-dir", d, "--resume"], ["past this run's 10 steps"])
    r = run(train + ["--steps", "20", "--checkpoint-dir", d, "--resume"])
    check("--resume of a finished run: nothing to train, exit 0", r and r.returncode == 0 and "nothing left" in r.stderr,
          r.stderr.strip() if r else "hung")
    other = os.path.join(tmp, "other.jsonl")
    open(other, "w").write('{"text": "xyz"}\n')
    expect_clean_error("--resume with other data", [sdrun, "train", plan, "--data", other, "--steps", "25",
                                                     "--checkpoint-dir", d, "--resume"], ["same data file"])
    expect_clean_error("--resume with another --seed", train + ["--steps", "25", "--seed", "4", "--checkpoint-dir", d,
                                                              "--resume"], ["seed", "same seed"])
    # Pruning counts only this run's complete checkpoints: newer empty or
    # corrupt folders neither count nor cost the valid older ones.
    d2 = os.path.join(tmp, "ck_prune")
    shutil.copytree(d, d2)
    os.makedirs(os.path.join(d2, "checkpoint-100"))
    shutil.copytree(os.path.join(d2, "checkpoint-20"), os.path.join(d2, "checkpoint-99"))
    state = os.path.join(d2, "checkpoint-99", "state.safetensors")
    raw = bytearray(open(state, "rb").read())
    raw[-5] ^= 0x10
    open(state, "wb").write(bytes(raw))
    r = run(train + ["--steps", "30", "--checkpoint-dir", d2, "--checkpoint-every", "5", "--resume"])
    check("resume skips an empty and a corrupt newer folder, pruning keeps this run's newest two",
          r and r.returncode == 0 and checkpoints(d2) == [25, 30, 99, 100] and "checkpoint-99 skipped" in r.stderr,
          f"exit {r.returncode if r else 'hung'}, {checkpoints(d2)}")

    # A checkpoint in the format before sharded checkpoints (version 2: one
    # state file, a CRC32C per tensor) still resumes.
    d_v2 = os.path.join(tmp, "ck_v2")
    shutil.copytree(d, d_v2)
    path = os.path.join(d_v2, "checkpoint-20", "manifest.json")
    m = json.loads(open(path).read())
    m["version"] = 2
    m["files"] = {"state.safetensors": {k: v for k, v in m["files"]["state.safetensors"].items() if k != "rank"}}
    m["tensors_crc32c"] = {name: pieces[0]["crc32c"] for name, pieces in m.pop("tensors").items()}
    del m["world_size"], m["manifest_crc32c"]
    body = json.dumps(m, separators=(",", ":"))[:-1]
    open(path, "w").write(body + SELF_KEY + str(crc32c(body.encode())) + "}\n")
    r = run(train + ["--steps", "21", "--checkpoint-dir", d_v2, "--resume"])
    check("a version-2 checkpoint (one state file, before sharded checkpoints) resumes",
          r and r.returncode == 0 and "checkpoint-20 (step 20)" in r.stderr and "skipped" not in r.stderr,
          r.stderr.strip()[-300:] if r else "hung")

    # --- Defect 3: the manifest has a checksum; re-signed nonsense is refused.
    for label, old, new, resign, needle in [
            ("a bit flip in the step", '"step":20', '"step":28', False, "fails its checksum"),
            ("a bit flip in the position", '"position":', '"position":1', False, "fails its checksum"),
            ("a re-signed negative position (was SIGSEGV)", '"position":', '"position":-', True, "malformed manifest"),
            ("a re-signed negative step (was a negative LR)", '"step":20', '"step":-20', True, "malformed manifest")]:
        d3 = os.path.join(tmp, "ck_manifest")
        shutil.rmtree(d3, ignore_errors=True)
        shutil.copytree(d, d3)
        edit_manifest(os.path.join(d3, "checkpoint-20"), old, new, resign)
        r = run(train + ["--steps", "20", "--checkpoint-dir", d3, "--resume"])
        check(f"manifest with {label}: skipped, resumed from the older checkpoint",
              r and r.returncode == 0 and needle in r.stderr and "checkpoint-15 (step 15)" in r.stderr,
              r.stderr.strip()[-300:] if r else "hung")
    d3 = os.path.join(tmp, "ck_position")
    shutil.copytree(d, d3)
    text = open(os.path.join(d3, "checkpoint-20", "manifest.json")).read()
    pos = json.loads(text)["position"]
    edit_manifest(os.path.join(d3, "checkpoint-20"), f'"position":{pos}', '"position":1000000', True)
    expect_clean_error("a re-signed position past the data", train + ["--steps", "25", "--checkpoint-dir", d3,
                                                                      "--resume"], ["outside the 40 examples"])

    # --- Defect 4: memory limits end in an error or success, never a hang.
    for isa in ("", "generic"):
        for kib in (300000, 150000, 100000):
            env = dict(os.environ, SD_CPU_ISA=isa)
            r = run(limited("v", kib, train + ["--steps", "3"]), timeout=60, env=env)
            lines = [l for l in (r.stderr if r else "").splitlines() if "error" in l]
            check(f"train under ulimit -v {kib}{' (OpenBLAS GEMMs)' if isa else ''}: success or a clean error",
                  r is not None and (r.returncode == 0 or (r.returncode == 1 and len(lines) == 1)),
                  "hung" if r is None else f"exit {r.returncode}: {r.stderr.strip()[-200:]}")

    # --- Defect 5: an adapter folder is replaced in one step; other files stay.
    ad = os.path.join(tmp, "adapter")
    subprocess.run(train + ["--steps", "2", "--save-adapter", ad], check=True, capture_output=True)
    open(os.path.join(ad, "README.md"), "w").write("mine\n")
    os.makedirs(os.path.join(tmp, ".adapter.tmp.999999999"))  # a killed writer's staging folder
    subprocess.run(train + ["--steps", "3", "--seed", "1", "--save-adapter", ad], check=True, capture_output=True)
    cfg = json.load(open(os.path.join(ad, "adapter_config.json")))
    check("saving over an adapter keeps its other files and cleans a killed writer's staging folder",
          open(os.path.join(ad, "README.md")).read() == "mine\n" and cfg["r"] == 4 and
          not os.path.exists(os.path.join(tmp, ".adapter.tmp.999999999")) and not leftovers(tmp + "/adapter"),
          str(os.listdir(tmp)))
    r = run(train + ["--steps", "1", "--adapter", ad])
    check("... and the saved adapter loads", r and r.returncode == 0, r.stderr.strip()[-200:] if r else "hung")

    # --- Defect 6: NaN/Inf adapters, alphas and weights are refused.
    merged = os.path.join(tmp, "merged.onnx")
    for value, word in ((np.nan, "NaN"), (np.inf, "Inf")):
        bad = os.path.join(tmp, f"adapter_{word}")
        name = poison_adapter(ad, bad, value)
        expect_clean_error(f"generate with an all-{word} adapter (printed NUL bytes)",
                           [sdrun, "generate", plan, "--prompt", "hi", "--adapter", bad], [name, word])
        expect_clean_error(f"train --adapter with an all-{word} adapter", train + ["--steps", "1", "--adapter", bad],
                           [name, word])
        expect_clean_error(f"merge of an all-{word} adapter", [sdc, "merge", gpt, "--adapter", bad, "-o", merged],
                           [name, word], [merged])
    huge = os.path.join(tmp, "adapter_alpha")
    shutil.copytree(ad, huge)
    cfg = json.load(open(os.path.join(huge, "adapter_config.json")))
    text = json.dumps(cfg).replace(f'"lora_alpha": {json.dumps(cfg["lora_alpha"])}', '"lora_alpha": 1e999')
    open(os.path.join(huge, "adapter_config.json"), "w").write(text)
    expect_clean_error("merge with lora_alpha 1e999", [sdc, "merge", gpt, "--adapter", huge, "-o", merged],
                       ["1e999", "out of range"], [merged])
    big = os.path.join(tmp, "adapter_big_alpha")
    shutil.copytree(ad, big)
    cfg["lora_alpha"] = 3e38
    json.dump(cfg, open(os.path.join(big, "adapter_config.json"), "w"))
    header, blob = read_st(os.path.join(big, "adapter_model.safetensors"))
    blob = np.full(len(blob) // 4, 1e30, np.float32).tobytes()
    write_st(os.path.join(big, "adapter_model.safetensors"), header, blob)
    expect_clean_error("merge whose result overflows f32", [sdc, "merge", gpt, "--adapter", big, "-o", merged],
                       ["overflows"], [merged])
    weights = os.path.join(tmp, "nan_weights.safetensors")
    import onnx
    from onnx import numpy_helper
    init = next(i for i in onnx.load(gpt).graph.initializer if i.data_type == 1 and len(i.dims) == 2)
    w = np.full(tuple(init.dims), np.nan, np.float32)
    write_st(weights, {init.name: {"dtype": "F32", "shape": list(w.shape), "data_offsets": [0, w.nbytes]}}, w.tobytes())
    expect_clean_error("merge --weights holding NaN", [sdc, "merge", gpt, "--weights", weights, "-o", merged],
                       [init.name, "NaN"], [merged])

    # --- Defect 7: file-size limits are errors, and no temp file stays.
    out = os.path.join(tmp, "fs")
    os.makedirs(out)
    cases = [("checkpoint", train + ["--steps", "2", "--checkpoint-dir", os.path.join(out, "ck")]),
             ("--save-weights", train + ["--steps", "1", "--save-weights", os.path.join(out, "w.safetensors")]),
             ("--save-adapter", train + ["--steps", "1", "--save-adapter", os.path.join(out, "ad")]),
             ("sdc compile", [sdc, "compile", gpt, "--shapes", "input_ids=1x8", "-o", os.path.join(out, "p.sdp")]),
             ("sdc merge", [sdc, "merge", gpt, "--adapter", ad, "-o", os.path.join(out, "m.onnx")])]
    cases.append(("--metrics", train + ["--steps", "40", "--metrics", os.path.join(out, "m.jsonl")]))
    for label, cmd in cases:
        # sdrun train prints progress lines before the error: the error must
        # be the last line, and the only one.
        r = run(limited("f", 1, cmd))
        lines = [l for l in (r.stderr if r else "").splitlines() if l.strip()]
        errors = [l for l in lines if "error" in l]
        check(f"{label} under ulimit -f 1: a clean error (was killed by SIGXFSZ)",
              r is not None and r.returncode == 1 and len(errors) == 1 and lines[-1] == errors[0] and
              "file-size limit" in errors[0], "hung" if r is None else f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
        check(f"{label} under ulimit -f 1 leaves no temp files", not leftovers(out), str(leftovers(out)))
    stale = os.path.join(out, "p.sdp.tmp.999999999")
    open(stale, "w").write("torn")
    subprocess.run([sdc, "compile", gpt, "--shapes", "input_ids=1x8", "-o", os.path.join(out, "p.sdp")], check=True)
    check("a killed writer's temp file is removed by the next write", not os.path.exists(stale))

    # --- Defect 9: /dev/zero and FIFOs are refused at once.
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    x = os.path.join(tmp, "ids.npy")
    np.save(x, np.zeros((1, 8), np.int64))
    for label, path in (("/dev/zero", "/dev/zero"), ("a FIFO", fifo)):
        expect_clean_error(f"{label} as --data", train + ["--steps", "1", "--data", path], ["not a regular file"],
                           timeout=20)
        expect_clean_error(f"{label} as the plan", [sdrun, "infer", path, "--input", f"input_ids={x}"],
                           ["not a regular file"], timeout=20)
        expect_clean_error(f"{label} as an input tensor", [sdrun, "infer", plan, "--input", f"input_ids={path}"],
                           ["not a regular file"], timeout=20)
        fake = os.path.join(tmp, "adapter_special")
        shutil.rmtree(fake, ignore_errors=True)
        os.makedirs(fake)
        os.symlink(path, os.path.join(fake, "adapter_config.json"))
        expect_clean_error(f"{label} as an adapter config", [sdc, "merge", gpt, "--adapter", fake, "-o", merged],
                           ["not a regular file"], [merged], timeout=20)
    d9 = os.path.join(tmp, "ck_zero")
    shutil.copytree(d, d9)
    state = os.path.join(d9, "checkpoint-20", "state.safetensors")
    os.remove(state)
    os.symlink("/dev/zero", state)
    r = run(train + ["--steps", "20", "--checkpoint-dir", d9, "--resume"], timeout=30)
    check("/dev/zero as checkpoint state: skipped (grew memory until the OOM killer)",
          r and r.returncode == 0 and "not a regular file" in r.stderr and "checkpoint-15" in r.stderr,
          r.stderr.strip()[-200:] if r else "hung")

    # --- Defect 10: one writer per checkpoint folder.
    d10 = os.path.join(tmp, "ck_two")
    first = subprocess.Popen(train + ["--steps", "100000", "--checkpoint-dir", d10, "--checkpoint-every", "50"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.isdir(d10) and checkpoints(d10):
            break
        time.sleep(0.1)
    expect_clean_error("a second writer on a checkpoint folder",
                       train + ["--steps", "100000", "--checkpoint-dir", d10, "--resume"],
                       ["another process", f"pid {first.pid}"])
    first.send_signal(signal.SIGKILL)
    first.wait()
    r = run(train + ["--steps", "1", "--checkpoint-dir", d10, "--resume"])
    check("the lock dies with its holder: a resume after SIGKILL proceeds", r and "another process" not in r.stderr,
          r.stderr.strip()[-200:] if r else "hung")

    # --- Defect 11: outputs are checked before the first step.
    metrics = os.path.join(tmp, "early.jsonl")
    a_file = os.path.join(tmp, "a_file")
    open(a_file, "w").write("x")
    for label, extra, needle in [
            ("--save-weights in a missing folder", ["--save-weights", os.path.join(tmp, "no", "w.safetensors")],
             "does not exist"),
            ("--checkpoint-dir that is a file", ["--checkpoint-dir", a_file], "not a folder"),
            ("--save-adapter that is a file", ["--save-adapter", a_file], "not a folder"),
            ("--save-weights that is a folder", ["--save-weights", tmp], "is a folder")]:
        expect_clean_error(f"{label}: refused before training", train + ["--steps", "5", "--metrics", metrics] + extra,
                           [needle], [metrics])

    nowhere = os.path.join(tmp, "no", "out")
    expect_clean_error("sdc compile -o in a missing folder: refused before compiling",
                       [sdc, "compile", gpt, "--shapes", "input_ids=1x8", "-o", nowhere + ".sdp"], ["does not exist"])
    expect_clean_error("sdc merge -o in a missing folder: refused before merging",
                       [sdc, "merge", gpt, "--adapter", ad, "-o", nowhere + ".onnx"], ["does not exist"])

    # --- Defect 12, the rest.
    d12, m12 = os.path.join(tmp, "ck_metrics"), os.path.join(tmp, "metrics.jsonl")
    subprocess.run(train + ["--steps", "10", "--checkpoint-dir", d12, "--checkpoint-every", "5", "--metrics", m12],
                   check=True, capture_output=True)
    shutil.rmtree(os.path.join(d12, "checkpoint-10"))  # as if killed after step 10's metrics line
    subprocess.run(train + ["--steps", "10", "--checkpoint-dir", d12, "--resume", "--metrics", m12], check=True,
                   capture_output=True)
    steps = [json.loads(l)["step"] for l in open(m12)]
    check("metrics after a resume: each step once", steps == list(range(1, 11)), str(steps))
    dup = os.path.join(tmp, "adapter_dup")
    shutil.copytree(ad, dup)
    text = open(os.path.join(dup, "adapter_config.json")).read().replace('"r": 4', '"r": 8, "r": 4')
    open(os.path.join(dup, "adapter_config.json"), "w").write(text)
    r = run(train + ["--steps", "1", "--adapter", dup])
    check("duplicate JSON keys resolve as Python's json does (the last one)", json.loads(text)["r"] == 4 and r and
          r.returncode == 0, r.stderr.strip()[-200:] if r else "hung")
    for label, edit, needle in [("overlapping data_offsets", "overlap", "overlaps"), ("trailing bytes", "trail", "after the last tensor")]:
        bad = os.path.join(tmp, f"adapter_{edit}")
        shutil.copytree(ad, bad)
        header, blob = read_st(os.path.join(bad, "adapter_model.safetensors"))
        if edit == "overlap":  # one tensor's bytes start 4 bytes into the one before it
            name = next(k for k in header if k != "__metadata__" and header[k]["data_offsets"][0] > 0)
            header[name]["data_offsets"] = [o - 4 for o in header[name]["data_offsets"]]
        else:
            blob += b"\0" * 8
        write_st(os.path.join(bad, "adapter_model.safetensors"), header, blob)
        expect_clean_error(f"adapter safetensors with {label}", train + ["--steps", "1", "--adapter", bad], [needle])

    failed = 0
    for name, problems in RESULTS:
        print(("PASS " if not problems else "FAIL ") + name + ("" if not problems else ": " + "; ".join(problems)))
        failed += bool(problems)
    print(f"test_reliability: {len(RESULTS) - failed}/{len(RESULTS)} passed")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
