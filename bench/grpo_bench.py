#!/usr/bin/env python3
"""One GRPO training step (LoRA), sdrun against TRL's GRPOTrainer on PyTorch
eager + PEFT, on the same Llama-architecture model, sequence length and
thread count as bench/dpo_bench.py, in one run:

  LoRA r = 8 on q/k/v/o and the MLP projections; 2 prompts of 4 scored
  completions per step (8 rows), every sequence (prompt 48 tokens,
  completion 79, EOS) exactly 128 tokens; TRL's default loss (dapo), beta 0
  (no reference model)

sdrun: `sdrun bench PLAN --entry train_step --data` on a --recipe grpo plan
(advantages from the rewards, forward, loss, backward, AdamW). TRL:
GRPOTrainer.compute_loss on the batch its own _generate_and_score_completions
prepared from these completions (handed over by a rollout_func, so no
sampling is timed; advantages are computed there, outside the step),
backward and torch.optim.AdamW, without gradient checkpointing.
PyTorch+PEFT: the same loss written plainly (log_softmax and gather over the
logits, exp(logp - logp.detach()) times the advantages TRL computed, summed
over the completion tokens over their count), the same backward and AdamW:
PyTorch without TRL's tiled CPU log-probability and entropy kernels. Each peer
in its own process with the same threads. Median milliseconds per step.

The online step, sampling included: the same 2 prompts' groups sampled with
the policy (temperature 1, the whole vocabulary, at most 80 new tokens: 79
and EOS, through a key/value cache), scored by a reward on the completion's
ids (the fraction below VOCAB / 4), then the step above. sdrun: `sdrun train
--reward-cmd` on the plan compiled with --kv-cache 128 --kv-batch 8, the
reward a Python command started once; the median of the per-step times its
metrics give (elapsed_s differences, the first step left out). TRL:
GRPOTrainer.train() generating with transformers' generate (use_cache on),
the reward a Python function; the median of its logged step_time (the first
step left out).

  bench/grpo_bench.py [--build build] [--threads 2] [--iterations 20]
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from peers import bench_cli, cpu_model, optimizer_step_ms, run_child, table, versions  # noqa: E402
from peft_methods_bench import ALPHA, HEADS, HIDDEN, INTERMEDIATE, LAYERS, R, SEQ, TARGETS, VOCAB, build_model  # noqa: E402
from dpo_bench import COMPLETION, PROMPT, tokenizer  # noqa: E402

G, PROMPTS = 4, 2


def group_lines(seed):
    """PROMPTS groups: prompt ids, G completions (ids then EOS) and their rewards."""
    import numpy as np
    rng = np.random.default_rng(seed)
    ids = lambda n: [int(t) for t in rng.integers(0, VOCAB - 2, n)]
    return [{"prompt_ids": ids(PROMPT), "completion_ids": [ids(COMPLETION) + [VOCAB - 1] for _ in range(G)],
             "rewards": [float(r) for r in rng.normal(size=G)]} for _ in range(PROMPTS)]


REWARD_SCRIPT = f"""import json, sys
for line in sys.stdin:
    ids = json.loads(line)["completion_ids"]
    print(sum(1 for t in ids if t < {VOCAB // 4}) / len(ids), flush=True)
"""


def online_child(threads, iterations):
    """TRL's GRPOTrainer.train(), generation and scoring included: the median ms of a step, as JSON."""
    import statistics
    import warnings
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    model = build_model()
    model.config.use_cache = model.generation_config.use_cache = True
    prompts = [" ".join(f"w{t}" for t in g["prompt_ids"]) for g in group_lines(1)]

    def reward(completion_ids, **kw):
        return [sum(1 for t in ids if t < VOCAB // 4) / max(len(ids), 1) for ids in completion_ids]

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=G * PROMPTS, num_generations=G,
                          max_completion_length=COMPLETION + 1, max_steps=iterations + 1, logging_steps=1,
                          report_to="none", use_cpu=True, gradient_checkpointing=False, disable_tqdm=True,
                          save_strategy="no", temperature=1.0, top_k=0)
        tr = GRPOTrainer(model=model, args=args, reward_funcs=reward,
                         train_dataset=Dataset.from_list([{"prompt": p} for p in prompts * (iterations + 1)]),
                         processing_class=tokenizer(),
                         peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
        tr.train()
    times = [h["step_time"] for h in tr.state.log_history if "step_time" in h][1:]
    print(json.dumps({"median_ms": 1000 * statistics.median(times)}))


def sdrun_online_ms(sdc, sdrun, onnx_path, tmp, threads, iterations):
    """sdrun train --reward-cmd: the median ms of a step, sampling and scoring included."""
    import statistics
    plan, prompts, script, metrics = (os.path.join(tmp, n) for n in ("online.sdp", "prompts.jsonl", "reward.py",
                                                                      "online.jsonl"))
    subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA),
                    "--target-modules", ",".join(TARGETS), "--recipe", "grpo", "--num-generations", str(G),
                    "--kv-cache", str(SEQ), "--kv-batch", str(G * PROMPTS), "--shapes", f"input_ids={G * PROMPTS}x{SEQ}",
                    "-o", plan], check=True, capture_output=True)
    with open(prompts, "w") as f:
        for g in group_lines(1):
            f.write(json.dumps({"prompt_ids": g["prompt_ids"]}) + "\n")
    with open(script, "w") as f:
        f.write(REWARD_SCRIPT)
    subprocess.run([sdrun, "train", plan, "--data", prompts, "--steps", str(iterations + 1), "--threads", str(threads),
                    "--reward-cmd", f"{sys.executable} {script}", "--max-new-tokens", str(COMPLETION + 1),
                    "--metrics", metrics, "--lr", "1e-4"], check=True, capture_output=True)
    elapsed = [json.loads(l)["elapsed_s"] for l in open(metrics) if '"elapsed_s"' in l]
    return 1000 * statistics.median(b - a for a, b in zip(elapsed, elapsed[1:]))


def trl_child(peer, threads, iterations):
    """TRL's GRPOTrainer loss (peer "trl") or the plain one ("torch"),
    backward and AdamW: the median ms of one step, as JSON."""
    import warnings
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer
    warnings.filterwarnings("ignore")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    torch.set_num_threads(threads)
    groups = group_lines(1)
    by_prompt = {f"p{i}": g for i, g in enumerate(groups)}
    handed = {}

    def rollout(prompts, trainer):
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for p in prompts:
            g, k = by_prompt[p], handed.get(p, 0)
            handed[p] = k + 1
            out["prompt_ids"].append(g["prompt_ids"])
            out["completion_ids"].append(g["completion_ids"][k % G])
            out["logprobs"].append([0.0] * (COMPLETION + 1))
        return out

    table_ = {tuple(c): r for g in groups for c, r in zip(g["completion_ids"], g["rewards"])}
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=G * PROMPTS, num_generations=G,
                          max_completion_length=COMPLETION + 1, report_to="none", use_cpu=True,
                          gradient_checkpointing=False, disable_tqdm=True)
        tr = GRPOTrainer(model=build_model(), args=args,
                         reward_funcs=lambda completion_ids, **kw: [table_[tuple(c)] for c in completion_ids],
                         train_dataset=Dataset.from_list([{"prompt": p} for p in by_prompt]),
                         processing_class=tokenizer(), rollout_func=rollout,
                         peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    model = tr.model.train()
    tr.current_gradient_accumulation_steps = 1  # what Trainer's loop sets before each step
    batch = tr._generate_and_score_completions([{"prompt": p} for p in by_prompt for _ in range(G)])
    rows = batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1]
    assert batch["completion_ids"].shape[0] == G * PROMPTS and rows == SEQ, (batch["completion_ids"].shape, rows)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask, adv, start = batch["completion_mask"], batch["advantages"].unsqueeze(1), batch["prompt_ids"].shape[1]

    def plain_loss():  # DAPO with the importance weight exp(0), as TRL's with num_iterations 1
        logits = model(input_ids=ids).logits[:, start - 1:-1]
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, start:].unsqueeze(-1)).squeeze(-1)
        return (-torch.exp(logp - logp.detach()) * adv * mask).sum() / mask.sum()

    with torch.no_grad():  # the plain loss is TRL's
        gap = abs(float(plain_loss()) - float(tr.compute_loss(model, batch)))
    assert gap < 1e-5, f"the plain GRPO loss differs from TRL's by {gap}"
    loss = (lambda: tr.compute_loss(model, batch)) if peer == "trl" else plain_loss
    print(json.dumps({"median_ms": optimizer_step_ms(loss, opt, iterations)}))


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__)
    if a.peer == "online":
        return online_child(a.threads, a.iterations)
    if a.peer:
        return trl_child(a.peer, a.threads, a.iterations)
    import export_hf
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, data, plan = (os.path.join(tmp, n) for n in ("llama.onnx", "groups.jsonl", "grpo.sdp"))
        export_hf.export(build_model(), onnx_path, 17, G * PROMPTS, SEQ)
        with open(data, "w") as f:
            for g in group_lines(1):
                f.write(json.dumps(g) + "\n")
        subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA),
                        "--target-modules", ",".join(TARGETS), "--recipe", "grpo", "--num-generations", str(G),
                        "--shapes", f"input_ids={G * PROMPTS}x{SEQ}", "-o", plan], check=True, capture_output=True)
        row = {"step": "GRPO (dapo), LoRA"}
        row["sdrun"] = run_child([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads",
                                  str(a.threads), "--iterations", str(a.iterations), "--warmup", "3"])["median_ms"]
        row["TRL GRPOTrainer"] = run_child(me + ["--peer", "trl"], env)["median_ms"]
        row["PyTorch+PEFT"] = run_child(me + ["--peer", "torch"], env)["median_ms"]
        print(json.dumps(row), flush=True)
        online = {"step": "GRPO online (sample, score, step), LoRA",
                  "sdrun": sdrun_online_ms(sdc, sdrun, onnx_path, tmp, a.threads, a.iterations),
                  "TRL GRPOTrainer": run_child(me + ["--peer", "online"], env)["median_ms"]}
        print(json.dumps(online), flush=True)
    print(f"\nCPU: {cpu_model()}, {a.threads} threads; {json.dumps(versions())}")
    print(f"Llama d={HIDDEN} ffn={INTERMEDIATE} L={LAYERS} heads={HEADS} vocab={VOCAB}, {PROMPTS} prompts x {G} "
          f"completions x {SEQ} tokens, LoRA r={R}; median ms per GRPO step with AdamW (x: peer / sdrun)")
    print(table([row, online], ["step"], ["sdrun", "TRL GRPOTrainer", "PyTorch+PEFT"], "sdrun"))


if __name__ == "__main__":
    sys.exit(main())
