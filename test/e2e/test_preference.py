#!/usr/bin/env python3
"""Preference optimization (sdc compile --recipe dpo, simpo, orpo, kto) against
TRL's own trainers (DPOTrainer; CPOTrainer with loss_type simpo;
ORPOTrainer; KTOTrainer), on a tiny Llama built from a config with seeded random weights
and a word-level tokenizer made here.

TRL runs in float64, with one change: its fused, tiled log-probability
kernel (trl.kernels.ChunkedLogProbFunction) accumulates in float32 whatever
the model's dtype, and its gradients part from float64 autograd's by 2e-4
(the first step's gradient norm 0.129670 against 0.129641, which a plain
float64 PyTorch DPO loss and sdrun both give). The test puts the same
per-token log-probabilities, from plain PyTorch ops, in its place, so TRL's
tokenization, collation, loss, reference handling, clipping and AdamW are
what sdrun is held to.

  lora        LoRA (PEFT's default start: zero B, so DPO's reference is the
              base model, as TRL's with adapters disabled): sdrun train's
              losses and adapter tensors equal TRL's step for step, with
              gradient clipping; the same with DPO's ipo and hinge losses,
              SimPO (with CPO's cross-entropy term) and ORPO
  full        full fine-tuning: the reference is the initial weights (TRL's
              ref_model copy); losses and every trained weight equal TRL's
  from adapter  starting from a trained adapter, the reference is that
              adapter's model (TRL's "ref" adapter): the first loss is
              exactly log 2, and the run equals TRL's
  data        text lines (prompt, chosen, rejected through --tokenizer)
              train exactly as TRL's tokenized prompt_ids/chosen_ids/
              rejected_ids lines do
  eval        --eval-data's loss after training equals TRL's evaluate()
  resume      a run stopped at a checkpoint and resumed equals one run
              (the reference copies are restored with the checkpoint)
  kto         unpaired examples (KTO, desirable and undesirable, weighted):
              LoRA and full fine-tuning equal KTOTrainer's losses and
              tensors step for step, its KL estimate from the batch's
              rotated completions included; the first loss is 0.5 times
              the mean weight
  refusals    bad data lines, mismatched plans and flags: one-line errors
"""
import json
import math
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import ROOT, clean_error_problems, one_line_file, rel_err, sh, tool_paths
from test_peft_roundtrip import initializers
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
# AdamW's epsilon well above float32's noise in the gradients: DPO's first
# gradients are differences of chosen and rejected terms that share a prompt,
# and with epsilon 1e-8 Adam's first, sign-like steps would follow that noise
# (TRL's own float32 and float64 runs part at 5e-5 after three steps).
PAIRS, SEQ, STEPS, R, ALPHA, LR, BETA, EPS = 4, 16, 5, 4, 8, 1e-3, 0.1, 1e-4
GAMMA, CPO_ALPHA = 0.5, 1.0  # TRL's CPOConfig defaults
UNDESIRABLE_WEIGHT = 1.5  # KTO: TRL's default is 1; another value shows the weights apply
TARGETS = ["q_proj", "v_proj"]
VOCAB = 256


def tokenizer(folder):
    """Words w0..w253, <pad> 254, <eos> 255, split on whitespace (WordPiece
    whose every word is in the vocabulary)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {f"w{i}": i for i in range(254)}
    vocab.update({"<pad>": 254, "<eos>": 255})
    tok = Tokenizer(models.WordPiece(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    ht = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="<eos>",
                                              pad_token="<pad>")
    ht.save_pretrained(folder)
    return ht


def pair_texts(seed, n):
    rng = np.random.default_rng(seed)
    words = lambda k: " ".join(f"w{i}" for i in rng.integers(0, 254, k))
    return [{"prompt": words(int(rng.integers(2, 6))), "chosen": " " + words(int(rng.integers(1, 6))),
             "rejected": " " + words(int(rng.integers(1, 6)))} for _ in range(n)]


class ExactLogProbs:
    """trl.kernels.ChunkedLogProbFunction's outputs from plain PyTorch ops,
    differentiated by autograd in the model's dtype."""

    @staticmethod
    def apply(hidden, weight, bias, labels, temperature, chunk_size, softcap, logit_scale, outputs):
        import torch
        logits = hidden @ weight.T + (bias if bias is not None else 0)
        logits = logits * logit_scale
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        logits = logits / temperature
        logp = torch.log_softmax(logits, -1)
        picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        want = lambda name, f: f() if name in outputs else None
        return (picked, want("entropy", lambda: -(logp.exp() * logp).sum(-1)),
                want("log_sum_sq_probs", lambda: torch.logsumexp(2 * logp, -1)),
                want("mean_logits", lambda: logits.mean(-1)),
                want("is_top1", lambda: logits.argmax(-1) == labels))


def trl_trainer(model, tok, texts, loss_type="sigmoid", peft=True, steps=STEPS, ref_model=None, method="dpo"):
    """TRL's trainer for `method` (DPOTrainer; CPOTrainer with loss_type
    simpo; ORPOTrainer) on `model` in float64 (its parameters rounded to
    float32's values first, which sdrun starts from)."""
    import torch
    import trl.trainer.utils
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from trl import KTOConfig, KTOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer
    trl.trainer.utils._ChunkedLogProbFunction = ExactLogProbs
    with torch.no_grad():
        for m in (model, ref_model or model):
            for p in m.parameters():
                p.data = p.data.float().double()
    config, trainer, extra = {"dpo": (DPOConfig, DPOTrainer, dict(loss_type=[loss_type])),
                              "simpo": (CPOConfig, CPOTrainer, dict(loss_type="simpo", simpo_gamma=GAMMA,
                                                                    cpo_alpha=CPO_ALPHA)),
                              "orpo": (ORPOConfig, ORPOTrainer, {}),
                              "kto": (KTOConfig, KTOTrainer, dict(undesirable_weight=UNDESIRABLE_WEIGHT))}[method]
    args = config(output_dir=tempfile.mkdtemp(prefix="sd_trl_"), per_device_train_batch_size=PAIRS,
                  per_device_eval_batch_size=PAIRS, max_steps=steps, learning_rate=LR, lr_scheduler_type="constant",
                  warmup_steps=0, max_grad_norm=1.0, beta=BETA, adam_epsilon=EPS, weight_decay=0.0, report_to="none",
                  use_cpu=True, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
                  gradient_checkpointing=False, **extra)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, task_type="CAUSAL_LM") if peft is True else None
    kwargs = dict(ref_model=ref_model) if method in ("dpo", "kto") else {}
    tr = trainer(model=model, args=args, train_dataset=texts_dataset(texts), eval_dataset=texts_dataset(texts),
                 processing_class=tok, peft_config=cfg, **kwargs)
    with torch.no_grad():  # the adapter PEFT just made, to float32's values
        for p in tr.model.parameters():
            p.data = p.data.float().double()
    return tr


def save_f32(pm, folder):
    """PEFT's save_pretrained, the float64 tensors stored as float32 (exact: they hold float32 values)."""
    from safetensors.numpy import load_file, save_file
    pm.save_pretrained(folder)
    path = os.path.join(folder, "adapter_model.safetensors")
    save_file({k: v.astype(np.float32) for k, v in load_file(path).items()}, path)


def texts_dataset(texts):
    from datasets import Dataset
    return Dataset.from_list(texts)


def trl_losses(tr):
    return [h["loss"] for h in tr.state.log_history if "loss" in h and "train_loss" not in h]


def write_token_pairs(tr, path):
    """TRL's own tokenization of the pairs, as sdrun's token-id lines (CPO's
    and ORPO's hold prompt + completion sequences: their prompt is cut off)."""
    with open(path, "w") as f:
        for row in tr.train_dataset:
            if "prompt_ids" not in row:
                n = len(row["prompt_input_ids"])
                assert all(row[k][:n] == row["prompt_input_ids"] for k in ("chosen_input_ids", "rejected_input_ids"))
                row = {"prompt_ids": row["prompt_input_ids"], "chosen_ids": row["chosen_input_ids"][n:],
                       "rejected_ids": row["rejected_input_ids"][n:]}
            f.write(json.dumps({k: row[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}) + "\n")


def sdrun_train(sdrun, plan, data, d, tag, extra=()):
    metrics = os.path.join(d, f"{tag}.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--clip-norm", "1.0", "--threads", "2", "--metrics", metrics, *extra])
    return [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l and '"eval' not in l], metrics


def loss_gap(got, want):
    if len(got) != len(want) or not want:
        return float("inf")
    return max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(got, want))


def adapter_gap(pm, trained):
    from peft import get_peft_model_state_dict
    from safetensors.numpy import load_file
    theirs = {k.replace(".default", ""): v.detach().numpy() for k, v in get_peft_model_state_dict(pm).items()}
    ours = load_file(os.path.join(trained, "adapter_model.safetensors"))
    if set(ours) != set(theirs):
        return float("inf"), len(theirs)
    return max(rel_err(ours[k], v) for k, v in theirs.items()), len(theirs)


def lora_runs(sdc, sdrun, tmp, onnx_path, tok):
    """LoRA from PEFT's default start: DPO with each of its three losses, SimPO and ORPO."""
    import torch
    import export_hf
    texts = pair_texts(1, PAIRS)
    data = os.path.join(tmp, "pairs.jsonl")
    plans = {}
    for method, loss_type in (("dpo", "sigmoid"), ("dpo", "ipo"), ("dpo", "hinge"), ("simpo", None), ("orpo", None)):
        name = loss_type or method
        d = os.path.join(tmp, f"lora_{name}")
        os.makedirs(d)
        plan = os.path.join(d, "plan.sdp")
        flags = {"dpo": ["--dpo-loss", str(loss_type)], "orpo": [],
                 "simpo": ["--simpo-gamma", str(GAMMA), "--cpo-alpha", str(CPO_ALPHA)]}[method]
        sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R),
            "--lora-alpha", str(ALPHA), "--recipe", method, "--beta", str(BETA), *flags,
            "--adam-epsilon", str(EPS), "--shapes", f"input_ids={2 * PAIRS}x{SEQ}", "-o", plan])
        plans[name] = plan
        torch.manual_seed(7)
        tr = trl_trainer(export_hf.build("llama", 0).double(), tok, texts, loss_type, method=method)
        init, trained = os.path.join(d, "init"), os.path.join(d, "trained")
        save_f32(tr.model, init)
        write_token_pairs(tr, data)
        tr.train()
        want = trl_losses(tr)
        extra = ["--adapter", init, "--save-adapter", trained]
        if loss_type == "sigmoid":
            extra += ["--eval-data", data]
        losses, metrics = sdrun_train(sdrun, plan, data, d, "train", extra)
        gap, n = adapter_gap(tr.model, trained)
        who = {"dpo": f"DPO {loss_type}: TRL's DPOTrainer", "simpo": "SimPO: TRL's CPOTrainer (loss_type simpo)",
               "orpo": "ORPO: TRL's ORPOTrainer"}[method]
        check(f"LoRA, {who}: {STEPS} steps give its losses and all {n} adapter tensors (1e-4)",
              loss_gap(losses, want) <= 1e-4 and gap <= 1e-4 and len(set(round(l, 6) for l in losses)) > 1,
              f"losses {[round(l, 6) for l in losses]} vs TRL {[round(l, 6) for l in want]}, "
              f"loss gap {loss_gap(losses, want):.1e}, tensor gap {gap:.1e}")
        if loss_type == "sigmoid":
            check("LoRA sigmoid: the first step's loss is log 2 (the policy starts as the reference)",
                  abs(losses[0] - math.log(2)) <= 1e-6, f"{losses[0]!r}")
            ours = [json.loads(l)["eval_loss"] for l in open(metrics) if '"eval_loss"' in l]
            theirs = tr.evaluate()["eval_loss"]
            check("--eval-data's loss after training equals TRL's evaluate()",
                  len(ours) == 1 and rel_err(np.float64(ours[0]), np.float64(theirs)) <= 1e-4,
                  f"sdrun {ours} vs TRL {theirs}")
            text_data = os.path.join(d, "pairs_text.jsonl")
            with open(text_data, "w") as f:
                for t in texts:
                    f.write(json.dumps({"prompt": t["prompt"], "chosen": t["chosen"], "rejected": t["rejected"]}) + "\n")
            tok_dir = os.path.join(tmp, "tokenizer")
            text_losses, _ = sdrun_train(sdrun, plan, text_data, d, "text", ["--adapter", init, "--tokenizer", tok_dir])
            check("text lines through --tokenizer train as TRL's tokenized lines do",
                  loss_gap(text_losses, losses) <= 1e-6, f"{text_losses} vs {losses}")
            resumed(sdrun, plan, data, d, init, losses)
    return plans


def resumed(sdrun, plan, data, d, init, straight):
    ck = os.path.join(d, "ck")
    first, _ = sdrun_train(sdrun, plan, data, d, "first", ["--adapter", init, "--checkpoint-dir", ck,
                                                             "--checkpoint-every", "2"])
    metrics = os.path.join(d, "resumed.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--clip-norm", "1.0", "--threads", "2", "--metrics", metrics,
        "--checkpoint-dir", os.path.join(d, "ck2"), "--checkpoint-every", "2"])
    # A second folder: stop after step 2, then resume it (the reference copies come back from the checkpoint).
    ck3 = os.path.join(d, "ck3")
    part = os.path.join(d, "part.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", "2", "--no-shuffle", "--lr", str(LR), "--lr-schedule",
        "constant", "--clip-norm", "1.0", "--threads", "2", "--adapter", init, "--checkpoint-dir", ck3])
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--clip-norm", "1.0", "--threads", "2", "--checkpoint-dir", ck3, "--resume",
        "--metrics", part])
    rest = [json.loads(l)["loss"] for l in open(part) if '"loss"' in l]
    check("a run resumed from step 2's checkpoint gives the straight run's losses (reference restored)",
          loss_gap(first, straight) == 0 and loss_gap(rest, straight[2:]) <= 1e-6,
          f"resumed {rest} vs straight {straight[2:]}")


def full_run(sdc, sdrun, tmp, onnx_path, tok):
    """Full fine-tuning: the reference is the initial weights."""
    import torch
    import export_hf
    d = os.path.join(tmp, "full")
    os.makedirs(d)
    plan, data, weights = (os.path.join(d, n) for n in ("plan.sdp", "pairs.jsonl", "weights.safetensors"))
    sh([sdc, "compile", onnx_path, "--trainable", ".*", "--recipe", "dpo", "--adam-epsilon", str(EPS), "--shapes", f"input_ids={2 * PAIRS}x{SEQ}",
        "-o", plan])
    texts = pair_texts(2, PAIRS)
    torch.manual_seed(7)
    import copy
    model = export_hf.build("llama", 0).double()
    tr = trl_trainer(model, tok, texts, peft=False, ref_model=copy.deepcopy(model))
    write_token_pairs(tr, data)
    tr.train()
    want = trl_losses(tr)
    losses, _ = sdrun_train(sdrun, plan, data, d, "train", ["--save-weights", weights])
    gap, count = weights_gap(onnx_path, weights, tr.model)
    check(f"full fine-tuning: {STEPS} steps give TRL's losses (ref_model: the initial weights) and all "
          f"{count} weights (1e-4)", loss_gap(losses, want) <= 1e-4 and gap <= 1e-4 and count >= 10,
          f"losses {losses} vs TRL {want}, weight gap {gap:.1e}")


def weights_gap(onnx_path, weights, model):
    """The largest relative gap between sdrun's saved weights and `model`'s,
    and how many were compared (inf unless every saved weight was matched)."""
    import export_hf
    from safetensors.numpy import load_file
    # Exporters fold Linear's transpose into renamed initializers: match them by their initial values.
    initial = initializers(onnx_path)
    start = {k: v.detach().float().numpy() for k, v in export_hf.build("llama", 0).state_dict().items()}
    theirs = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    ours, pairs = load_file(weights), {}
    for name, v in ours.items():
        for key, w in start.items():
            if w.shape == initial[name].shape and np.array_equal(w, initial[name]):
                pairs[name] = (key, False)
            elif w.T.shape == initial[name].shape and np.array_equal(w.T, initial[name]):
                pairs[name] = (key, True)
    gaps = [rel_err(ours[n], theirs[k].T if t else theirs[k]) for n, (k, t) in pairs.items()]
    return (max(gaps) if gaps and len(pairs) == len(ours) else float("inf")), len(pairs)


def from_adapter(sdrun, tmp, plan, tok):
    """A run from a trained (random) adapter measures against that adapter's model."""
    import torch
    import export_hf
    from peft import LoraConfig, get_peft_model
    d = os.path.join(tmp, "from_adapter")
    os.makedirs(d)
    init, data, trained = (os.path.join(d, n) for n in ("init", "pairs.jsonl", "trained"))
    torch.manual_seed(3)
    pm = get_peft_model(export_hf.build("llama", 0), LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS,
                                                                 init_lora_weights=False, task_type="CAUSAL_LM"))
    pm.save_pretrained(init)
    pm = pm.double()  # TRL copies a given adapter into its "ref" adapter, the reference
    tr = trl_trainer(pm, tok, pair_texts(4, PAIRS), peft=None)
    write_token_pairs(tr, data)
    tr.train()
    want = trl_losses(tr)
    losses, _ = sdrun_train(sdrun, plan, data, d, "train", ["--adapter", init, "--save-adapter", trained])
    gap, n = adapter_gap(tr.model, trained)
    check(f"from a trained adapter: the first loss is log 2 and {STEPS} steps give TRL's (its 'ref' adapter) losses "
          f"and all {n} adapter tensors", abs(losses[0] - math.log(2)) <= 1e-6 and loss_gap(losses, want) <= 1e-4 and
          gap <= 1e-4, f"losses {losses} vs TRL {want}, tensor gap {gap:.1e}")


def unpaired_texts(seed, n):
    """KTO's examples: a prompt, a completion and whether it is desirable."""
    rng = np.random.default_rng(seed)
    words = lambda k: " ".join(f"w{i}" for i in rng.integers(0, 254, k))
    return [{"prompt": words(int(rng.integers(2, 6))), "completion": " " + words(int(rng.integers(1, 6))),
             "label": bool(desirable)} for desirable in (True, False, True, False)[:n]]


def kto_runs(sdc, sdrun, tmp, onnx_path, tok):
    """KTO on unpaired examples, LoRA (the reference the base model) and full
    fine-tuning (the initial weights), against TRL's KTOTrainer."""
    import copy
    import torch
    import export_hf
    texts = unpaired_texts(2, PAIRS)
    lora_plan = None
    for peft in (True, False):
        name = "LoRA" if peft else "full fine-tuning"
        d = os.path.join(tmp, "kto_lora" if peft else "kto_full")
        os.makedirs(d)
        plan, data, trained = (os.path.join(d, n) for n in ("plan.sdp", "examples.jsonl", "trained"))
        method = ["--peft", "lora", "--target-modules", ",".join(TARGETS), "--lora-r", str(R), "--lora-alpha",
                  str(ALPHA)] if peft else ["--peft", "none"]
        sh([sdc, "compile", onnx_path, *method, "--recipe", "kto", "--beta", str(BETA), "--undesirable-weight",
            str(UNDESIRABLE_WEIGHT), "--adam-epsilon", str(EPS), "--shapes", f"input_ids={2 * PAIRS}x{SEQ}", "-o",
            plan])
        torch.manual_seed(7)
        model = export_hf.build("llama", 0).double()
        ref = None if peft else copy.deepcopy(model)
        tr = trl_trainer(model, tok, texts, peft=peft, ref_model=ref, method="kto")
        with open(data, "w") as f:
            for row in tr.train_dataset:
                f.write(json.dumps({k: row[k] for k in ("prompt_ids", "completion_ids", "label")}) + "\n")
        extra = []
        if peft:
            lora_plan = plan
            init = os.path.join(d, "init")
            save_f32(tr.model, init)
            extra = ["--adapter", init, "--save-adapter", trained]
        else:
            extra = ["--save-weights", os.path.join(d, "weights.safetensors")]
        tr.train()
        want = trl_losses(tr)
        kls = [round(h["kl"], 6) for h in tr.state.log_history if "kl" in h and "train_loss" not in h]
        losses, _ = sdrun_train(sdrun, plan, data, d, "train", extra)
        if peft:
            gap, n = adapter_gap(tr.model, trained)
            what = f"all {n} adapter tensors"
        else:
            gap, n = weights_gap(onnx_path, os.path.join(d, "weights.safetensors"), tr.model)
            what = f"all {n} weights"
        # The policy starts as the reference: every example's loss is its weight times 1 - sigmoid(0).
        first = 0.5 * np.mean([1.0 if t["label"] else UNDESIRABLE_WEIGHT for t in texts])
        check(f"KTO, {name}: TRL's KTOTrainer (undesirable_weight {UNDESIRABLE_WEIGHT}): {STEPS} steps give its "
              f"losses and {what} (1e-4); the first loss is {first} (the policy starts as the reference)",
              loss_gap(losses, want) <= 1e-4 and gap <= 1e-4 and abs(losses[0] - first) <= 1e-6 and
              (not peft or max(kls) > 0) and  # LoRA's run reaches a KL estimate above the clamp
              len(set(round(l, 6) for l in losses)) > 1,
              f"losses {[round(l, 6) for l in losses]} vs TRL {[round(l, 6) for l in want]}, "
              f"loss gap {loss_gap(losses, want):.1e}, tensor gap {gap:.1e}; TRL's KL estimates {kls}")
    return lora_plan


def refusals(sdc, sdrun, tmp, onnx_path, plan, kto_plan):
    d = os.path.join(tmp, "bad")
    os.makedirs(d)
    data = lambda name, line: one_line_file(d, name, line)
    sft_plan = os.path.join(d, "sft.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--shapes", f"input_ids=2x{SEQ}",
        "-o", sft_plan])
    pair = {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5]}
    import export_hf  # torch.onnx.export's default: the batch fixed at the example's 1 row
    fixed = os.path.join(d, "fixed.onnx")
    export_hf.export(export_hf.build("llama", 0), fixed, 17, 1, SEQ, fixed_batch=True)
    cases = [
        ("an SFT line on a preference plan", [sdrun, "train", plan, "--data", data("sft.jsonl", {"input_ids": [1, 2, 3]})],
         ["sft.jsonl:1", "'input_ids' is not a field of preference data"]),
        ("a pair on an SFT plan", [sdrun, "train", sft_plan, "--data", data("pair.jsonl", pair)],
         ["pair.jsonl:1", "--recipe dpo"]),
        ("a pair without rejected", [sdrun, "train", plan, "--data",
                                     data("norej.jsonl", {"prompt": "w1", "chosen": " w2"})],
         ["norej.jsonl:1", "needs 'rejected'"]),
        ("an empty completion", [sdrun, "train", plan, "--data",
                                 data("empty.jsonl", {"prompt_ids": [1, 2], "chosen_ids": [], "rejected_ids": [3]})],
         ["empty.jsonl:1", "chosen completion has no tokens"]),
        ("an id outside the vocabulary", [sdrun, "train", plan, "--data",
                                          data("vocab.jsonl", {"prompt_ids": [1], "chosen_ids": [999], "rejected_ids": [3]})],
         ["vocab.jsonl:1", "'chosen_ids'[0] = 999"]),
        ("a pair longer than the plan", [sdrun, "train", plan, "--data",
                                         data("long.jsonl", {"prompt_ids": [1] * SEQ, "chosen_ids": [2], "rejected_ids": [3]})],
         ["long.jsonl:1", "--truncate"]),
        ("--batch above the plan's pairs", [sdrun, "train", plan, "--data", data("ok.jsonl", pair), "--batch",
                                            str(PAIRS + 1)], [f"plan's batch {PAIRS} pairs"]),
        ("an odd batch", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--recipe", "dpo",
                          "--shapes", f"input_ids=8x{SEQ},3x{SEQ}", "-o", os.path.join(d, "p.sdp")],
         [f"--shapes input_ids=8x{SEQ},3x{SEQ}", "two per pair"]),
        ("a model whose export fixed an odd batch", [sdc, "compile", fixed, "--peft", "lora", "--target-modules",
                                                     "q_proj", "--recipe", "dpo", "-o", os.path.join(d, "p.sdp")],
         ["--recipe dpo: the model fixes its batch at 1 rows", "export the model with an even or a dynamic batch"]),
        ("--packing", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--recipe", "orpo",
                       "--packing", "-o", os.path.join(d, "p.sdp")], ["--recipe orpo takes no --packing"]),
        ("--lora-dropout", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--lora-dropout",
                            "0.1", "--recipe", "dpo", "-o", os.path.join(d, "p.sdp")], ["disable_dropout"]),
        ("--beta without a preference recipe", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules",
                                                "q_proj", "--beta", "0.2", "-o", os.path.join(d, "p.sdp")],
         ["--beta needs --recipe dpo, simpo, orpo, kto or grpo"]),
        ("--dpo-loss with simpo", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj",
                                   "--recipe", "simpo", "--dpo-loss", "ipo", "-o", os.path.join(d, "p.sdp")],
         ["--dpo-loss needs --recipe dpo"]),
        ("--beta 0", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--recipe", "dpo",
                      "--beta", "0", "-o", os.path.join(d, "p.sdp")], ["--beta needs a positive number"]),
        ("--dpo-loss other", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj", "--recipe",
                              "dpo", "--dpo-loss", "kto", "-o", os.path.join(d, "p.sdp")], ["sigmoid', 'ipo' or 'hinge"]),
        ("a pair on a KTO plan", [sdrun, "train", kto_plan, "--data", data("pair.jsonl", pair)],
         ["pair.jsonl:1", "'chosen_ids' is not a field of unpaired preference data"]),
        ("a KTO example on a DPO plan", [sdrun, "train", plan, "--data",
                                         data("kto.jsonl", {"prompt_ids": [1], "completion_ids": [2], "label": True})],
         ["kto.jsonl:1", "'completion_ids' is not a field of preference data"]),
        ("a KTO example whose label is not a boolean", [sdrun, "train", kto_plan, "--data",
                                                        data("label.jsonl", {"prompt": "w1", "completion": " w2",
                                                                             "label": "good"})],
         ["label.jsonl:1", "'label' must be true (desirable) or false"]),
        ("--undesirable-weight with dpo", [sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj",
                                           "--recipe", "dpo", "--undesirable-weight", "2", "-o",
                                           os.path.join(d, "p.sdp")], ["--undesirable-weight needs --recipe kto"]),
    ]
    for name, cmd, needles in cases:
        problems, line = clean_error_problems(cmd, needles, no_files=[os.path.join(d, "p.sdp")])
        check(f"refused: {name}", not problems, "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    import torch
    import export_hf
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    tmp = tempfile.mkdtemp(prefix="sd_preference_")
    try:
        tok = tokenizer(os.path.join(tmp, "tokenizer"))
        onnx_path = os.path.join(tmp, "llama.onnx")
        export_hf.export(export_hf.build("llama", 0), onnx_path, opset=17, batch=2 * PAIRS, seq=SEQ)
        plans, kto_plan = {}, None
        for part in ("lora", "full", "from_adapter", "kto", "refusals"):
            try:
                if part == "lora":
                    plans = lora_runs(sdc, sdrun, tmp, onnx_path, tok)
                elif part == "full":
                    full_run(sdc, sdrun, tmp, onnx_path, tok)
                elif part == "from_adapter":
                    from_adapter(sdrun, tmp, plans["sigmoid"], tok)
                elif part == "kto":
                    kto_plan = kto_runs(sdc, sdrun, tmp, onnx_path, tok)
                else:
                    refusals(sdc, sdrun, tmp, onnx_path, plans["sigmoid"], kto_plan)
            except Exception as e:  # one failing part must not hide the others
                check(f"{part} runs", False, f"{type(e).__name__}: {str(e)[-600:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_preference")


if __name__ == "__main__":
    sys.exit(main())
