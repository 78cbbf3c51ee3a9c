#!/usr/bin/env python3
"""Data-parallel training over MPI ranks (mpirun, Open MPI from Debian).

The same plan runs on 1, 2 and 3 ranks. On the same global batch (--batch 6
on one rank, 3 on two, 2 on three) the per-step losses and the final weights
agree to 1e-5 relative (weights per tensor, in norm), and --verify-replicas checks after every step that
the ranks' parameters are bitwise equal. That holds for LoRA and full
fine-tuning, padded and packed rows, LoRA dropout (masks keyed by the global
row) and gradient accumulation; the gradient
bucket size changes nothing beyond summation order; a run checkpointed on 2
ranks resumes on 3 with the losses 2 ranks would have had; sharded
checkpoints hold one file per rank whose pieces make up every weight, skip a
torn rank file on resume and survive a rank killed while writing; and a rank
killed with SIGKILL mid-run ends the whole job, non-zero, within seconds,
leaving a checkpoint that loads. Two hosts are two network namespaces joined by a veth
pair on private test addresses, mpirun reaching the second through an rsh
agent that enters its namespace and the ranks talking over TCP: that run
equals the single-host one."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from e2e_util import ROOT, plan_steps, report_checks, sh, tool_paths, write_pair_rows
from test_training import read_safetensors

SEQ, GLOBAL_BATCH, STEPS, EXAMPLES = 16, 6, 10, 90
RESULTS = []
MPIRUN = shutil.which("mpirun")


def check(name, ok, detail):
    RESULTS.append((name, bool(ok), detail))


def mpirun(n):
    """mpirun for n ranks on this one machine, as root in CI, on fewer cores
    than ranks, without binding ranks to cores."""
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n)]


def dpo_runs(sdc, sdrun, onnx_path, tmp):
    """Preference pairs: each rank holds whole pairs (rows 2i, 2i + 1), and
    the reference copies are kept in step like any training state."""
    data = os.path.join(tmp, "pairs.jsonl")
    write_pair_rows(data, np.random.default_rng(8), 256, EXAMPLES // 3)
    plans = {}
    lora = ["--peft", "lora", "--target-modules", "qkv,proj"]
    for name, flags in {"dpo_lora": lora + ["--recipe", "dpo"],
                        "dpo_full": ["--peft", "none", "--recipe", "dpo"],
                        "dpo_full_zero2": ["--peft", "none", "--shard", "grads", "--recipe", "dpo"],
                        "dpo_full_fsdp": ["--peft", "none", "--shard", "params", "--recipe", "dpo"],
                        "dpo_lora_fsdp": lora + ["--shard", "params", "--recipe", "dpo"]}.items():
        plans[name] = os.path.join(tmp, name + ".sdp")
        sh([sdc, "compile", onnx_path, *flags, "--shapes", f"input_ids={2 * GLOBAL_BATCH}x{SEQ}",
            "--adam-epsilon", "1e-6", "-o", plans[name]])
    runner = Runner(sdrun, data, tmp)  # --batch counts pairs: 6 global, 3 or 2 per rank
    equal_runs(runner, "DPO, LoRA (pairs)", plans["dpo_lora"])
    equal_runs(runner, "--shard grads, DPO, full fine-tuning (pairs), against the unsharded plan",
               plans["dpo_full_zero2"], reference=plans["dpo_full"], ranks=(2,))
    # FSDP: the reference copies split by rows as their parameters are.
    equal_runs(runner, "--shard params, DPO, full fine-tuning (reference copies split by rows), against the unsharded "
               "plan", plans["dpo_full_fsdp"], reference=plans["dpo_full"], ranks=(2, 3))
    equal_runs(runner, "--shard params, DPO, LoRA, against the unsharded plan", plans["dpo_lora_fsdp"],
               reference=plans["dpo_lora"], ranks=(2,))
    # From a trained adapter, each rank's rows of the copies take the adapter's rows: the policy starts as the reference.
    adapter = os.path.join(tmp, "dpo_adapter")
    runner.train(plans["dpo_lora"], 1, extra=["--save-adapter", adapter])
    losses, _, _ = runner.train(plans["dpo_lora_fsdp"], 2, extra=["--adapter", adapter])
    check("--shard params, DPO from a trained adapter on 2 ranks: the first loss is log 2 (each rank's reference rows "
          "refreshed from the adapter's)", abs(losses[0] - np.log(2)) <= 1e-6, f"first loss {losses[0]!r}")
    # KTO: each rank estimates KL from its own micro-batch (TRL averages the
    # estimate over ranks), so 2 ranks are not 1 rank on the global batch; the
    # ranks stay replicas of each other (--verify-replicas) and train.
    examples = os.path.join(tmp, "examples.jsonl")
    write_pair_rows(examples, np.random.default_rng(9), 256, EXAMPLES // 3, unpaired=True)
    kto = os.path.join(tmp, "kto_lora.sdp")
    sh([sdc, "compile", onnx_path, *lora, "--recipe", "kto", "--shapes", f"input_ids={2 * GLOBAL_BATCH}x{SEQ}",
        "-o", kto])
    losses, _, err = Runner(sdrun, examples, tmp).train(kto, 2)
    check("KTO, LoRA on 2 ranks (each its own KL estimate): the replicas stay equal and the loss falls",
          len(losses) == STEPS and all(np.isfinite(losses)) and losses[-1] < losses[0],
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}")


def make_data(path):
    rng = np.random.default_rng(7)
    with open(path, "w") as f:
        for i in range(EXAMPLES):
            ids = rng.integers(0, 256, size=int(rng.integers(3, SEQ + 1))).tolist()
            labels = [-100 if i % 4 == 0 and j < 2 else t for j, t in enumerate(ids)]
            f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")


def read_metrics(path):
    with open(path) as f:
        return [json.loads(l)["loss"] for l in f if '"loss"' in l]


def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def key_bias(name, shape):
    """The key third of a fused qkv bias ([q; k; v], d_model each). Its exact
    gradient is zero (softmax ignores a constant added to every key's
    score), so what it holds is rounding noise that AdamW scales up to
    about lr * noise / eps per step, differently for every summation order:
    it is compared in absolute terms (1e-5), not relative to the weights."""
    d = shape[0] // 3
    return slice(d, 2 * d) if name.endswith("qkv.bias") else slice(0, 0)


def weights_gap(a, b):
    """The largest per-tensor gap ||a - b|| / ||b|| (key biases aside, which
    must agree to 1e-5 absolute). Norm-wise, not element-wise: an element
    whose gradient is near zero in some step is rounding noise there, which
    AdamW's division by sqrt(v) + eps magnifies, so single elements may move
    by up to about lr * noise / eps whatever the reduction order."""
    wa, wb = read_safetensors(a), read_safetensors(b)
    if wa.keys() != wb.keys():
        return float("inf")
    gap = 0.0
    for k in wa:
        x, y = wa[k].astype(np.float64), wb[k].astype(np.float64)
        kb = key_bias(k, x.shape)
        if np.max(np.abs(x[kb] - y[kb]), initial=0.0) > 1e-5:
            return float("inf")
        x[kb] = y[kb] = 0.0
        gap = max(gap, float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)))
    return gap


class Runner:
    def __init__(self, sdrun, data, tmp):
        self.sdrun, self.data, self.tmp = sdrun, data, tmp
        self.count = 0

    def train(self, plan, ranks, extra=(), steps=STEPS, accum=1, launcher=None):
        """Trains `plan` on `ranks` ranks over the global batch; returns (losses, weights file, stderr)."""
        self.count += 1
        metrics = os.path.join(self.tmp, f"m{self.count}.jsonl")
        weights = os.path.join(self.tmp, f"w{self.count}.safetensors")
        cmd = [self.sdrun, "train", plan, "--data", self.data, "--steps", str(steps), "--batch",
               str(GLOBAL_BATCH // ranks), "--grad-accum", str(accum), "--lr", "3e-3", "--weight-decay", "0.1",
               "--clip-norm", "1.0", "--threads", "1", "--metrics", metrics, "--save-weights", weights, *extra]
        if ranks > 1:
            cmd = (launcher or mpirun(ranks)) + cmd + ["--verify-replicas"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-1500:]}")
        return read_metrics(metrics), weights, r.stderr


def equal_runs(runner, name, plan, accum=1, ranks=(2, 3), reference=None):
    """`plan` on each of `ranks` ranks against `reference` (default: the same plan) on one rank."""
    one, w1, _ = runner.train(reference or plan, 1, accum=accum)
    for n in ranks:
        losses, wn, err = runner.train(plan, n, accum=accum)
        gap_l = relative(losses, one) if len(losses) == len(one) else float("inf")
        gap_w = weights_gap(wn, w1)
        check(f"{name}: {n} ranks equal 1 rank on the global batch of {GLOBAL_BATCH} rows (10 AdamW steps)",
              gap_l <= 1e-5 and gap_w <= 1e-5,
              f"losses {gap_l:.2e}, weights {gap_w:.2e} relative; loss {one[0]:.4f} -> {one[-1]:.4f}")
    return one


OSFT_K11 = ["--osft-preserved-ratio", "0.35"]


def v_side_gap(runner, plan, weights):
    """The largest ||V_low V_high^T|| / ||V_low|| over the plan's OSFT modules,
    V_low from a weights file, V_high (frozen) read from the plan."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(runner.sdrun)), "python"))
    import sdc
    session = sdc.Session(sdc.Plan(plan), threads=1)
    low = read_safetensors(weights)
    worst = 0.0
    for m in json.loads(sdc.Plan(plan).config)["osf"]["modules"]:
        vh = session.read_global(f"{m}.osf_V_high").astype(np.float64)
        vl = low[f"{m}.osf_svd_params.V_low"].astype(np.float64)
        worst = max(worst, float(np.linalg.norm(vl @ vh.T) / np.linalg.norm(vl)))
    return worst


def osft_sharded(runner, plans):
    """OSFT with every factor split by rows: the U side's coefficients are
    partial sums over rows (all-reduced), the V side's need all of V_high
    (gathered). The rule that all-reduces per-rank products of V_high's local
    rows (--osft-v-rule allreduce) must fail the same comparison."""
    equal_runs(runner, "--shard params, OSFT (k = 11 of 32, not a multiple of 2 or 3), against the unsharded plan",
               plans["osft_fsdp"], reference=plans["osft_k11"])
    _, w_one, _ = runner.train(plans["osft_k11"], 1)
    _, w_right, _ = runner.train(plans["osft_fsdp"], 3)
    _, w_wrong, _ = runner.train(plans["osft_fsdp_wrong"], 3)
    right, wrong = v_side_gap(runner, plans["osft_k11"], w_right), v_side_gap(runner, plans["osft_k11"], w_wrong)
    check("--shard params, OSFT on 3 ranks: V_low stays orthogonal to V_high (<= 1e-5 relative)", right <= 1e-5,
          f"||V_low V_high^T|| / ||V_low|| {right:.1e}")
    check("the all-reduce rule for the V side (--osft-v-rule allreduce) fails: weights differ from 1 rank and V_low "
          "leaves the subspace", weights_gap(w_wrong, w_one) > 1e-3 and wrong > 1e-3,
          f"weights {weights_gap(w_wrong, w_one):.2e} relative, ||V_low V_high^T|| / ||V_low|| {wrong:.1e}")


def overlapped_buckets(runner, sdrun, plans, one_rank):
    """Small buckets (64 KiB), each reduced while the rest of the backward
    runs (async AllReduce steps, one WaitCollectives before GradScale),
    against the same buckets reduced after the backward: the same sums, so
    bitwise equal weights on 2 ranks; equal to 1 rank on 2 and 3."""
    steps = plan_steps(sdrun, plans["full_small_buckets"])
    plain = plan_steps(sdrun, plans["full_small_buckets_after"])
    said = [[l for l in sh([sdrun, "inspect", plans[p]]).splitlines() if l.startswith("gradient reduction")]
            for p in ("full_small_buckets", "full_small_buckets_after")]
    counts = [[int(w) for w in l[0].replace(",", " ").split() if w.isdigit()] if l else [] for l in said]
    check("sdrun inspect says how many gradient buckets start during the backward (all but the last) and, with "
          "--no-overlap-reduction, none", len(counts[0]) == 2 and counts[0][1] == counts[0][0] - 1 >= 1 and
          counts[1] == [counts[0][0], 0], f"{said}")
    check("64 KiB buckets: train_step starts several bucket reductions during the backward and waits once "
          "(the token count in a step of its own); --no-overlap-reduction has no wait",
          steps.get("AllReduce", 0) >= 6 and steps.get("WaitCollectives", 0) == 1 and
          plain.get("WaitCollectives", 0) == 0 and steps.get("AllReduce", 0) == plain.get("AllReduce", 0) + 1,
          f"overlapped {steps.get('AllReduce')} AllReduce + {steps.get('WaitCollectives')} WaitCollectives; "
          f"after the backward {plain.get('AllReduce')} + {plain.get('WaitCollectives', 0)}")
    for n in (2, 3):
        during, w_during, _ = runner.train(plans["full_small_buckets"], n)
        after, w_after, _ = runner.train(plans["full_small_buckets_after"], n)
        same = read_safetensors(w_during), read_safetensors(w_after)
        bitwise = all(np.array_equal(same[0][k], same[1][k]) for k in same[1]) and len(same[0]) == len(same[1])
        check(f"buckets reduced during the backward on {n} ranks = after it" + (" bit for bit" if n == 2 else
                                                                              " (to 1e-5)") + ", = 1 rank",
              (bitwise if n == 2 else weights_gap(w_during, w_after) <= 1e-5 and relative(during, after) <= 1e-5)
              and relative(during, one_rank) <= 1e-5,
              f"weights {weights_gap(w_during, w_after):.2e}, losses {relative(during, after):.2e} apart; "
              f"against 1 rank {relative(during, one_rank):.2e}")


def fp16_sharded(runner, plans):
    """fp16 with dynamic loss scaling and sharded optimizer state, gradients
    or weights (rows): every rank takes the same skip decision (from the global
    gradient norm; the updates skip on their own rows) and the same loss
    scale, so a sharded run equals the
    unsharded plan on the same ranks, skipped steps included. (Against one
    rank fp16 can differ at the edge of its range: each rank's partial
    gradient overflows, or not, on its own rows.)"""
    def train(plan, n):  # the last run's metrics records (skipped, loss_scale) and weights
        _, weights, _ = runner.train(plan, n, steps=14)
        with open(os.path.join(runner.tmp, f"m{runner.count}.jsonl")) as f:
            return [json.loads(l) for l in f if '"loss"' in l], weights

    for n in (2, 3):
        ref, wref = train(plans["fp16_none"], n)
        for mode in ("optimizer", "grads", "params"):
            got, w = train(plans[f"fp16_{mode}"], n)
            same = [(r["skipped"], r["loss_scale"]) for r in got] == [(r["skipped"], r["loss_scale"]) for r in ref]
            skipped = sum(1 for r in ref if r["skipped"])
            gap_l = relative([r["loss"] for r in got], [r["loss"] for r in ref]) if len(got) == len(ref) else 1.0
            gap_w = weights_gap(w, wref)
            check(f"fp16 with --shard {mode} on {n} ranks equals the unsharded fp16 plan (14 steps, {skipped} skipped): "
                  "the same skips and loss scales, losses and weights to 1e-5",
                  same and 0 < skipped < len(ref) and gap_l <= 1e-5 and gap_w <= 1e-5,
                  f"losses {gap_l:.2e}, weights {gap_w:.2e} relative; scales {[r['loss_scale'] for r in got]}")


def resume_elsewhere(runner, mode, plan, ck, before, after, one_rank=None):
    """Checkpointed on `before` ranks at step 5, continued on `after`: the same
    losses as `before` ranks straight (and, given, as one unsharded rank)."""
    straight, _, _ = runner.train(plan, before, extra=["--checkpoint-dir", ck, "--checkpoint-every", "5"])
    shutil.rmtree(os.path.join(ck, f"checkpoint-{STEPS}"))
    resumed, _, _ = runner.train(plan, after, extra=["--checkpoint-dir", ck, "--resume"])
    gap = relative(resumed[-5:], straight[5:]) if len(resumed) >= 5 else float("inf")
    alone = relative(straight, one_rank) if one_rank is not None else 0.0
    check(f"{mode} resume: checkpointed on {before} ranks at step 5, continued on {after} = {before} ranks straight",
          gap <= 1e-5 and alone <= 1e-5,
          f"{gap:.2e}" + (f"; {before} ranks sharded vs 1 rank unsharded {alone:.2e}" if one_rank is not None else ""))


def sharded_checkpoints(runner, plan, tmp):
    """--shard params on 3 ranks: each rank writes its own state file, the
    manifest (written last) lists every tensor's pieces; a torn rank file
    sends the resume to the older checkpoint, read on 2 ranks; a rank killed
    while a checkpoint is written leaves the older one committed and loadable."""
    ck = os.path.join(tmp, "ck_sharded")
    straight, weights, _ = runner.train(plan, 3, extra=["--checkpoint-dir", ck, "--checkpoint-every", "5"])
    folder = os.path.join(ck, f"checkpoint-{STEPS}")
    files = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    expected = [f"state-rank{r}-of-3.safetensors" for r in range(3)]
    check("sharded checkpoint: one state file per rank, and a manifest with world_size 3 listing each file",
          files == expected and manifest["world_size"] == 3 and sorted(manifest["files"]) == expected and
          [manifest["files"][f]["rank"] for f in expected] == [0, 1, 2], f"{files}, world_size {manifest.get('world_size')}")
    # Every trainable weight, put together from its pieces by first row, is
    # the whole weight --save-weights gathered at the same step, bit for bit.
    shards = {f: read_safetensors(os.path.join(folder, f)) for f in files}
    whole = read_safetensors(weights)
    split, mismatched = 0, []
    for name, value in whole.items():
        pieces = sorted(manifest["tensors"][name], key=lambda p: p["first_row"])
        split += len(pieces) == 3
        joined = np.concatenate([shards[p["file"]][name] for p in pieces])
        if joined.shape != value.shape or not np.array_equal(joined, value):
            mismatched.append(name)
    sizes = [os.path.getsize(os.path.join(folder, f)) for f in files]
    check("sharded checkpoint: each weight's pieces, joined by first row, equal the gathered weight bit for bit; "
          "every weight is in 3 pieces and no rank's file holds more than half the state",
          not mismatched and split == len(whole) and max(sizes) < 0.5 * sum(sizes),
          f"mismatched {mismatched[:3]}, {split} of {len(whole)} in 3 pieces, file bytes {sizes}")

    # The newest checkpoint with a torn rank-2 file, and a newer folder
    # without its manifest (a commit that never happened): the resume, on 2
    # ranks, skips both by name and reshards 3 ranks' step-5 checkpoint.
    state = os.path.join(folder, expected[2])
    raw = bytearray(open(state, "rb").read())
    raw[-3] ^= 0x40
    open(state, "wb").write(bytes(raw))
    uncommitted = os.path.join(ck, f"checkpoint-{STEPS + 2}")
    shutil.copytree(os.path.join(ck, "checkpoint-5"), uncommitted)
    os.remove(os.path.join(uncommitted, "manifest.json"))
    resumed, _, err = runner.train(plan, 2, extra=["--checkpoint-dir", ck, "--resume"])
    skipped = [l for l in err.splitlines() if "skipped" in l]
    check("a folder without its manifest and a checkpoint with a torn rank file are skipped by name; 3 ranks' "
          "step-5 checkpoint resumes on 2 ranks with 3 ranks' losses",
          any(f"checkpoint-{STEPS + 2} skipped: rank 0: no readable manifest" in l for l in skipped) and
          any(f"checkpoint-{STEPS} skipped: rank 1: {expected[2]} fails its checksum" in l for l in skipped) and
          len(resumed) >= 5 and relative(resumed[-5:], straight[5:]) <= 1e-5,
          f"{relative(resumed[-5:], straight[5:]) if len(resumed) >= 5 else 'missing steps'}; " + " | ".join(skipped)[:600])

    # Rank 1 killed (strace fault injection) at its second checkpoint file's
    # rename: the job ends non-zero, no checkpoint-10 is committed, and the
    # step-5 checkpoint finishes the run as if nothing happened.
    if not shutil.which("strace"):
        check("a rank killed mid-checkpoint", False, "strace not found (scripts/install-deps.sh installs it)")
        return
    ck2 = os.path.join(tmp, "ck_killed")
    cmd = [runner.sdrun, "train", plan, "--data", runner.data, "--steps", str(STEPS), "--batch", "2", "--lr", "3e-3",
           "--weight-decay", "0.1", "--clip-norm", "1.0", "--threads", "1", "--checkpoint-dir", ck2,
           "--checkpoint-every", "5"]
    wrapped = ("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec strace -f -qq -o /dev/null "
               "-e trace=rename -e inject=rename:signal=KILL:when=2 \"$@\"; else exec \"$@\"; fi")
    r = subprocess.run(mpirun(3) + ["sh", "-c", wrapped, "sh"] + cmd, capture_output=True, text=True, timeout=300)
    left = sorted(os.listdir(ck2)) if os.path.isdir(ck2) else []
    check("rank 1 killed while checkpoint-10 is written: the job ends non-zero, checkpoint-5 is the newest committed",
          r.returncode != 0 and "checkpoint-5" in left and f"checkpoint-{STEPS}" not in left,
          f"exit {r.returncode}, folder {left}")
    resumed, _, err = runner.train(plan, 3, extra=["--checkpoint-dir", ck2, "--resume"])
    left = sorted(os.listdir(ck2))
    check("... and --resume from it on 3 ranks ends with the losses of the run never killed, no temp folder left",
          "resuming from " + os.path.join(ck2, "checkpoint-5") in err and len(resumed) >= 5 and
          relative(resumed[-5:], straight[5:]) <= 1e-5 and not any(n.startswith(".tmp") for n in left),
          f"{relative(resumed[-5:], straight[5:]) if len(resumed) >= 5 else 'missing steps'}, folder {left}")


def kill_one_rank(runner, plan, tmp):
    """SIGKILL rank 1 of 3 once a checkpoint exists: mpirun must end the job
    non-zero, and the newest checkpoint must load."""
    ck = os.path.join(tmp, "killed")
    cmd = mpirun(3) + [runner.sdrun, "train", plan, "--data", runner.data, "--steps", "100000", "--batch", "2",
                       "--threads", "1", "--checkpoint-dir", ck, "--checkpoint-every", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.time() + 120
    while time.time() < deadline and victim is None:
        time.sleep(0.2)
        if os.path.isdir(ck) and any(n.startswith("checkpoint-") for n in os.listdir(ck)):
            victim = rank_pid(p.pid, 1)
    if victim is None:
        p.kill()
        check("SIGKILL of one rank of three ends the job", False, "no checkpoint or no rank 1 process appeared")
        return
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    try:
        _, err = p.communicate(timeout=40)
        took = time.time() - t0
        check("SIGKILL of rank 1 of 3 mid-run: the job ends, non-zero, within 40 s",
              p.returncode != 0, f"exit {p.returncode} after {took:.1f} s")
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        check("SIGKILL of rank 1 of 3 mid-run: the job ends, non-zero, within 40 s", False, "still running after 40 s")
    # One more step from the newest checkpoint, on one rank (same global batch).
    newest = max(int(n.split("-")[1]) for n in os.listdir(ck) if n.startswith("checkpoint-"))
    r = subprocess.run([runner.sdrun, "train", plan, "--data", runner.data, "--steps", str(newest + 1), "--batch", "6",
                        "--threads", "1", "--checkpoint-dir", ck, "--resume"], capture_output=True, text=True, timeout=120)
    check("after the kill, the newest checkpoint loads and training goes on from it (on 1 rank)",
          r.returncode == 0 and f"resuming from {ck}/checkpoint-{newest}" in r.stderr and "skipped" not in r.stderr,
          f"checkpoint-{newest}: exit {r.returncode} {r.stderr.strip()[-300:]}")


class TwoHosts:
    """Network namespaces A and B joined by veth on 10.213.<n>.1/.2 (made here,
    removed on exit), and an rsh agent for mpirun that runs a command "on"
    a host by entering its namespace."""

    def __init__(self, tmp):
        tag = f"{os.getpid() % 10000}"
        self.ns = [f"sdrk{tag}a", f"sdrk{tag}b"]
        net = 100 + os.getpid() % 100
        self.addr = [f"10.213.{net}.1", f"10.213.{net}.2"]
        self.subnet = f"10.213.{net}.0/24"
        veth = [f"sdv{tag}a", f"sdv{tag}b"]
        steps = [["ip", "netns", "add", self.ns[0]], ["ip", "netns", "add", self.ns[1]],
                 ["ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1]]]
        for i in range(2):
            steps += [["ip", "link", "set", veth[i], "netns", self.ns[i]],
                      ["ip", "-n", self.ns[i], "addr", "add", self.addr[i] + "/24", "dev", veth[i]],
                      ["ip", "-n", self.ns[i], "link", "set", veth[i], "up"],
                      ["ip", "-n", self.ns[i], "link", "set", "lo", "up"]]
        for cmd in steps:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        self.agent = os.path.join(tmp, "netns_agent.sh")
        with open(self.agent, "w") as f:
            f.write("#!/bin/sh\n# mpirun's rsh agent: HOST COMMAND... runs COMMAND in HOST's namespace.\n"
                    'host=$1; shift\ncase "$host" in\n'
                    f"  {self.addr[0]}) ns={self.ns[0]} ;;\n  {self.addr[1]}) ns={self.ns[1]} ;;\n"
                    '  *) echo "unknown host $host" >&2; exit 1 ;;\nesac\n'
                    'exec ip netns exec "$ns" /bin/sh -c "$*"\n')
        os.chmod(self.agent, 0o755)

    def mpirun(self):
        """mpirun started in host A, one rank per host, TCP between them."""
        return ["ip", "netns", "exec", self.ns[0], MPIRUN, "--allow-run-as-root", "--bind-to", "none", "--host",
                f"{self.addr[0]}:1,{self.addr[1]}:1", "-np", "2", "--mca", "plm_rsh_agent", self.agent,
                "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", self.subnet,
                "--mca", "oob_tcp_if_include", self.subnet]

    def close(self):
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def two_hosts(runner, plan, tmp, single_host):
    """The 2-rank run across two namespace hosts equals the single-host one."""
    if os.geteuid() != 0:
        print("SKIP  two hosts in network namespaces: needs root (ip netns)")
        return
    hosts = None
    try:
        hosts = TwoHosts(tmp)
        where = subprocess.run(hosts.mpirun() + ["readlink", "/proc/self/ns/net"], capture_output=True, text=True,
                               timeout=120)
        namespaces = set(where.stdout.split())
        check("two hosts: mpirun starts one rank in each network namespace", where.returncode == 0 and len(namespaces) == 2,
              f"{sorted(namespaces)} {where.stderr.strip()[-300:]}")
        losses, weights, _ = runner.train(plan, 2, launcher=hosts.mpirun())
        gap_l, gap_w = relative(losses, single_host[0]), weights_gap(weights, single_host[1])
        check("two hosts over TCP (veth between namespaces) equal the single-host 2-rank run",
              gap_l <= 1e-5 and gap_w <= 1e-5, f"losses {gap_l:.2e}, weights {gap_w:.2e}")
    except (subprocess.CalledProcessError, RuntimeError, subprocess.TimeoutExpired) as e:
        detail = getattr(e, "stderr", None) or str(e)
        check("two hosts in network namespaces", False, str(detail).strip()[-400:])
    finally:
        if hosts:
            hosts.close()


PY_TRAIN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import sdc
rank, size = sdc.join_world()
session = sdc.Session(sdc.Plan(sys.argv[2]), threads=1, join_world=True)
trainer = sdc.Trainer(session, sys.argv[3], steps=int(sys.argv[4]), batch=int(sys.argv[5]), lr=3e-3,
                      weight_decay=0.1, clip_norm=1.0)
losses = [r.loss for r in trainer]
if rank == 0:
    with open(sys.argv[6], "w") as f:
        json.dump({"size": size, "losses": losses}, f)
if len(sys.argv) > 7 and rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
"""


def python_ranks(runner, plan, tmp, sdrun_losses):
    """The Python module under mpirun trains as sdrun does, and an uncaught
    exception on one rank ends the job instead of hanging it."""
    script = os.path.join(tmp, "train_ranks.py")
    with open(script, "w") as f:
        f.write(PY_TRAIN)
    module_dir = os.path.join(os.path.dirname(os.path.dirname(runner.sdrun)), "python")
    out = os.path.join(tmp, "py_losses.json")
    args = [sys.executable, script, module_dir, plan, runner.data, str(STEPS), str(GLOBAL_BATCH // 2), out]
    r = subprocess.run(mpirun(2) + args, capture_output=True, text=True, timeout=300)
    got = json.load(open(out)) if r.returncode == 0 and os.path.exists(out) else {}
    # sdrun's metrics file prints 8 significant digits.
    gap = relative(got["losses"], sdrun_losses) if len(got.get("losses", [])) == len(sdrun_losses) else float("inf")
    check("Python module under mpirun (sdc.join_world, Session(join_world=True), Trainer) = sdrun on 2 ranks",
          got.get("size") == 2 and gap <= 1e-7,
          f"size {got.get('size')}, losses {gap:.1e} relative to sdrun's printed 8 digits"
          f" {r.stderr.strip()[-300:] if r.returncode else ''}")
    code = (f"import sys; sys.path.insert(0, {module_dir!r}); import sdc\n"
            f"try:\n    sdc.Session(sdc.Plan({plan!r}), join_world=True)\n"
            "except sdc.Error as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    check("Python: Session(join_world=True) before sdc.join_world() is refused by name",
          r.returncode == 0 and "sdc.join_world()" in r.stdout, (r.stdout + r.stderr).strip()[-200:])
    t0 = time.time()
    try:
        r = subprocess.run(mpirun(2) + args + ["fail"], capture_output=True, text=True, timeout=120)
        check("Python: an uncaught exception on rank 1 ends the job, non-zero, with its traceback",
              r.returncode != 0 and "rank 1 fails on purpose" in r.stderr,
              f"exit {r.returncode} after {time.time() - t0:.1f} s")
    except subprocess.TimeoutExpired:
        check("Python: an uncaught exception on rank 1 ends the job, non-zero, with its traceback", False, "hung")


def rank_pid(mpirun_pid, rank):
    """The pid of the sdrun process mpirun started as `rank`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except OSError:
            continue
        if argv0.endswith(b"sdrun") and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(pid)
    return None


def main():
    sdc, sdrun = tool_paths()
    if not MPIRUN:
        print("test_ranks: mpirun not found (scripts/install-deps.sh installs openmpi-bin)")
        return 1
    tmp = tempfile.mkdtemp(prefix="sd_ranks_")
    try:
        out = os.path.join(tmp, "gpt")
        sh([sys.executable, os.path.join(ROOT, "examples", "export_models.py"), "--out", out, "--only", "gpt",
            "--d-model", "32", "--layers", "2", "--heads", "2", "--seq", str(SEQ), "--batch", "1"])
        onnx_path = os.path.join(out, "gpt.onnx")
        data = os.path.join(tmp, "train.jsonl")
        make_data(data)
        shapes = ["--shapes", f"input_ids={GLOBAL_BATCH}x{SEQ}", "--adam-epsilon", "1e-6"]
        plans = {}
        for name, flags in {"lora": ["--peft", "lora", "--target-modules", "qkv,proj"],
                            "lora_packed": ["--peft", "lora", "--target-modules", "qkv,proj", "--packing"],
                            "full": ["--peft", "none"], "full_per_tensor": ["--peft", "none", "--bucket-mb", "0"],
                            "full_small_buckets": ["--peft", "none", "--bucket-mb", "0.0625"],
                            "full_small_buckets_after": ["--peft", "none", "--bucket-mb", "0.0625",
                                                         "--no-overlap-reduction"],
                            "full_packed": ["--peft", "none", "--packing"],
                            "lora_dropout": ["--peft", "lora", "--target-modules", "qkv,proj", "--lora-dropout", "0.2"],
                            "full_zero1": ["--peft", "none", "--shard", "optimizer"],
                            "lora_zero1": ["--peft", "lora", "--target-modules", "qkv,proj", "--shard", "optimizer"],
                            "full_zero2": ["--peft", "none", "--shard", "grads"],
                            "lora_zero2_packed": ["--peft", "lora", "--target-modules", "qkv,proj", "--shard", "grads",
                                                  "--packing"],
                            "osft": ["--peft", "osft", "--target-modules", "qkv,proj"],
                            "osft_zero1": ["--peft", "osft", "--target-modules", "qkv,proj", "--shard", "optimizer"],
                            "full_fsdp": ["--peft", "none", "--shard", "params"],
                            # k = floor(0.35 * 32) = 11 preserved directions: not a multiple of 2 or 3.
                            "osft_k11": ["--peft", "osft", "--target-modules", "qkv,proj", *OSFT_K11],
                            "osft_fsdp": ["--peft", "osft", "--target-modules", "qkv,proj", *OSFT_K11, "--shard", "params"],
                            "osft_fsdp_wrong": ["--peft", "osft", "--target-modules", "qkv,proj", *OSFT_K11, "--shard",
                                                "params", "--osft-v-rule", "allreduce"],
                            "lora_fsdp_packed": ["--peft", "lora", "--target-modules", "qkv,proj", "--shard", "params",
                                                 "--packing"],
                            "dora": ["--peft", "lora", "--use-dora", "--target-modules", "qkv,proj"],
                            "dora_fsdp": ["--peft", "lora", "--use-dora", "--target-modules", "qkv,proj", "--shard",
                                          "params"],
                            "vera_zero2": ["--peft", "vera", "--target-modules", "qkv,proj", "--shard", "grads"],
                            "vera_dropout": ["--peft", "vera", "--target-modules", "qkv,proj", "--lora-dropout", "0.2"],
                            "loha_zero1": ["--peft", "loha", "--target-modules", "qkv,proj", "--shard", "optimizer"],
                            "dylora": ["--peft", "dylora", "--target-modules", "qkv,proj", "--lora-r", "4",
                                       "--dylora-block-size", "2"],
                            "lokr_zero2": ["--peft", "lokr", "--target-modules", "qkv,proj", "--lora-r", "2",
                                           "--decompose-both", "--shard", "grads"],
                            "prompt": ["--peft", "prompt", "--num-virtual-tokens", "5"],
                            "prompt_fsdp": ["--peft", "prompt", "--num-virtual-tokens", "5", "--shard", "params"],
                            "prefix_zero2": ["--peft", "prefix", "--num-virtual-tokens", "5", "--shard", "grads"],
                            "ia3": ["--peft", "ia3", "--target-modules", "qkv,proj", "--feedforward-modules", "proj"],
                            "bottleneck": ["--peft", "bottleneck", "--bottleneck-config", "double_seq_bn",
                                           "--reduction-factor", "4"],
                            "bottleneck_fsdp": ["--peft", "bottleneck", "--bottleneck-config", "double_seq_bn",
                                                "--reduction-factor", "4", "--shard", "params"],
                            "ia3_zero2": ["--peft", "ia3", "--target-modules", "qkv,proj", "--feedforward-modules",
                                          "proj", "--shard", "grads"],
                            # fp16 from a loss scale of 2^20 with a growth window of 3: the first steps
                            # overflow and are skipped, then the scale grows and halves again.
                            **{f"fp16_{m}": ["--peft", "none", "--precision", "fp16", "--loss-scale-init", "1048576",
                                             "--loss-scale-window", "3", "--shard", m]
                               for m in ("none", "optimizer", "grads", "params")},
                            }.items():
            plans[name] = os.path.join(tmp, name + ".sdp")
            sh([sdc, "compile", onnx_path, *flags, *shapes, "-o", plans[name]])
        runner = Runner(sdrun, data, tmp)

        _, _, err = runner.train(plans["lora"], 2, steps=1)
        check("rank 0 prints the world and the global batch once",
              err.count("sdrun: world of 2 ranks over MPI") == 1 and "global batch 6 rows = 3 per rank x 2 ranks" in err,
              next((l for l in err.splitlines() if "world" in l), err.strip()[-200:]))

        equal_runs(runner, "LoRA, padded", plans["lora"])
        equal_runs(runner, "LoRA, packed", plans["lora_packed"])
        # Dropout masks follow the global row: rank r's row i is global row r * batch + i.
        equal_runs(runner, "LoRA with dropout 0.2 (masks keyed by global row)", plans["lora_dropout"])
        full = equal_runs(runner, "full fine-tuning, padded", plans["full"])
        equal_runs(runner, "full fine-tuning, packed", plans["full_packed"], ranks=(3,))
        equal_runs(runner, "full fine-tuning, gradient accumulation 2", plans["full"], accum=2, ranks=(2,))

        # OSFT: the gradient projection after the reduction, the re-projection after the (broadcast) update.
        equal_runs(runner, "OSFT, padded", plans["osft"], ranks=(2, 3))
        equal_runs(runner, "--shard optimizer, OSFT, against the unsharded plan", plans["osft_zero1"],
                   reference=plans["osft"], ranks=(2,))

        # DoRA (each step's weight norm from the reduced, updated adapters) and IA3.
        equal_runs(runner, "DoRA, padded", plans["dora"], ranks=(2,))
        equal_runs(runner, "--shard params, DoRA, against the unsharded plan", plans["dora_fsdp"],
                   reference=plans["dora"], ranks=(2,))
        equal_runs(runner, "IA3, padded", plans["ia3"], ranks=(3,))
        equal_runs(runner, "--shard optimizer, LoHa", plans["loha_zero1"], ranks=(2,))
        # DyLoRA: every rank draws the same blocks ([seed, counter] alone), so all step the same blocks.
        equal_runs(runner, "DyLoRA (blocks of 2 of r 4), gradient accumulation 2", plans["dylora"], accum=2, ranks=(3,))
        equal_runs(runner, "--shard grads, LoKr (decompose_both)", plans["lokr_zero2"], ranks=(2,))
        equal_runs(runner, "--shard grads, VeRA", plans["vera_zero2"], ranks=(2,))
        # Prompt tuning: 5 virtual tokens' embeddings, split by rows under --shard params.
        equal_runs(runner, "--shard params, prompt tuning (5 virtual tokens), against the unsharded plan",
                   plans["prompt_fsdp"], reference=plans["prompt"], ranks=(2,))
        equal_runs(runner, "--shard grads, prefix tuning (5 virtual tokens' keys and values)", plans["prefix_zero2"],
                   ranks=(2,))
        equal_runs(runner, "VeRA with dropout 0.2 (masks keyed by global row)", plans["vera_dropout"], ranks=(2,))
        equal_runs(runner, "--shard grads, IA3, against the unsharded plan", plans["ia3_zero2"],
                   reference=plans["ia3"], ranks=(2,))
        # Bottleneck adapters (Houlsby: after the attention and the MLP), whole and split by rows.
        equal_runs(runner, "bottleneck adapters (double_seq_bn)", plans["bottleneck"], ranks=(3,))
        equal_runs(runner, "--shard params, bottleneck adapters, against the unsharded plan", plans["bottleneck_fsdp"],
                   reference=plans["bottleneck"], ranks=(2,))

        # ZeRO-1: each parameter's AdamW state and update on one rank, then broadcast.
        equal_runs(runner, "--shard optimizer, full fine-tuning, against the unsharded plan", plans["full_zero1"],
                   reference=plans["full"])
        equal_runs(runner, "--shard optimizer, LoRA, against the unsharded plan", plans["lora_zero1"],
                   reference=plans["lora"], ranks=(2,))
        equal_runs(runner, "--shard optimizer, gradient accumulation 2", plans["full_zero1"], accum=2, ranks=(3,),
                   reference=plans["full"])
        # ZeRO-2: each micro-batch's gradient goes to its owner, which alone keeps it.
        equal_runs(runner, "--shard grads, full fine-tuning, against the unsharded plan", plans["full_zero2"],
                   reference=plans["full"])
        equal_runs(runner, "--shard grads, gradient accumulation 2", plans["full_zero2"], accum=2, ranks=(2,),
                   reference=plans["full"])
        equal_runs(runner, "--shard grads, LoRA, packed, against the unsharded plan", plans["lora_zero2_packed"],
                   reference=plans["lora_packed"], ranks=(3,))
        dpo_runs(sdc, sdrun, onnx_path, tmp)
        # FSDP: every weight split by rows, gathered before each op that reads it,
        # gradients reduce-scattered into the rows each rank keeps.
        equal_runs(runner, "--shard params, full fine-tuning, against the unsharded plan", plans["full_fsdp"],
                   reference=plans["full"])
        equal_runs(runner, "--shard params, LoRA (frozen weights sharded too), packed, against the unsharded plan",
                   plans["lora_fsdp_packed"], reference=plans["lora_packed"], ranks=(2, 3))
        equal_runs(runner, "--shard params, gradient accumulation 2", plans["full_fsdp"], accum=2, ranks=(3,),
                   reference=plans["full"])
        osft_sharded(runner, plans)
        fp16_sharded(runner, plans)
        steps = plan_steps(sdrun, plans["full_fsdp"])
        check("--shard params: gathers and scatters are plan steps, and no gradient is all-reduced whole",
              steps.get("AllGatherRows", 0) > 0 and steps.get("ReduceScatterRows", 0) > 0 and
              steps.get("AllReduce", 0) == 2, f"{ {k: v for k, v in steps.items() if 'All' in k or 'Scatter' in k} }")
        per_mode = {}
        for mode in ("full_zero1", "full_zero2", "full_fsdp"):
            state = [l for l in sh([sdrun, "inspect", plans[mode]]).splitlines() if l.startswith("training state")]
            per_mode[mode] = [int(x) for x in state[0].split()[-7::3]] if state else []
            total = int(state[0].split()[2]) if state else 0
            per_rank = per_mode[mode]
            check(f"sdrun inspect: {mode} holds less training state per rank as ranks grow",
                  len(per_rank) == 3 and total > per_rank[0] > per_rank[1] >= per_rank[2], state[0] if state else "no line")
        check("--shard grads holds less per rank than --shard optimizer, and params less than grads",
              all(g < o for g, o in zip(per_mode["full_zero2"], per_mode["full_zero1"])) and
              all(p < g for p, g in zip(per_mode["full_fsdp"], per_mode["full_zero2"])), f"{per_mode}")
        frozen = [l for l in sh([sdrun, "inspect", plans["lora_fsdp_packed"]]).splitlines() if l.startswith("frozen weights")]
        sizes = [int(x) for x in frozen[0].split()[-7::3]] if frozen else []
        check("sdrun inspect: --shard params splits the frozen weights of a LoRA plan by rank too",
              len(sizes) == 3 and int(frozen[0].split()[2].rstrip(";")) > sizes[0] > sizes[1] > sizes[2],
              frozen[0] if frozen else "no line")

        # One AllReduce step per gradient against 25 MiB buckets (one bucket here).
        per_tensor, w_pt, _ = runner.train(plans["full_per_tensor"], 2)
        bucketed, w_b, _ = runner.train(plans["full"], 2)
        two_hosts(runner, plans["full"], tmp, (bucketed, w_b))
        check("bucket size: one reduction per gradient equals bucketed reduction on 2 ranks",
              relative(per_tensor, bucketed) <= 1e-5 and weights_gap(w_pt, w_b) <= 1e-5,
              f"losses {relative(per_tensor, bucketed):.2e}, weights {weights_gap(w_pt, w_b):.2e}")
        params = len(read_safetensors(w_b))
        counts = [plan_steps(sdrun, plans[p]).get("AllReduce", 0) for p in ("full", "full_per_tensor")]
        check("25 MiB buckets: one AllReduce for the gradients and one for the token count in train_step, one in "
              "apply; with --bucket-mb 0 one per gradient plus the token count in each",
              counts == [3, 2 * (params + 1)], f"AllReduce steps in train_step + apply: {counts}, {params} parameters")
        overlapped_buckets(runner, sdrun, plans, full)

        # Resume on another world size with the same global batch.
        ck = os.path.join(tmp, "ck")
        straight, _, _ = runner.train(plans["full"], 2, extra=["--checkpoint-dir", ck, "--checkpoint-every", "5"])
        shutil.rmtree(os.path.join(ck, f"checkpoint-{STEPS}"))
        resumed, _, err = runner.train(plans["full"], 3, extra=["--checkpoint-dir", ck, "--resume"])
        tail = resumed[-5:]
        check("resume: checkpointed on 2 ranks at step 5, continued on 3 ranks = 2 ranks straight (steps 6-10)",
              len(resumed) >= 5 and relative(tail, straight[5:]) <= 1e-5,
              f"{relative(tail, straight[5:]) if len(resumed) >= 5 else 'missing steps'}; resumed losses {len(resumed)}")
        check("full fine-tuning on 2 ranks straight equals 1 rank", relative(straight, full) <= 1e-5,
              f"{relative(straight, full):.2e}")

        # Sharded state: rank 0 gathers it into the checkpoint (optimizer state
        # from its owners, rows of every weight with params) and each rank takes
        # its share again on another world size.
        resume_elsewhere(runner, "--shard optimizer", plans["full_zero1"], os.path.join(tmp, "ckz"), 2, 3, full)
        resume_elsewhere(runner, "--shard params", plans["full_fsdp"], os.path.join(tmp, "ckp"), 2, 3, full)
        sharded_checkpoints(runner, plans["full_fsdp"], tmp)

        python_ranks(runner, plans["full"], tmp, bucketed)

        resume_elsewhere(runner, "--shard grads", plans["full_zero2"], os.path.join(tmp, "ckg"), 3, 2)

        # A changed global batch cannot resume.
        r = subprocess.run(mpirun(2) + [sdrun, "train", plans["full"], "--data", data, "--steps", str(STEPS), "--batch",
                                        "2", "--threads", "1", "--checkpoint-dir", ck, "--resume"],
                           capture_output=True, text=True, timeout=120)
        check("resume with another global batch (2 x 2 rows, not 6) is refused by name", r.returncode != 0 and
              "global batch" in r.stderr and "--batch x ranks" in r.stderr,
              next((l for l in r.stderr.splitlines() if "error" in l), r.stderr.strip()[-200:]))

        kill_one_rank(runner, plans["full"], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report_checks("test_ranks", RESULTS)


if __name__ == "__main__":
    sys.exit(main())
