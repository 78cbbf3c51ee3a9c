#!/usr/bin/env python3
"""Fault injection over the tools' artifact writes (docs/reliability.md):

1. SIGKILL at every write, fsync, rename, renameat2, unlink, rmdir and mkdir
   of a training run that checkpoints, prunes, saves weights and saves an
   adapter over an older one (strace -e inject=SYSCALL:signal=KILL:when=N, for
   every N the run makes). After each kill: the adapter folder is entirely the
   old one or entirely the new one, the weights file is absent or complete,
   and --resume finishes the run with the same bits as a run never killed,
   leaving no temp files behind.
2. ulimit -f and ulimit -v sweeps over every command: success or a clean
   error, never a hang, a kill by a signal or a torn output.
3. Two writers on one adapter folder: the result is one of the two, whole.

Prints the number of injection points and limits run."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import leftovers, export_tiny_gpt, ROOT, tool_paths, write_pair_rows

RESULTS = []
SYSCALLS = ["write", "fsync", "rename", "renameat2", "unlink", "rmdir", "mkdir"]


def check(name, ok, detail=""):
    RESULTS.append((name, [] if ok else [detail or "failed"]))


def run(cmd, timeout=120, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        return None


def read(path):
    return open(path, "rb").read() if os.path.exists(path) else None


def adapter_state(folder):
    return read(os.path.join(folder, "adapter_config.json")), read(os.path.join(folder, "adapter_model.safetensors"))


def main():
    sdc, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_faults_")
    gpt = export_tiny_gpt(tmp)
    plans = {}
    for alpha in (8, 32):
        plans[alpha] = os.path.join(tmp, f"lora{alpha}.sdp")
        subprocess.run([sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv", "--lora-r", "4",
                        "--lora-alpha", str(alpha), "--shapes", "input_ids=2x8", "--infer-shapes", "input_ids=1x8",
                        "-o", plans[alpha]], check=True)
    data = os.path.join(tmp, "train.jsonl")
    with open(data, "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"l{i} hi"}) + "\n")
    plan = plans[8]
    # A preference plan (KTO: the reference copies, each example with its KL row).
    kto_plan, kto_data = os.path.join(tmp, "kto.sdp"), os.path.join(tmp, "examples.jsonl")
    subprocess.run([sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv", "--recipe", "kto", "--shapes",
                    "input_ids=4x8", "-o", kto_plan], check=True)
    write_pair_rows(kto_data, np.random.default_rng(2), 256, 8, prompt=(1, 4), completion=(1, 4), unpaired=True)

    # The starting state of every round: checkpoints 1 and 2 of a run, and an
    # adapter folder from another plan (another lora_alpha: a torn folder
    # would mix its config with new weights).
    base = os.path.join(tmp, "base")
    os.makedirs(base)
    subprocess.run([sdrun, "train", plan, "--data", data, "--steps", "2", "--checkpoint-dir", f"{base}/ck",
                    "--checkpoint-every", "1", "--threads", "1"], check=True, capture_output=True)
    subprocess.run([sdrun, "train", plans[32], "--data", data, "--steps", "1", "--save-adapter", f"{base}/ad",
                    "--threads", "1"], check=True, capture_output=True)
    work = os.path.join(tmp, "work")

    def fresh():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)

    target = [sdrun, "train", plan, "--data", data, "--steps", "4", "--checkpoint-dir", f"{work}/ck",
              "--checkpoint-every", "1", "--resume", "--threads", "1", "--save-weights", f"{work}/w.safetensors",
              "--save-adapter", f"{work}/ad"]
    old_adapter = adapter_state(f"{base}/ad")
    fresh()
    log = os.path.join(tmp, "strace.log")
    subprocess.run(["strace", "-f", "-qq", "-o", log, "-e", "trace=" + ",".join(SYSCALLS)] + target, check=True,
                   capture_output=True)
    new_adapter, new_weights = adapter_state(f"{work}/ad"), read(f"{work}/w.safetensors")
    check("the uninjected run saves a new adapter", new_adapter != old_adapter and None not in new_adapter)
    main_pid = open(log).readline().split()[0]
    counts = {sc: sum(1 for l in open(log) if l.split()[0] == main_pid and l.split()[1].startswith(sc + "("))
              for sc in SYSCALLS}

    points, killed, failures = 0, 0, []
    for sc in SYSCALLS:
        for n in range(1, counts[sc] + 1):
            points += 1
            fresh()
            r = run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={sc}", "-e",
                     f"inject={sc}:signal=KILL:when={n}"] + target)
            where = f"{sc} #{n}"
            if r is None:
                failures.append(f"{where}: the injected run hung")
                continue
            killed += r.returncode != 0  # strace passes on the tracee's death by SIGKILL
            ad = adapter_state(f"{work}/ad")
            if ad not in (old_adapter, new_adapter):
                failures.append(f"{where}: adapter folder is neither the old nor the new one (torn)")
            w = read(f"{work}/w.safetensors")
            if w not in (None, new_weights):
                failures.append(f"{where}: weights file is torn ({len(w)} bytes)")
            v = run(target)
            if v is None or v.returncode != 0:
                failures.append(f"{where}: --resume after the kill failed: "
                                f"{'hung' if v is None else v.stderr.decode().strip()[-200:]}")
                continue
            if read(f"{work}/w.safetensors") != new_weights or adapter_state(f"{work}/ad") != new_adapter:
                failures.append(f"{where}: the resumed run's results differ from a run never killed")
            left = leftovers(work)
            if left:
                failures.append(f"{where}: temp files left after the next run: {left}")
    check(f"SIGKILL at each of {points} file-system calls ({', '.join(f'{k} {v}' for k, v in counts.items())}): "
          f"{killed} runs killed; last committed artifacts load, resume is bit for bit",
          not failures and points > 0 and killed == points,
          "; ".join(failures[:5]) + (f" (+{len(failures) - 5} more)" if len(failures) > 5 else ""))

    # Limits over every command.
    x = os.path.join(tmp, "ids.npy")
    np.save(x, np.zeros((1, 8), np.int64))
    out = os.path.join(tmp, "out")
    adapter = f"{base}/ad"
    commands = {
        "sdc compile": [sdc, "compile", gpt, "--peft", "lora", "--target-modules", "qkv", "--shapes", "input_ids=2x8",
                        "-o", f"{out}/p.sdp"],
        "sdc merge": [sdc, "merge", gpt, "--adapter", adapter, "-o", f"{out}/m.onnx"],
        "sdrun infer": [sdrun, "infer", plan, "--input", f"input_ids={x}", "--output-dir", f"{out}/infer"],
        "sdrun train": [sdrun, "train", plan, "--data", data, "--steps", "3", "--checkpoint-dir", f"{out}/ck",
                        "--save-weights", f"{out}/w.safetensors", "--save-adapter", f"{out}/ad", "--metrics",
                        f"{out}/m.jsonl", "--threads", "1"],
        "sdrun train (kto)": [sdrun, "train", kto_plan, "--data", kto_data, "--steps", "2", "--save-adapter",
                              f"{out}/kto_ad", "--threads", "1"],
        "sdrun generate": [sdrun, "generate", plan, "--prompt", "hi", "--max-new-tokens", "4"],
        "sdrun bench": [sdrun, "bench", plan, "--iterations", "3"],
        "sdrun inspect": [sdrun, "inspect", plan],
    }
    limits = [("f", n) for n in (0, 2, 16, 128, 1024)] + [("v", n) for n in (40000, 60000, 100000, 200000, 400000)]
    runs, refused, problems = 0, 0, []
    for name, cmd in commands.items():
        for kind, n in limits:
            runs += 1
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)
            r = run(["sh", "-c", f'ulimit -{kind} {n}; exec "$@"', "sh"] + cmd, timeout=120)
            where = f"{name} under ulimit -{kind} {n}"
            if r is None:
                problems.append(f"{where}: hung")
                continue
            err = r.stderr.decode(errors="replace").strip()
            refused += r.returncode != 0
            # 127: the dynamic loader could not map a library, before main ran.
            if r.returncode not in (0, 1) and not (r.returncode == 127 and "error while loading shared" in err):
                problems.append(f"{where}: exit {r.returncode}: {err[-200:]}")
            if r.returncode == 1 and not err.splitlines()[-1].startswith(("sdc: error:", "sdrun: error:")):
                problems.append(f"{where}: exit 1 without an error line: {err[-200:]}")
            left = leftovers(out)
            if left:
                problems.append(f"{where}: left {left}")
            if os.path.exists(f"{out}/p.sdp") and run([sdrun, "inspect", f"{out}/p.sdp"]).returncode != 0:
                problems.append(f"{where}: wrote a plan that does not load")
    check(f"{runs} runs of {len(commands)} commands under {len(limits)} limits ({refused} refused): success or a "
          "clean error",
          not problems, "; ".join(problems[:6]) + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""))

    # Two writers on one adapter folder.
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    procs = [subprocess.Popen([sdrun, "train", plans[a], "--data", data, "--steps", "2", "--save-adapter", f"{out}/ad",
                               "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for a in (8, 32)]
    rcs = [p.wait() for p in procs]
    cfg = json.load(open(f"{out}/ad/adapter_config.json"))
    solo = {}
    for a in (8, 32):
        d = f"{out}/solo{a}"
        subprocess.run([sdrun, "train", plans[a], "--data", data, "--steps", "2", "--save-adapter", d, "--threads", "1"],
                       check=True, capture_output=True)
        solo[a] = adapter_state(d)
    check("two writers on one adapter folder: both succeed, the folder is one of them whole",
          rcs == [0, 0] and adapter_state(f"{out}/ad") in solo.values() and not leftovers(out),
          f"exits {rcs}, alpha {cfg.get('lora_alpha')}, left {leftovers(out)}")

    failed = 0
    for name, problems in RESULTS:
        print(("PASS " if not problems else "FAIL ") + name + ("" if not problems else ": " + "; ".join(problems)))
        failed += bool(problems)
    print(f"test_fault_injection: {len(RESULTS) - failed}/{len(RESULTS)} passed "
          f"({points} injection points, {killed} killed; {runs} limit runs, {refused} refused)")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
