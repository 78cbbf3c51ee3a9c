#!/usr/bin/env python3
"""GRPO (sdc compile --recipe grpo) against TRL's own GRPOTrainer, on a tiny
Llama built from a config with seeded random weights and the word-level
tokenizer of test_preference.

TRL generates its completions; here its `rollout_func` hands it fixed ones
instead (each prompt's group, in order) and its reward function looks their
rewards up, so TRL's advantages, loss, reference handling, gradient
clipping and AdamW run on exactly the groups sdrun trains on, given as
data lines {"prompt_ids", "completion_ids": [...], "rewards": [...]}. TRL
runs in float64 with test_preference's plain log-probabilities in place of
its float32 fused kernel. Every prompt has the same length, so TRL's left
padding of prompts moves no position.

  lora        LoRA, TRL's default loss (dapo): losses and all adapter tensors
              equal TRL's step for step; the same for loss_type grpo, bnpo,
              dr_grpo, cispo, sapo, luspo and vespo, GSPO's sequence-level importance weights, no reward
              scaling, the KL term against the reference (beta 0.04: the
              base model, TRL's with the adapter disabled), gradient
              accumulation over two micro-batches, and groups an earlier
              policy sampled (their log-probabilities given, TRL's
              old_per_token_logps), where the clipping acts
  text        text lines (prompt, completions through --tokenizer) train as
              the tokenized lines do
  full        full fine-tuning: losses and every trained weight equal TRL's
  ranks       two MPI ranks of one group each (the KL term on) train as one
              rank of both groups does
  sampling    sdrun train --reward-cmd samples each step's groups with the
              plan (--kv-cache) and scores them with a command: training on
              the groups it sampled and the rewards it was given, as data
              lines, gives the same losses and adapter bit for bit; a run
              resumed from a checkpoint samples and trains as the straight
              one; full fine-tuning on a reward for low token ids raises the
              mean reward; a broken reward command or plan is a one-line error
  refusals    bad data lines, mismatched plans and flags: one-line errors
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import ROOT, clean_error_problems, one_line_file, sh, tool_paths
from test_preference import ExactLogProbs, adapter_gap, loss_gap, save_f32, tokenizer, weights_gap
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
G, PROMPTS, SEQ, STEPS, R, ALPHA, LR, EPS = 4, 2, 16, 4, 4, 8, 1e-3, 1e-4
PROMPT_LEN, MAX_COMPLETION = 4, 8
TARGETS = ["q_proj", "v_proj"]


def groups(seed, n):
    """n prompts of PROMPT_LEN words, each with G distinct completions
    (1 to 6 words, then <eos>) and a reward for each. No id 0: the Llama's
    pad_token_id, whose embedding row PyTorch never trains (nn.Embedding's
    padding_idx, which an ONNX export does not record)."""
    rng = np.random.default_rng(seed)
    out, seen = [], set()
    while len(out) < n:
        prompt = [int(x) for x in rng.integers(1, 254, PROMPT_LEN)]
        comps = [[int(x) for x in rng.integers(1, 254, int(rng.integers(1, 7)))] + [255] for _ in range(G)]
        if any(tuple(c) in seen for c in comps):
            continue
        seen.update(tuple(c) for c in comps)
        out.append({"prompt_ids": prompt, "completion_ids": comps,
                    "rewards": [round(float(x), 4) for x in rng.normal(size=G)]})
    return out


def write_lines(path, gs, text=False):
    with open(path, "w") as f:
        for g in gs:
            if text:  # the completions' <eos> comes from the tokenizer, after each completion
                words = lambda ids: " ".join(f"w{t}" for t in ids)
                line = {"prompt": words(g["prompt_ids"]), "completions": [" " + words(c[:-1]) for c in g["completion_ids"]],
                        "rewards": g["rewards"]}
            else:
                line = g
            f.write(json.dumps(line) + "\n")


def with_logps(gs, seed):
    """gs with 'completion_logps': each completion token's log-probability
    under an earlier sampling policy, drawn around the tiny Llama's own
    (about -log 256), so importance weights spread over exp(+-0.5)."""
    rng = np.random.default_rng(seed)
    return [dict(g, completion_logps=[[round(float(x), 4) for x in rng.uniform(-6.05, -5.05, len(c))]
                                      for c in g["completion_ids"]]) for g in gs]


def trl_trainer(model, tok, gs, peft=True, steps=STEPS, accum=1, **config):
    """TRL's GRPOTrainer on `model` in float64 (its parameters rounded to
    float32's values first, which sdrun starts from), its completions and
    rewards those of `gs`."""
    import torch
    import trl.trainer.utils
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer
    trl.trainer.utils._ChunkedLogProbFunction = ExactLogProbs
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.float().double()
    by_prompt = {" ".join(f"w{t}" for t in g["prompt_ids"]): g for g in gs}
    handed = {}

    def rollout(prompts, trainer):  # each prompt comes G times: its completions in order
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for p in prompts:
            g, k = by_prompt[p], handed.get(p, 0)
            handed[p] = k + 1
            c = g["completion_ids"][k % G]
            out["prompt_ids"].append(g["prompt_ids"])
            out["completion_ids"].append(c)
            out["logprobs"].append([0.0] * len(c))
        return out

    table = {tuple(c): r for g in gs for c, r in zip(g["completion_ids"], g["rewards"])}

    def reward(prompts, completions, completion_ids, **kw):
        return [table[tuple(c)] for c in completion_ids]

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="sd_trl_"), per_device_train_batch_size=G * PROMPTS,
                      num_generations=G, gradient_accumulation_steps=accum, max_steps=steps, learning_rate=LR,
                      lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, adam_epsilon=EPS,
                      weight_decay=0.0, report_to="none", use_cpu=True, logging_steps=1, save_strategy="no", seed=0,
                      disable_tqdm=True, shuffle_dataset=False, gradient_checkpointing=False,
                      max_completion_length=MAX_COMPLETION, **config)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM") if peft else None
    prompts = Dataset.from_list([{"prompt": p} for p in by_prompt])
    tr = GRPOTrainer(model=model, args=args, reward_funcs=reward, train_dataset=prompts, processing_class=tok,
                     peft_config=cfg, rollout_func=rollout)
    if "completion_logps" in gs[0]:  # the sampling policy's log-probabilities, as TRL's old_per_token_logps
        import torch
        logps = {tuple(c): l for g in gs for c, l in zip(g["completion_ids"], g["completion_logps"])}
        scored = tr._generate_and_score_completions

        def with_old(inputs):
            out = scored(inputs)
            ids, mask = out["completion_ids"], out["completion_mask"]
            old = torch.zeros(ids.shape, dtype=torch.float64)
            for r in range(ids.shape[0]):
                n = int(mask[r].sum())
                old[r, :n] = torch.tensor(logps[tuple(ids[r, :n].tolist())], dtype=torch.float32).double()
            out["old_per_token_logps"] = old
            return out
        tr._generate_and_score_completions = with_old
    with torch.no_grad():  # the adapter PEFT just made, to float32's values
        for p in tr.model.parameters():
            p.data = p.data.float().double()
    return tr


def trl_losses(tr):
    return [h["loss"] for h in tr.state.log_history if "loss" in h and "train_loss" not in h]


def sdrun_train(sdrun, plan, data, d, tag, extra=(), launcher=(), threads=2):
    metrics = os.path.join(d, f"{tag}.jsonl")
    sh([*launcher, sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--clip-norm", "1.0", "--threads", str(threads), "--metrics", metrics, *extra])
    return [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l and '"eval' not in l]


def compile_plan(sdc, onnx_path, plan, flags, peft=True, rows=G * PROMPTS):
    adapter = ["--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R), "--lora-alpha",
               str(ALPHA)] if peft else ["--trainable", ".*"]
    sh([sdc, "compile", onnx_path, *adapter, "--recipe", "grpo", "--num-generations", str(G), *flags,
        "--adam-epsilon", str(EPS), "--shapes", f"input_ids={rows}x{SEQ}", "-o", plan])


# (name, sdc flags, TRL GRPOConfig fields, gradient accumulation)
LORA_CASES = [
    ("dapo", [], {}, 1),
    ("grpo", ["--grpo-loss", "grpo"], dict(loss_type="grpo"), 1),
    ("bnpo", ["--grpo-loss", "bnpo"], dict(loss_type="bnpo"), 1),
    ("dr_grpo", ["--grpo-loss", "dr_grpo", "--max-completion-length", str(MAX_COMPLETION)],
     dict(loss_type="dr_grpo"), 1),
    ("GSPO (sequence-level weights, loss grpo)", ["--grpo-loss", "grpo", "--importance-sampling", "sequence"],
     dict(loss_type="grpo", importance_sampling_level="sequence"), 1),
    ("scale_rewards none", ["--scale-rewards", "none"], dict(scale_rewards="none"), 1),
    ("beta 0.04 (KL against the base model)", ["--beta", "0.04"], dict(beta=0.04), 1),
    ("dapo over 2 accumulated micro-batches", [], {}, 2),
    # Groups an earlier policy sampled: the weight exp(log p - old) clipped to [0.9, 1.15], capped at 1.3.
    ("sampling log-probabilities, epsilon 0.1 / 0.15, delta 1.3",
     ["--sampling-log-probs", "--grpo-epsilon", "0.1", "--grpo-epsilon-high", "0.15", "--grpo-delta", "1.3"],
     dict(epsilon=0.1, epsilon_high=0.15, delta=1.3), 1),
    ("sampling log-probabilities, GSPO, beta 0.04", ["--sampling-log-probs", "--importance-sampling", "sequence",
                                                     "--grpo-loss", "grpo", "--beta", "0.04"],
     dict(importance_sampling_level="sequence", loss_type="grpo", beta=0.04), 1),
    # CISPO: the weight clipped above (epsilon_high, ScaleRL's 5.0) and detached, times A log p.
    ("cispo, epsilon_high 5", ["--grpo-loss", "cispo", "--grpo-epsilon-high", "5"],
     dict(loss_type="cispo", epsilon_high=5.0), 1),
    ("cispo, sampling log-probabilities, epsilon_high 1.05 (the clip acts)",
     ["--grpo-loss", "cispo", "--sampling-log-probs", "--grpo-epsilon-high", "1.05"],
     dict(loss_type="cispo", epsilon_high=1.05), 1),
    # SAPO: sigmoid(t (w - 1)) 4 / t in place of the clip, t by the advantage's sign.
    ("sapo", ["--grpo-loss", "sapo"], dict(loss_type="sapo"), 1),
    ("sapo, sampling log-probabilities, temperatures 0.8 / 1.3",
     ["--grpo-loss", "sapo", "--sampling-log-probs", "--sapo-temperature-pos", "0.8", "--sapo-temperature-neg", "1.3"],
     dict(loss_type="sapo", sapo_temperature_pos=0.8, sapo_temperature_neg=1.3), 1),
    # LUSPO: GSPO's weights, each completion's token sum averaged over completions.
    ("luspo (sequence-level weights), sampling log-probabilities, beta 0.04",
     ["--grpo-loss", "luspo", "--importance-sampling", "sequence", "--sampling-log-probs", "--beta", "0.04"],
     dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.04), 1),
    # VESPO: a detached gamma weight of each completion's summed log-ratio times A log p.
    ("vespo, sampling log-probabilities", ["--grpo-loss", "vespo", "--sampling-log-probs"],
     dict(loss_type="vespo"), 1),
    ("vespo, sampling log-probabilities, k 1.5 / 2.5, lambda 2.5 / 1.5",
     ["--grpo-loss", "vespo", "--sampling-log-probs", "--vespo-k-pos", "1.5", "--vespo-lambda-pos", "2.5",
      "--vespo-k-neg", "2.5", "--vespo-lambda-neg", "1.5"],
     dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=2.5, vespo_k_neg=2.5, vespo_lambda_neg=1.5), 1),
]


def lora_runs(sdc, sdrun, tmp, onnx_path, tok):
    import torch
    import export_hf
    plans = {}
    for i, (name, flags, config, accum) in enumerate(LORA_CASES):
        d = os.path.join(tmp, f"lora_{i}")
        os.makedirs(d)
        plan, data = os.path.join(d, "plan.sdp"), os.path.join(d, "groups.jsonl")
        compile_plan(sdc, onnx_path, plan, flags)
        plans[name] = plan
        gs = groups(10 + i, PROMPTS * STEPS * accum)
        if "--sampling-log-probs" in flags:
            gs = with_logps(gs, i)
        write_lines(data, gs)
        torch.manual_seed(7)
        tr = trl_trainer(export_hf.build("llama", 0).double(), tok, gs, accum=accum, **config)
        init, trained = os.path.join(d, "init"), os.path.join(d, "trained")
        save_f32(tr.model, init)
        tr.train()
        want = trl_losses(tr)
        extra = ["--adapter", init, "--save-adapter", trained] + (["--grad-accum", str(accum)] if accum > 1 else [])
        losses = sdrun_train(sdrun, plan, data, d, "train", extra)
        gap, n = adapter_gap(tr.model, trained)
        # With the importance weight 1, loss type grpo's loss is each group's mean of -advantage: 0 by
        # construction (its gradient is not). Those runs are held to a zero loss, the others to TRL's.
        zero = bool(want) and max(abs(w) for w in want) < 1e-6
        losses_ok = (len(losses) == len(want) and max(abs(l) for l in losses) < 1e-6 if zero else
                     loss_gap(losses, want) <= 1e-4 and len(set(round(l, 6) for l in losses)) > 1)
        check(f"LoRA, {name}: {STEPS} steps give TRL GRPOTrainer's losses{' (0)' if zero else ''} and all {n} "
              f"adapter tensors (1e-4)", losses_ok and gap <= 1e-4,
              f"losses {[round(l, 6) for l in losses]} vs TRL {[round(l, 6) for l in want]}, "
              f"loss gap {loss_gap(losses, want):.1e}, tensor gap {gap:.1e}")
        if i == 0:
            text = os.path.join(d, "groups_text.jsonl")
            write_lines(text, gs, text=True)
            text_losses = sdrun_train(sdrun, plan, text, d, "text",
                                      ["--adapter", init, "--tokenizer", os.path.join(tmp, "tokenizer")])
            check("text lines (prompt, completions) through --tokenizer train as the tokenized lines do",
                  loss_gap(text_losses, losses) <= 1e-6, f"{text_losses} vs {losses}")
    return plans


def full_run(sdc, sdrun, tmp, onnx_path, tok):
    import torch
    import export_hf
    d = os.path.join(tmp, "full")
    os.makedirs(d)
    plan, data, weights = (os.path.join(d, n) for n in ("plan.sdp", "groups.jsonl", "weights.safetensors"))
    compile_plan(sdc, onnx_path, plan, [], peft=False)
    gs = groups(3, PROMPTS * STEPS)
    write_lines(data, gs)
    torch.manual_seed(7)
    tr = trl_trainer(export_hf.build("llama", 0).double(), tok, gs, peft=False)
    tr.train()
    want = trl_losses(tr)
    losses = sdrun_train(sdrun, plan, data, d, "train", ["--save-weights", weights])
    gap, count = weights_gap(onnx_path, weights, tr.model)
    check(f"full fine-tuning (dapo): {STEPS} steps give TRL's losses and all {count} weights (1e-4)",
          loss_gap(losses, want) <= 1e-4 and gap <= 1e-4 and count >= 10,
          f"losses {losses} vs TRL {want}, weight gap {gap:.1e}")


def ranks_run(sdc, sdrun, tmp, onnx_path):
    """Data parallel: each rank holds whole groups, so two ranks of one group
    equal one rank of two (dapo's token count and the KL term's reference
    copies taken over both)."""
    from safetensors.numpy import load_file
    from test_ranks import MPIRUN, mpirun
    if not MPIRUN:
        check("ranks: mpirun is installed (Debian's openmpi-bin, scripts/install-deps.sh)", False, "not found")
        return
    d = os.path.join(tmp, "ranks")
    os.makedirs(d)
    data = os.path.join(d, "groups.jsonl")
    write_lines(data, groups(5, PROMPTS * STEPS))
    one, two = os.path.join(d, "one.sdp"), os.path.join(d, "two.sdp")
    compile_plan(sdc, onnx_path, one, ["--beta", "0.04"])
    compile_plan(sdc, onnx_path, two, ["--beta", "0.04"], rows=G)
    losses, adapters = [], []
    for tag, launcher, plan in (("one", [], one), ("two", mpirun(2), two)):
        adapter = os.path.join(d, tag)
        losses.append(sdrun_train(sdrun, plan, data, d, tag, ["--save-adapter", adapter], launcher, threads=1))
        adapters.append(load_file(os.path.join(adapter, "adapter_model.safetensors")))
    gap = max(float(np.abs(adapters[0][k] - adapters[1][k]).max() / np.abs(adapters[0][k]).max()) for k in adapters[0])
    check("two ranks of one group each equal one rank of both (beta 0.04): losses and adapter (1e-5)",
          loss_gap(losses[1], losses[0]) <= 1e-5 and gap <= 1e-5 and set(adapters[0]) == set(adapters[1]),
          f"losses {losses[1]} vs {losses[0]}, adapter gap {gap:.1e}")
    # Sampling on two ranks: each samples and scores its own prompts' group; the step's reward is the mean of both.
    sampled = os.path.join(d, "sampled.sdp")
    compile_plan(sdc, onnx_path, sampled, ["--kv-cache", str(SEQ), "--kv-batch", str(G)], rows=G)
    prompts, script = os.path.join(d, "prompts.jsonl"), os.path.join(d, "reward.py")
    with open(prompts, "w") as f:
        for g in groups(6, 4):
            f.write(json.dumps({"prompt_ids": g["prompt_ids"]}) + "\n")
    with open(script, "w") as f:
        f.write(REWARD_SCRIPT)
    sdrun_train(sdrun, sampled, prompts, d, "sampled", ["--reward-cmd", f"{sys.executable} {script}",
                                                        "--max-new-tokens", "4"], mpirun(2), threads=1)
    rewards = [json.loads(l).get("reward") for l in open(os.path.join(d, "sampled.jsonl")) if '"loss"' in l]
    check("--reward-cmd on two ranks: every step reports the mean reward of both ranks' groups",
          len(rewards) == STEPS and all(r is not None and 0 <= r <= 1 for r in rewards), f"{rewards}")


def refuse_all(cases, no_files=()):
    """Each (name, command, needles) must fail cleanly: one line naming the problem."""
    for name, cmd, needles in cases:
        problems, line = clean_error_problems(cmd, needles, no_files=no_files)
        check(f"refused: {name}", not problems, "; ".join(problems) or line)


REWARD_SCRIPT = """import json, sys
log = open(sys.argv[1], "a") if len(sys.argv) > 1 else None
for line in sys.stdin:
    request = json.loads(line)
    ids = request["completion_ids"]
    reward = sum(1 for t in ids if t < 64) / len(ids)
    if log:
        log.write(json.dumps(dict(request, reward=reward)) + "\\n")
        log.flush()
    print(reward, flush=True)
"""


def sampling_runs(sdc, sdrun, tmp, onnx_path):
    """GRPO sampling its own groups: the sampled groups replayed as data, resume, learning."""
    import numpy as np
    from safetensors.numpy import load_file
    d = os.path.join(tmp, "sampling")
    os.makedirs(d)
    script = os.path.join(d, "reward.py")
    with open(script, "w") as f:
        f.write(REWARD_SCRIPT)
    rng = np.random.default_rng(9)
    prompts = os.path.join(d, "prompts.jsonl")
    with open(prompts, "w") as f:
        for _ in range(PROMPTS * 6):
            f.write(json.dumps({"prompt_ids": [int(t) for t in rng.integers(1, 254, PROMPT_LEN)]}) + "\n")
    plan = os.path.join(d, "plan.sdp")
    compile_plan(sdc, onnx_path, plan, ["--kv-cache", str(SEQ), "--kv-batch", str(G)])
    log = os.path.join(d, "scored.jsonl")
    reward = lambda logged=True: f"{sys.executable} {script}" + (f" {log}" if logged else "")
    sampled = ["--reward-cmd", reward(), "--max-new-tokens", "6", "--seed", "5"]
    losses = sdrun_train(sdrun, plan, prompts, d, "online", sampled + ["--save-adapter", os.path.join(d, "online")])
    rewards = [json.loads(l)["reward"] for l in open(os.path.join(d, "online.jsonl")) if '"reward"' in l]
    requests = [json.loads(l) for l in open(log)]
    # The log holds each step's completions in row order: groups of G consecutive ones.
    data = os.path.join(d, "sampled_groups.jsonl")
    with open(data, "w") as f:
        for i in range(0, len(requests), G):
            group = requests[i:i + G]
            assert all(r["prompt_ids"] == group[0]["prompt_ids"] for r in group)
            f.write(json.dumps({"prompt_ids": group[0]["prompt_ids"], "completion_ids": [r["completion_ids"] for r in group],
                                "rewards": [r["reward"] for r in group]}) + "\n")
    replayed = sdrun_train(sdrun, plan, data, d, "replayed", ["--save-adapter", os.path.join(d, "replayed")])
    a, b = (load_file(os.path.join(d, n, "adapter_model.safetensors")) for n in ("online", "replayed"))
    same = set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
    check(f"--reward-cmd: {STEPS} steps of sampled and scored groups ({len(requests)} completions) train as those "
          "groups and rewards given as data lines: losses and adapter bit for bit",
          len(requests) == STEPS * PROMPTS * G and losses == replayed and same and len(rewards) == STEPS,
          f"losses {losses} vs {replayed}, adapters equal: {same}, {len(requests)} completions, rewards {rewards}")
    # The Python module: the same sampling with the reward a Python function, the same run bit for bit.
    child = f"""
import json, sdc
session = sdc.Session(sdc.Plan({plan!r}), threads=2)
reward = lambda batch: [sum(1 for t in r["completion_ids"] if t < 64) / len(r["completion_ids"]) for r in batch]
trainer = sdc.Trainer(session, {prompts!r}, steps={STEPS}, lr={LR}, clip_norm=1.0, shuffle=False, seed=5,
                      reward=reward, max_new_tokens=6)
reports = list(trainer)
session.save_adapter({os.path.join(d, "python")!r})
print(json.dumps({{"losses": [r.loss for r in reports], "rewards": [r.reward for r in reports]}}))
"""
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(sdrun)), "python")))
    got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
    p = load_file(os.path.join(d, "python", "adapter_model.safetensors")) if r.returncode == 0 else {}
    same = set(a) == set(p) and all(np.array_equal(a[k], p[k]) for k in a)
    as_written = lambda values: [float(f"{v:.8g}") for v in values or []]  # the metrics file's 8 digits
    check("sdc.Trainer(reward=a Python function) samples and trains as sdrun train --reward-cmd: losses, rewards "
          "and adapter bit for bit",
          as_written(got.get("losses")) == losses and as_written(got.get("rewards")) == rewards and same,
          f"{got} vs losses {losses}, rewards {rewards}; adapters equal: {same}; {r.stderr.strip()[-400:]}")
    # Resume: each step's sampling is seeded by the step, so a resumed run samples what the straight one did.
    ck = os.path.join(d, "ck")
    sampled = ["--reward-cmd", reward(False), "--max-new-tokens", "6", "--seed", "5"]
    sh([sdrun, "train", plan, "--data", prompts, "--steps", "2", "--no-shuffle", "--lr", str(LR), "--lr-schedule",
        "constant", "--clip-norm", "1.0", "--threads", "2", "--checkpoint-dir", ck, *sampled])
    resumed = sdrun_train(sdrun, plan, prompts, d, "resumed", sampled + ["--checkpoint-dir", ck, "--resume",
                                                                         "--save-adapter", os.path.join(d, "resumed")])
    c = load_file(os.path.join(d, "resumed", "adapter_model.safetensors"))
    same = set(a) == set(c) and all(np.array_equal(a[k], c[k]) for k in a)
    check("--reward-cmd: a run resumed from step 2's checkpoint samples and trains as the straight run",
          resumed == losses[2:] and same, f"resumed {resumed} vs {losses[2:]}, adapters equal: {same}")
    # Learning: full fine-tuning on the fraction of completion ids below 64 (a quarter at random).
    full = os.path.join(d, "full.sdp")
    compile_plan(sdc, onnx_path, full, ["--kv-cache", str(SEQ), "--kv-batch", str(G)], peft=False)
    metrics = os.path.join(d, "learn.jsonl")
    sh([sdrun, "train", full, "--data", prompts, "--steps", "30", "--lr", "1e-2", "--threads", "2", "--metrics",
        metrics, "--reward-cmd", reward(False), "--max-new-tokens", "6", "--seed", "1"])
    rewards = [json.loads(l)["reward"] for l in open(metrics) if '"reward"' in l]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    check("--reward-cmd: 30 steps of full fine-tuning raise the mean reward (the first 5 steps' mean vs the last 5's, "
          "at least +0.3)", len(rewards) == 30 and last >= first + 0.3, f"{first:.3f} -> {last:.3f}: {rewards}")
    # Refusals.
    no_cache = os.path.join(d, "no_cache.sdp")
    compile_plan(sdc, onnx_path, no_cache, [])
    scored = os.path.join(d, "one_group.jsonl")
    write_lines(scored, groups(1, 1))
    # Eval data stays scored groups while the training data is prompts.
    metrics = os.path.join(d, "eval.jsonl")
    sh([sdrun, "train", plan, "--data", prompts, "--steps", "1", "--threads", "2", "--reward-cmd", reward(False),
        "--max-new-tokens", "4", "--eval-data", scored, "--metrics", metrics])
    evals = [json.loads(l)["eval_loss"] for l in open(metrics) if '"eval_loss"' in l]
    check("--reward-cmd with --eval-data: the eval data are scored groups, evaluated after the step",
          len(evals) == 1 and np.isfinite(evals[0]), f"{evals}")
    base = [sdrun, "train", plan, "--data", prompts, "--steps", "1", "--threads", "2"]
    cases = [
        ("a reward that is not a number", base + ["--reward-cmd", "while read l; do echo high; done"],
         ["--reward-cmd", "the reward of completion 1 is not a finite number: 'high'"]),
        ("a reward command that exits", base + ["--reward-cmd", "read l; exit 3"],
         ["exited with status 3 before", "completion 1"]),
        # The shell's own "not found" goes to stderr first (the command's stderr is the user's to read).
        ("a reward command that is not there", base + ["--reward-cmd", "/nonexistent/score 2>/dev/null"],
         ["exited with status 127 before", "completion 1"]),
        ("a silent reward command", base + ["--reward-cmd", "sleep 30", "--reward-timeout", "1"],
         ["gave no reward for completion 1 within 1 s"]),
        ("a plan without a key/value cache", [sdrun, "train", no_cache, "--data", prompts, "--steps", "1",
                                              "--reward-cmd", reward(False)], ["compile it with --kv-cache"]),
        ("scored groups as prompts", base + ["--data", scored, "--reward-cmd", reward(False)],
         ["one_group.jsonl:1", "is not a field of a prompt line"]),
        ("--temperature without --reward-cmd", base + ["--temperature", "0.7"], ["--temperature", "needs --reward-cmd"]),
    ]
    refuse_all(cases)


def refusals(sdc, sdrun, tmp, onnx_path, plan, logps_plan):
    d = os.path.join(tmp, "bad")
    os.makedirs(d)

    data = lambda name, line: one_line_file(d, name, line)

    sft_plan = os.path.join(d, "sft.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--shapes", f"input_ids=2x{SEQ}",
        "-o", sft_plan])
    group = {"prompt_ids": [1, 2], "completion_ids": [[3], [4, 5], [6], [7]], "rewards": [1, 0, 0.5, 0]}
    compile_cmd = [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj"]
    out = ["-o", os.path.join(d, "p.sdp")]
    cases = [
        ("an SFT line on a GRPO plan", [sdrun, "train", plan, "--data", data("sft.jsonl", {"input_ids": [1, 2, 3]})],
         ["sft.jsonl:1", "'input_ids' is not a field of GRPO data"]),
        ("a group on an SFT plan", [sdrun, "train", sft_plan, "--data", data("group.jsonl", group)],
         ["group.jsonl:1", "--recipe grpo"]),
        ("a group of 3 on a plan of 4", [sdrun, "train", plan, "--data",
                                        data("three.jsonl", dict(group, completion_ids=[[3], [4], [5]]))],
         ["three.jsonl:1", "--num-generations 4 completions, it has 3"]),
        ("rewards that do not match", [sdrun, "train", plan, "--data", data("rew.jsonl", dict(group, rewards=[1, 2]))],
         ["rew.jsonl:1", "'rewards' must list 4 numbers"]),
        ("a reward that is not a number", [sdrun, "train", plan, "--data",
                                          data("nan.jsonl", dict(group, rewards=[1, "x", 0, 0]))],
         ["nan.jsonl:1", "'rewards'[1] is not a finite number"]),
        ("no rewards", [sdrun, "train", plan, "--data",
                        data("none.jsonl", {"prompt_ids": [1], "completion_ids": group["completion_ids"]})],
         ["none.jsonl:1", "needs 'rewards'"]),
        ("an empty completion", [sdrun, "train", plan, "--data",
                                 data("empty.jsonl", dict(group, completion_ids=[[3], [], [4], [5]]))],
         ["empty.jsonl:1", "completion_ids[1] has no tokens"]),
        ("an id outside the vocabulary", [sdrun, "train", plan, "--data",
                                          data("vocab.jsonl", dict(group, completion_ids=[[3], [999], [4], [5]]))],
         ["vocab.jsonl:1", "'completion_ids[1]'[0] = 999"]),
        ("--batch above the plan's groups", [sdrun, "train", plan, "--data", data("ok.jsonl", group), "--batch",
                                             str(PROMPTS + 1)], [f"plan's batch {PROMPTS} groups"]),
        ("rows that split a group", [*compile_cmd, "--recipe", "grpo", "--num-generations", "4", "--shapes",
                                     f"input_ids=6x{SEQ}", *out], ["a multiple of 4"]),
        ("--num-generations 1", [*compile_cmd, "--recipe", "grpo", "--num-generations", "1", *out],
         ["--num-generations needs an integer from 2"]),
        ("--num-generations without grpo", [*compile_cmd, "--recipe", "dpo", "--num-generations", "4", *out],
         ["--num-generations needs --recipe grpo"]),
        ("--grpo-loss other", [*compile_cmd, "--recipe", "grpo", "--grpo-loss", "sigmoid", *out],
         ["--grpo-loss takes 'dapo', 'grpo', 'bnpo', 'dr_grpo', 'cispo', 'sapo', 'luspo' or 'vespo'"]),
        ("--vespo-k-pos without --grpo-loss vespo", [*compile_cmd, "--recipe", "grpo", "--vespo-k-pos", "2", *out],
         ["need --grpo-loss vespo"]),
        ("--sapo-temperature-pos without --grpo-loss sapo", [*compile_cmd, "--recipe", "grpo",
                                                            "--sapo-temperature-pos", "2", *out],
         ["--sapo-temperature-pos and --sapo-temperature-neg need --grpo-loss sapo"]),
        ("--sapo-temperature-neg 0", [*compile_cmd, "--recipe", "grpo", "--grpo-loss", "sapo",
                                      "--sapo-temperature-neg", "0", *out],
         ["--sapo-temperature-neg needs a positive number"]),
        ("--scale-rewards batch", [*compile_cmd, "--recipe", "grpo", "--scale-rewards", "batch", *out],
         ["--scale-rewards takes 'group' or 'none'", "whole generation batch"]),
        ("--lora-dropout", [*compile_cmd, "--recipe", "grpo", "--lora-dropout", "0.1", *out], ["disable_dropout"]),
        ("--grpo-epsilon without sampling log-probabilities", [*compile_cmd, "--recipe", "grpo", "--grpo-epsilon",
                                                               "0.1", *out], ["add --sampling-log-probs"]),
        ("--grpo-delta 1", [*compile_cmd, "--recipe", "grpo", "--sampling-log-probs", "--grpo-delta", "1", *out],
         ["--grpo-delta needs a number above 1"]),
        ("log-probabilities on a plan that takes none", [sdrun, "train", plan, "--data", data("lp.jsonl", dict(
            group, completion_logps=[[-1.0], [-1.0, -2.0], [-1.0], [-1.0]]))],
         ["lp.jsonl:1", "'completion_logps' is for plans compiled with --sampling-log-probs"]),
        ("a group without log-probabilities on a plan that takes them", [sdrun, "train", logps_plan, "--data",
                                                                         data("nolp.jsonl", group)],
         ["nolp.jsonl:1", "needs 'completion_logps'"]),
        ("a log-probability above 0", [sdrun, "train", logps_plan, "--data", data("pos.jsonl", dict(
            group, completion_logps=[[-1.0], [-1.0, 0.5], [-1.0], [-1.0]]))],
         ["pos.jsonl:1", "'completion_logps'[1][1] is not a log-probability"]),
        ("log-probabilities that miss a token", [sdrun, "train", logps_plan, "--data", data("short.jsonl", dict(
            group, completion_logps=[[-1.0], [-1.0], [-1.0], [-1.0]]))],
         ["short.jsonl:1", "'completion_logps'[1] must hold 2 numbers"]),
        ("--reward-cmd on a plan that takes log-probabilities", [sdrun, "train", logps_plan, "--data",
                                                                 data("p.jsonl", {"prompt_ids": [1, 2]}),
                                                                 "--reward-cmd", "cat"],
         ["compile the plan without --sampling-log-probs"]),
    ]
    refuse_all(cases, no_files=[os.path.join(d, "p.sdp")])


def main():
    sdc, sdrun = tool_paths()
    import torch
    import export_hf
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    tmp = tempfile.mkdtemp(prefix="sd_grpo_")
    try:
        tok = tokenizer(os.path.join(tmp, "tokenizer"))
        onnx_path = os.path.join(tmp, "llama.onnx")
        export_hf.export(export_hf.build("llama", 0), onnx_path, opset=17, batch=G * PROMPTS, seq=SEQ)
        plans = {}
        for part in ("lora", "full", "ranks", "sampling", "refusals"):
            try:
                if part == "lora":
                    plans = lora_runs(sdc, sdrun, tmp, onnx_path, tok)
                elif part == "full":
                    full_run(sdc, sdrun, tmp, onnx_path, tok)
                elif part == "ranks":
                    ranks_run(sdc, sdrun, tmp, onnx_path)
                elif part == "sampling":
                    sampling_runs(sdc, sdrun, tmp, onnx_path)
                else:
                    refusals(sdc, sdrun, tmp, onnx_path, plans["dapo"],
                             plans["sampling log-probabilities, epsilon 0.1 / 0.15, delta 1.3"])
            except Exception as e:  # one failing part must not hide the others
                check(f"{part} runs", False, f"{type(e).__name__}: {str(e)[-600:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_grpo")


if __name__ == "__main__":
    sys.exit(main())
