#!/usr/bin/env python3
"""One KTO training step (LoRA), sdrun against TRL's KTOTrainer on PyTorch
eager + PEFT, on the same Llama-architecture model, examples, sequence length
and thread count as bench/dpo_bench.py, in one run:

  LoRA r = 8 on q/k/v/o and the MLP projections; 4 examples per step (two
  desirable, two not), every sequence (prompt 48 tokens, completion 79, EOS)
  exactly 128 tokens, and so every KL sequence (a prompt with another
  example's completion); KTO's loss, beta 0.1

sdrun: `sdrun bench PLAN --entry train_step --data` on a --recipe kto plan
(8 rows: each example and its KL row, under the policy and the reference
copies; loss, backward, AdamW). TRL: KTOTrainer.compute_loss on the collated
batch (the KL sequences' policy forward without gradients, the examples'
policy forward, both again as the reference with the adapter disabled),
backward and torch.optim.AdamW, without gradient checkpointing. Each peer in
its own process with the same threads. Median milliseconds per step.

  bench/kto_bench.py [--build build] [--threads 2] [--iterations 20]
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
from dpo_bench import BETA, PAIRS, pair_lines, tokenizer  # noqa: E402

EXAMPLES = PAIRS


def example_lines(seed):
    """KTO's examples: dpo_bench's prompts with their chosen completions, desirable and not in turn."""
    return [{"prompt": p["prompt"], "completion": p["chosen"], "label": i % 2 == 0}
            for i, p in enumerate(pair_lines(seed))]


def trl_child(threads, iterations):
    """TRL's KTOTrainer loss, backward and AdamW: the median ms of one step, as JSON."""
    import warnings
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import KTOConfig, KTOTrainer
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        args = KTOConfig(output_dir=out, per_device_train_batch_size=EXAMPLES, beta=BETA, report_to="none",
                         use_cpu=True, gradient_checkpointing=False, disable_tqdm=True)
        tr = KTOTrainer(model=build_model(), args=args, train_dataset=Dataset.from_list(example_lines(1)),
                        processing_class=tokenizer(),
                        peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    batch = tr.data_collator([tr.train_dataset[i] for i in range(EXAMPLES)])
    assert batch["input_ids"].shape == (EXAMPLES, SEQ), batch["input_ids"].shape
    assert batch["KL_input_ids"].shape == (EXAMPLES, SEQ), batch["KL_input_ids"].shape
    model = tr.model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    print(json.dumps({"median_ms": optimizer_step_ms(lambda: tr.compute_loss(model, batch), opt, iterations)}))


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__)
    if a.peer:
        return trl_child(a.threads, a.iterations)
    import export_hf
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, data, plan = (os.path.join(tmp, n) for n in ("llama.onnx", "examples.jsonl", "kto.sdp"))
        export_hf.export(build_model(), onnx_path, 17, 2 * EXAMPLES, SEQ)
        tok = tokenizer()
        with open(data, "w") as f:  # TRL's tokenization: prompt + completion + EOS
            for e in example_lines(1):
                ids = lambda t: tok(t, add_special_tokens=False)["input_ids"]
                f.write(json.dumps({"prompt_ids": ids(e["prompt"]), "completion_ids": ids(e["completion"]) + [VOCAB - 1],
                                    "label": e["label"]}) + "\n")
        subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA),
                        "--target-modules", ",".join(TARGETS), "--recipe", "kto", "--beta", str(BETA),
                        "--shapes", f"input_ids={2 * EXAMPLES}x{SEQ}", "-o", plan], check=True, capture_output=True)
        row = {"step": "KTO, LoRA"}
        row["sdrun"] = run_child([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads",
                                  str(a.threads), "--iterations", str(a.iterations), "--warmup", "3"])["median_ms"]
        row["TRL KTOTrainer"] = run_child(me + ["--peer", "trl"], env)["median_ms"]
        print(json.dumps(row), flush=True)
    print(f"\nCPU: {cpu_model()}, {a.threads} threads; {json.dumps(versions())}")
    print(f"Llama d={HIDDEN} ffn={INTERMEDIATE} L={LAYERS} heads={HEADS} vocab={VOCAB}, {EXAMPLES} examples x 2 rows "
          f"(the example, its KL row) x {SEQ} tokens, LoRA r={R}; median ms per KTO step with AdamW (x: TRL / sdrun)")
    print(table([row], ["step"], ["sdrun", "TRL KTOTrainer"], "sdrun"))


if __name__ == "__main__":
    sys.exit(main())
