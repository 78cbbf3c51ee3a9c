#!/usr/bin/env python3
"""One DPO training step (LoRA), sdrun against TRL's DPOTrainer on PyTorch
eager + PEFT, on the same Llama-architecture model (transformers'
LlamaForCausalLM from a config, seeded), pairs, sequence length and thread
count, in one run:

  LoRA r = 8 on q/k/v/o and the MLP projections; 4 pairs per step, every
  sequence (prompt 48 tokens, completion 79, EOS) exactly 128 tokens, so
  neither side pads; DPO's sigmoid loss, beta 0.1

sdrun: `sdrun bench PLAN --entry train_step --data` on a --recipe dpo plan
(policy forward, the reference forward on the reference copies, loss,
backward, AdamW). TRL: DPOTrainer.compute_loss on the collated batch (its
policy forward, the reference forward with the adapter disabled, its fused
log-probability head), backward and torch.optim.AdamW, without gradient
checkpointing (TRL's default turns it on, which would cost it a forward).
PyTorch+PEFT: the same loss written plainly (log_softmax and gather over the
logits, the reference under torch.no_grad() with the adapter disabled), the
same backward and AdamW: PyTorch without TRL's tiled CPU log-probability
kernels. Each peer in its own process with the same threads. Median
milliseconds per step.

  bench/dpo_bench.py [--build build] [--threads 2] [--iterations 20]
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

PAIRS, PROMPT, COMPLETION, BETA = 4, 48, 79, 0.1


def pair_lines(seed):
    """PAIRS prompt/chosen/rejected texts over words w0.. (one token each)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    words = lambda n: " ".join(f"w{i}" for i in rng.integers(0, VOCAB - 2, n))
    return [{"prompt": words(PROMPT), "chosen": " " + words(COMPLETION), "rejected": " " + words(COMPLETION)}
            for _ in range(PAIRS)]


def tokenizer():
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(VOCAB - 2)}
    vocab.update({"<pad>": VOCAB - 2, "<eos>": VOCAB - 1})
    tok = Tokenizer(models.WordPiece(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="<eos>",
                                                pad_token="<pad>")


def trl_child(peer, threads, iterations):
    """TRL's DPOTrainer loss (peer "trl") or the plain one ("torch"), backward
    and AdamW: the median ms of one step, as JSON."""
    import warnings
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        args = DPOConfig(output_dir=out, per_device_train_batch_size=PAIRS, beta=BETA, report_to="none", use_cpu=True,
                         gradient_checkpointing=False, disable_tqdm=True)
        tr = DPOTrainer(model=build_model(), args=args, train_dataset=Dataset.from_list(pair_lines(1)),
                        processing_class=tokenizer(),
                        peft_config=LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    batch = tr.data_collator([tr.train_dataset[i] for i in range(PAIRS)])
    assert batch["input_ids"].shape == (2 * PAIRS, SEQ), batch["input_ids"].shape
    model = tr.model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids, completion = batch["input_ids"], batch["completion_mask"][:, 1:]

    def log_probs(m):
        logits = m(input_ids=ids).logits[:, :-1]
        picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return (picked * completion).sum(-1).chunk(2)  # TRL's [chosen; rejected] halves

    def plain_loss():
        with torch.no_grad(), model.disable_adapter():
            ref_chosen, ref_rejected = log_probs(model)
        chosen, rejected = log_probs(model)
        margin = (chosen - ref_chosen) - (rejected - ref_rejected)
        return -torch.nn.functional.logsigmoid(BETA * margin).mean()

    with torch.no_grad():  # the plain loss is TRL's
        gap = abs(float(plain_loss()) - float(tr.compute_loss(model, batch)))
    assert gap < 1e-5, f"the plain DPO loss differs from TRL's by {gap}"

    loss = (lambda: tr.compute_loss(model, batch)) if peer == "trl" else plain_loss
    print(json.dumps({"median_ms": optimizer_step_ms(loss, opt, iterations)}))


def main():
    a, sdc, sdrun, me = bench_cli(__doc__, __file__)
    if a.peer:
        return trl_child(a.peer, a.threads, a.iterations)
    import export_hf
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, data, plan = (os.path.join(tmp, n) for n in ("llama.onnx", "pairs.jsonl", "dpo.sdp"))
        export_hf.export(build_model(), onnx_path, 17, 2 * PAIRS, SEQ)
        tok = tokenizer()
        with open(data, "w") as f:  # TRL's tokenization: prompt + completion + EOS
            for p in pair_lines(1):
                ids = lambda t: tok(t, add_special_tokens=False)["input_ids"]
                f.write(json.dumps({"prompt_ids": ids(p["prompt"]), "chosen_ids": ids(p["chosen"]) + [VOCAB - 1],
                                    "rejected_ids": ids(p["rejected"]) + [VOCAB - 1]}) + "\n")
        subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA),
                        "--target-modules", ",".join(TARGETS), "--recipe", "dpo", "--beta", str(BETA),
                        "--shapes", f"input_ids={2 * PAIRS}x{SEQ}", "-o", plan], check=True, capture_output=True)
        row = {"step": "DPO, LoRA"}
        row["sdrun"] = run_child([sdrun, "bench", plan, "--entry", "train_step", "--data", data, "--threads",
                                  str(a.threads), "--iterations", str(a.iterations), "--warmup", "3"])["median_ms"]
        row["TRL DPOTrainer"] = run_child(me + ["--peer", "trl"], env)["median_ms"]
        row["PyTorch+PEFT"] = run_child(me + ["--peer", "torch"], env)["median_ms"]
        print(json.dumps(row), flush=True)
    print(f"\nCPU: {cpu_model()}, {a.threads} threads; {json.dumps(versions())}")
    print(f"Llama d={HIDDEN} ffn={INTERMEDIATE} L={LAYERS} heads={HEADS} vocab={VOCAB}, {PAIRS} pairs x 2 rows x "
          f"{SEQ} tokens, LoRA r={R}; median ms per DPO step with AdamW (x: peer / sdrun)")
    print(table([row], ["step"], ["sdrun", "TRL DPOTrainer", "PyTorch+PEFT"], "sdrun"))


if __name__ == "__main__":
    sys.exit(main())
