#!/usr/bin/env python3
"""One training step of each PEFT method, sdrun against PyTorch eager + PEFT,
on the same Llama-architecture model (transformers' LlamaForCausalLM from a
config, seeded), batch, sequence and thread count, in one run:

  LoRA, DoRA (use_dora), IA3, LoHa, LoKr and VeRA on q/k/v/o and the MLP
  projections (IA3: down_proj as its feedforward module), r = 8 (VeRA: 256);
  prompt and prefix tuning with 20 virtual tokens (the model runs on 20 +
  128 positions; PEFT's prompt learning computes its own loss); AdaLoRA from
  12 to 8 triplets a module, allocating every step (PyTorch: the model's own
  loss with the orthogonality penalty, and update_and_allocate after the
  step; sdrun: both inside train_step)

sdrun: `sdrun bench PLAN --entry train_step --data` (forward, loss,
backward, AdamW). PyTorch: the same step on the PEFT model (forward,
cross-entropy of the shifted logits, backward, torch.optim.AdamW), each peer
in its own process with the same threads. Median milliseconds per step.

  bench/peft_methods_bench.py [--build build] [--threads 2] [--iterations 20]
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

HIDDEN, INTERMEDIATE, LAYERS, HEADS, VOCAB = 256, 704, 4, 8, 1024
BATCH, SEQ, R, ALPHA = 4, 128, 8, 16
VERA_R = 256  # PEFT's default: VeRA's projections are shared, so its rank is large
VIRTUAL = 20  # prompt and prefix tuning's virtual tokens
ADALORA_INIT_R, ADALORA_TARGET_R, ADALORA_STEPS = 12, 8, 1000  # allocating at every step (tinit 0, deltaT 1)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METHODS = {
    "LoRA": ["--peft", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA)],
    "DoRA": ["--peft", "lora", "--use-dora", "--lora-r", str(R), "--lora-alpha", str(ALPHA)],
    "IA3": ["--peft", "ia3", "--feedforward-modules", "down_proj"],
    "LoHa": ["--peft", "loha", "--lora-r", str(R), "--lora-alpha", str(ALPHA)],
    "LoKr": ["--peft", "lokr", "--lora-r", str(R), "--lora-alpha", str(ALPHA)],
    "VeRA": ["--peft", "vera", "--lora-r", str(VERA_R)],
    "Prompt tuning": ["--peft", "prompt", "--num-virtual-tokens", str(VIRTUAL)],
    "Prefix tuning": ["--peft", "prefix", "--num-virtual-tokens", str(VIRTUAL)],
    "AdaLoRA": ["--peft", "adalora", "--lora-r", str(ADALORA_INIT_R), "--target-r", str(ADALORA_TARGET_R),
                "--lora-alpha", str(ALPHA), "--total-step", str(ADALORA_STEPS)],
}
PROMPT_LEARNING = ("Prompt tuning", "Prefix tuning")  # no target modules; PEFT's own loss


def build_model():
    import torch
    import transformers
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=SEQ, use_cache=False,
        tie_word_embeddings=False, attn_implementation="eager")).eval()


def peft_model(method):
    from peft import (AdaLoraConfig, IA3Config, LoHaConfig, LoKrConfig, LoraConfig, PrefixTuningConfig,
                      PromptTuningConfig, VeraConfig, get_peft_model)
    cfg = {"LoRA": lambda: LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"),
           "DoRA": lambda: LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, use_dora=True,
                                      task_type="CAUSAL_LM"),
           "IA3": lambda: IA3Config(target_modules=TARGETS, feedforward_modules=["down_proj"], task_type="CAUSAL_LM"),
           "LoHa": lambda: LoHaConfig(r=R, alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"),
           "LoKr": lambda: LoKrConfig(r=R, alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"),
           "VeRA": lambda: VeraConfig(r=VERA_R, target_modules=TARGETS, task_type="CAUSAL_LM"),
           "Prompt tuning": lambda: PromptTuningConfig(num_virtual_tokens=VIRTUAL, task_type="CAUSAL_LM"),
           "Prefix tuning": lambda: PrefixTuningConfig(num_virtual_tokens=VIRTUAL, task_type="CAUSAL_LM"),
           "AdaLoRA": lambda: AdaLoraConfig(init_r=ADALORA_INIT_R, target_r=ADALORA_TARGET_R, lora_alpha=ALPHA,
                                            target_modules=TARGETS, total_step=ADALORA_STEPS,
                                            task_type="CAUSAL_LM")}[method]()
    return get_peft_model(build_model(), cfg)


def peft_child(method, threads, iterations):
    """PyTorch eager + PEFT: the median ms of one AdamW step, as JSON."""
    import torch
    torch.set_num_threads(threads)
    model = peft_model(method)
    after_step = None
    if method == "AdaLoRA":
        steps = iter(range(ADALORA_STEPS))
        after_step = lambda: model.base_model.update_and_allocate(next(steps))  # noqa: E731
    print(json.dumps({"median_ms": causal_lm_step_ms(model, iterations, own_loss=method in PROMPT_LEARNING + ("AdaLoRA",),
                                                     after_step=after_step)}))


def causal_lm_step_ms(model, iterations, own_loss=False, after_step=None):
    """The median ms of one AdamW step of `model`'s trainable parameters on
    the shifted cross-entropy of a random batch (`own_loss`: the model's own,
    from labels = the tokens: PEFT's prompt learning pads its labels under the
    virtual tokens)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.tensor(np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ)))

    def loss():
        if own_loss:
            return model(input_ids=ids, labels=ids).loss
        logits = model(input_ids=ids).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    return optimizer_step_ms(loss, opt, iterations, after_step=after_step)


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__)
    if a.peer:
        return peft_child(a.peer, a.threads, a.iterations)
    import numpy as np
    import export_hf
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, data = os.path.join(tmp, "llama.onnx"), os.path.join(tmp, "train.jsonl")
        export_hf.export(build_model(), onnx_path, 17, BATCH, SEQ)
        rng = np.random.default_rng(1)
        with open(data, "w") as f:
            for _ in range(4 * BATCH):
                f.write(json.dumps({"input_ids": rng.integers(0, VOCAB, SEQ).tolist()}) + "\n")
        for method, flags in METHODS.items():
            plan = os.path.join(tmp, method + ".sdp")
            targets = [] if method in PROMPT_LEARNING else ["--target-modules", ",".join(TARGETS)]
            subprocess.run([sdc, "compile", onnx_path, *flags, *targets, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o",
                            plan], check=True, capture_output=True)
            row = {"method": method}
            row["sdrun"] = run_child([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads",
                                      str(a.threads), "--iterations", str(a.iterations), "--warmup", "3"])["median_ms"]
            row["PyTorch+PEFT"] = run_child(me + ["--peer", method], env)["median_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nCPU: {cpu_model()}, {a.threads} threads; {json.dumps(versions())}")
    print(f"Llama d={HIDDEN} ffn={INTERMEDIATE} L={LAYERS} heads={HEADS} vocab={VOCAB}, batch {BATCH} x {SEQ}, "
          f"r={R}; median ms per AdamW step (x: PyTorch+PEFT / sdrun)")
    print(table(rows, ["method"], ["sdrun", "PyTorch+PEFT"], "sdrun"))


if __name__ == "__main__":
    sys.exit(main())
