#!/usr/bin/env python3
"""Prompt tuning (sdc compile --peft prompt) and prefix tuning (--peft
prefix) against the real Hugging Face PEFT (PromptTuningConfig and
PrefixTuningConfig, task CAUSAL_LM), on transformers' GPT-2 and a tiny
Llama (grouped-query attention) built from configs with seeded random
weights, and on a Llama exported with attention_mask and position_ids:

  training   sdrun train from PEFT's random start gives PEFT's AdamW losses
             (prompt tuning: -100 labels under the virtual tokens, so the
             last one predicts the first token; prefix tuning: every layer's
             trained keys and values before the tokens, positions from N) and
             prompt_embeddings step for step (1e-4 relative)
  sdc->PEFT  the saved adapter loads in PeftModel.from_pretrained with
             exactly PEFT's key and no warnings; PEFT's logits (prompt tuning:
             covering the virtual tokens too) equal sdrun infer --adapter's
  generate   sdrun generate behind the trained virtual tokens equals PEFT's
             greedy continuation token for token: with --kv-cache (two rows,
             the virtual ids fed first in prefill chunks) on every model, and
             through the infer entry's window on Llama (prefix tuning: PEFT's
             forward token by token, as PEFT's generate with a prefix fails
             on this Llama without a cache)
  starts     --prompt-init vocab starts every virtual token at a row of the
             model's embedding table (PEFT's SAMPLE_VOCAB), and the saved
             config says so; --prompt-init text (with --tokenizer) starts
             them as PEFT's TEXT start does, bit for bit
  projection --prefix-projection (PEFT's prefix_projection) from the plan's
             MLP gives PEFT's losses and saves PEFT's prefix (the MLP's
             output), which PEFT and a plain prefix plan run alike
  bf16       --precision bf16 plans train from the same start, their losses
             within 2e-2 of f32's
  refusals   an adapter of another num_virtual_tokens or another method, a
             LoRA adapter on the prompt plan, and sdc merge of a prompt: one
             line, no file left
"""
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np

from e2e_util import (ROOT, clean_error_problems, export_with_positions, rel_err, sdrun_logits, sh, tool_paths,
                      write_token_rows)
from test_peft_roundtrip import peft_warnings
from test_qlora import plan_globals
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
BATCH, SEQ, STEPS, VIRTUAL, LR = 2, 16, 8, 5, 1e-2


def peft_prompt_steps(pm, rows):
    """PEFT's own steps: AdamW on the prompt, PEFT's loss on labels = the tokens."""
    import torch
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=LR, eps=1e-8, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        ids = torch.tensor([rows[(step * BATCH + i) % len(rows)] for i in range(BATCH)])
        loss = pm(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def losses_of(metrics):
    return [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]


def peft_config(method):
    from peft import PrefixTuningConfig, PromptTuningConfig
    config = PrefixTuningConfig if method == "prefix" else PromptTuningConfig
    return config(task_type="CAUSAL_LM", num_virtual_tokens=VIRTUAL)


def greedy(model, prompt, new):
    """Greedy continuation of the prompt's bytes through the model's forward
    alone (PEFT's generate with a prefix breaks on this transformers'
    Llama without a cache), as bytes."""
    import torch
    ids = list(prompt.encode())
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return bytes(ids)


def continuation(method, model, prompt, new):
    from test_kv_cache import reference
    return greedy(model, prompt, new) if method == "prefix" else reference(model, prompt, new=new)


def model_checks(name, method, arch, onnx_path, d, sdc, sdrun):
    import torch
    from peft import PeftModel, get_peft_model
    from safetensors.numpy import load_file
    import export_hf

    data = os.path.join(d, "train.jsonl")
    write_token_rows(data, np.random.default_rng(3), 256, 2 * STEPS, SEQ)
    rows = [json.loads(l)["input_ids"] for l in open(data)]
    plan = os.path.join(d, "plan.sdp")
    sh([sdc, "compile", onnx_path, "--peft", method, "--num-virtual-tokens", str(VIRTUAL), "--shapes",
        f"input_ids={BATCH}x{SEQ}", "--infer-shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])

    torch.manual_seed(11)
    pm = get_peft_model(export_hf.build(arch, 0), peft_config(method))
    init, trained, metrics = (os.path.join(d, n) for n in ("init", "trained", "metrics.jsonl"))
    pm.save_pretrained(init)
    want = peft_prompt_steps(pm, rows)
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics,
        "--save-adapter", trained])
    losses = losses_of(metrics)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
    theirs = pm.prompt_encoder["default"].embedding.weight.detach().numpy()
    ours = load_file(os.path.join(trained, "adapter_model.safetensors"))
    start = load_file(os.path.join(init, "adapter_model.safetensors"))["prompt_embeddings"]
    err = rel_err(ours["prompt_embeddings"], theirs) if set(ours) == {"prompt_embeddings"} else float("inf")
    moved = float(np.abs(ours.get("prompt_embeddings", start) - start).max())
    check(f"{name}: {STEPS} steps from PEFT's random start give PEFT's losses and prompt embeddings "
          f"{list(theirs.shape)} (1e-4)",
          loss_err <= 1e-4 and err <= 1e-4 and moved > 0,
          f"losses {losses[:2]} vs PEFT {want[:2]}, worst loss err {loss_err:.1e}, embeddings err {err:.1e}, "
          f"moved {moved:.1e}, keys {sorted(ours)}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), trained).eval()
    cfg = json.load(open(os.path.join(trained, "adapter_config.json")))
    check(f"{name} sdc->PEFT: the adapter loads in PEFT with no warnings, {VIRTUAL} virtual tokens",
          not peft_warnings(caught) and loaded.peft_config["default"].num_virtual_tokens == VIRTUAL and
          cfg["peft_type"] == method.upper() + "_TUNING",
          "; ".join(peft_warnings(caught)) or "no warnings")
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    with torch.no_grad():
        want_logits = loaded(input_ids=torch.tensor(ids)).logits.numpy()
    got = sdrun_logits(sdrun, plan, trained, ids, d, "ours")
    err = rel_err(got, want_logits) if got.shape == want_logits.shape else float("inf")
    positions = f"{VIRTUAL} + {SEQ}" if method == "prompt" else f"the {SEQ} tokens'"
    check(f"{name} sdc->PEFT: PEFT's logits over {positions} positions equal sdrun infer --adapter's (1e-4)",
          err <= 1e-4, f"shapes {got.shape} and {want_logits.shape}, relative err {err:.2e}")
    cached_generation(name, method, onnx_path, d, trained, loaded, sdc, sdrun)
    return plan, init, trained, losses


def cached_generation(name, method, onnx_path, d, trained, loaded, sdc, sdrun):
    """--kv-cache: the generator feeds the virtual ids first, through prefill
    chunks of 5 (the prompt split across chunks), two rows at once."""
    from test_kv_cache import generate
    plan = os.path.join(d, "kv.sdp")
    sh([sdc, "compile", onnx_path, "--peft", method, "--num-virtual-tokens", str(VIRTUAL), "--shapes",
        f"input_ids={BATCH}x{SEQ}", "--kv-cache", "48", "--kv-batch", "2", "--prefill-chunk", "5", "--speculate", "3",
        "-o", plan])
    prompts = ["In the beginning", "And God said"]
    want = b"\n".join(continuation(method, loaded, p, 12) for p in prompts)
    got = generate(sdrun, plan, prompts, "--adapter", trained, new=12).rstrip(b"\n")
    guessing = generate(sdrun, plan, prompts, "--adapter", trained, "--speculate-always", new=12).rstrip(b"\n")
    check(f"{name} --kv-cache: sdrun generate of two rows behind the trained virtual tokens equals PEFT's greedy "
          f"{'forward' if method == 'prefix' else 'generate'}, also checking every guessed token (--speculate 3, "
          f"the verify entry behind the virtual tokens)", got == want == guessing, f"{got!r} / {guessing!r} vs {want!r}")


def vocab_init(onnx_path, d, sdc, sdrun, build):
    """--prompt-init vocab: every virtual token starts at one of the table's rows."""
    import onnx
    from onnx import numpy_helper
    plan = os.path.join(d, "vocab.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "prompt", "--num-virtual-tokens", str(VIRTUAL), "--prompt-init",
        "vocab", "--seed", "3", "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    _, values = plan_globals(build, plan, ["prompt_embeddings"])
    prompt = values.get("prompt_embeddings")
    table = next(numpy_helper.to_array(t) for t in onnx.load(onnx_path).graph.initializer
                 if numpy_helper.to_array(t).shape == (256, 64))
    rows = [int(np.flatnonzero((table == r).all(axis=1))[0]) if (table == r).all(axis=1).any() else -1
            for r in (prompt if prompt is not None else [])]
    saved = os.path.join(d, "vocab_adapter")
    sh([sdrun, "train", plan, "--data", os.path.join(d, "train.jsonl"), "--steps", "1", "--threads", "2",
        "--save-adapter", saved])
    init = json.load(open(os.path.join(saved, "adapter_config.json")))["prompt_tuning_init"]
    check(f"--prompt-init vocab: each of the {VIRTUAL} virtual tokens starts at a row of the embedding table, "
          f"and the config says SAMPLE_VOCAB",
          len(rows) == VIRTUAL and min(rows) >= 0 and init == "SAMPLE_VOCAB", f"rows {rows}, prompt_tuning_init {init}")


def byte_tokenizer(folder):
    """A byte-level BPE tokenizer whose vocabulary is the 256 byte symbols
    (ids 0..255, the test models' vocabulary), saved as transformers'
    AutoTokenizer loads it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["In the beginning"], trainers.BpeTrainer(
        vocab_size=256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return folder


def text_init(onnx_path, d, sdc, sdrun, build):
    """--prompt-init text: PEFT's TEXT start, the text's token rows repeated
    to fill the virtual tokens; the saved adapter loads in PEFT."""
    import torch
    from peft import PeftModel, PromptTuningConfig, get_peft_model
    import export_hf
    tokenizer = byte_tokenizer(os.path.join(d, "tokenizer"))
    text = "Tell"  # 4 tokens for 5 virtual ones: repeated, then cut
    plan = os.path.join(d, "text.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "prompt", "--num-virtual-tokens", str(VIRTUAL), "--prompt-init", "text",
        "--prompt-init-text", text, "--tokenizer", tokenizer, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    _, values = plan_globals(build, plan, ["prompt_embeddings"])
    pm = get_peft_model(export_hf.build("llama", 0), PromptTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=VIRTUAL, prompt_tuning_init="TEXT", prompt_tuning_init_text=text,
        tokenizer_name_or_path=tokenizer))
    want = pm.prompt_encoder["default"].embedding.weight.detach().numpy()
    got = values.get("prompt_embeddings")
    same = got is not None and got.shape == want.shape and np.array_equal(got, want)
    saved = os.path.join(d, "text_adapter")
    sh([sdrun, "train", plan, "--data", os.path.join(d, "train.jsonl"), "--steps", "1", "--threads", "2",
        "--save-adapter", saved])
    cfg = json.load(open(os.path.join(saved, "adapter_config.json")))
    with torch.no_grad():
        loaded = PeftModel.from_pretrained(export_hf.build("llama", 0).eval(), saved).eval()
    check(f"--prompt-init text: the {VIRTUAL} virtual tokens start as PEFT's TEXT start of '{text}', bit for bit; the "
          f"saved adapter (prompt_tuning_init TEXT) loads in PEFT",
          same and cfg["prompt_tuning_init"] == "TEXT" and cfg["prompt_tuning_init_text"] == text and
          loaded.peft_config["default"].prompt_tuning_init == "TEXT",
          f"equal {same}, config {cfg['prompt_tuning_init']!r} {cfg['prompt_tuning_init_text']!r}")


def bf16_run(method, onnx_path, d, sdc, sdrun, init, f32_losses):
    plan, metrics = os.path.join(d, "bf16.sdp"), os.path.join(d, "bf16.jsonl")
    sh([sdc, "compile", onnx_path, "--peft", method, "--num-virtual-tokens", str(VIRTUAL), "--precision", "bf16",
        "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
    sh([sdrun, "train", plan, "--data", os.path.join(d, "train.jsonl"), "--steps", str(STEPS), "--no-shuffle",
        "--lr", str(LR), "--lr-schedule", "constant", "--threads", "2", "--adapter", init, "--metrics", metrics])
    losses = losses_of(metrics)
    err = max(abs(a - b) / abs(b) for a, b in zip(losses, f32_losses)) if len(losses) == STEPS else float("inf")
    check(f"bf16 {method} tuning trains from PEFT's start, its losses within 2e-2 of f32's", err <= 2e-2,
          f"losses {[round(l, 4) for l in losses[:3]]}, worst relative gap {err:.1e}")


def generation(method, onnx_path, d, trained, sdc, sdrun):
    """sdrun generate behind the trained virtual tokens (the infer entry's
    batch-1 window) against PEFT's greedy generate on the same adapter."""
    from peft import PeftModel
    import export_hf
    from test_kv_cache import generate
    plan = os.path.join(d, "window.sdp")
    sh([sdc, "compile", onnx_path, "--peft", method, "--num-virtual-tokens", str(VIRTUAL), "--shapes",
        f"input_ids={BATCH}x{SEQ}", "--infer-shapes", "input_ids=1x32", "-o", plan])
    loaded = PeftModel.from_pretrained(export_hf.build("llama", 0).eval(), trained).eval()
    prompt = "In the beginning"
    want = continuation(method, loaded, prompt, 12)
    got = generate(sdrun, plan, [prompt], "--adapter", trained, new=12)
    check(f"{method} tuning: sdrun generate through the infer window equals PEFT's greedy "
          f"{'forward' if method == 'prefix' else 'generate'}, token for token",
          got.rstrip(b"\n") == want, f"{got!r} vs {want!r}")


def refusals(onnx_path, d, plan, trained, sdc, sdrun):
    from safetensors.numpy import load_file, save_file
    ids = os.path.join(d, "refuse_ids.npy")
    np.save(ids, np.zeros((BATCH, SEQ), np.int64))
    longer = os.path.join(d, "longer")
    shutil.copytree(trained, longer)
    cfg = json.load(open(os.path.join(longer, "adapter_config.json")))
    cfg["num_virtual_tokens"] = VIRTUAL + 2
    json.dump(cfg, open(os.path.join(longer, "adapter_config.json"), "w"))
    prompt = load_file(os.path.join(trained, "adapter_model.safetensors"))["prompt_embeddings"]
    save_file({"prompt_embeddings": np.concatenate([prompt, prompt[:2]])},
              os.path.join(longer, "adapter_model.safetensors"), metadata={"format": "pt"})
    lora = os.path.join(d, "lora")
    os.makedirs(lora)
    json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
              open(os.path.join(lora, "adapter_config.json"), "w"))
    save_file({}, os.path.join(lora, "adapter_model.safetensors"))
    seq2seq = os.path.join(d, "seq2seq")
    shutil.copytree(trained, seq2seq)
    cfg = json.load(open(os.path.join(seq2seq, "adapter_config.json")))
    cfg["num_transformer_submodules"] = 2
    json.dump(cfg, open(os.path.join(seq2seq, "adapter_config.json"), "w"))
    for what, adapter, words in (("another num_virtual_tokens", longer, ["num_virtual_tokens=7", "5"]),
                                 ("a LoRA adapter", lora, ["LoRA", "prompt tuning", "--peft prompt"]),
                                 ("an encoder-decoder's prompts", seq2seq, ["num_transformer_submodules"])):
        out = os.path.join(d, "refused_out")
        problems, line = clean_error_problems([sdrun, "infer", plan, "--adapter", adapter, "--input",
                                               f"input_ids={ids}", "--output-dir", out], words, [out])
        check(f"prompt plan: {what} is a one-line error naming what differs", not problems,
              "; ".join(problems) or line)
    merged = os.path.join(d, "merged.onnx")
    problems, line = clean_error_problems([sdc, "merge", onnx_path, "--adapter", trained, "-o", merged],
                                          ["prompt tuning", "nothing to merge"], [merged])
    check("sdc merge of a prompt tuning adapter is a one-line error", not problems, "; ".join(problems) or line)


def projection_checks(name, arch, onnx_path, d, sdc, sdrun, build):
    """--prefix-projection (PEFT's prefix_projection): the prefix is a
    two-layer MLP's output. PEFT starts from the plan's MLP (read from the
    plan), both train, and the saved prefix (the MLP's output, as PEFT saves
    it) loads in PEFT and in a plain prefix plan with PEFT's logits."""
    import torch
    from peft import PeftModel, PrefixTuningConfig, get_peft_model
    from safetensors.numpy import load_file
    import export_hf
    hidden = 24
    data = os.path.join(d, "train.jsonl")
    rows = [json.loads(l)["input_ids"] for l in open(data)]
    plan, plain = os.path.join(d, "projection.sdp"), os.path.join(d, "plan.sdp")
    sh([sdc, "compile", onnx_path, "--peft", "prefix", "--num-virtual-tokens", str(VIRTUAL), "--prefix-projection",
        "--encoder-hidden-size", str(hidden), "--seed", "4", "--shapes", f"input_ids={BATCH}x{SEQ}", "--infer-shapes",
        f"input_ids={BATCH}x{SEQ}", "-o", plan])
    names = {"embedding.weight": "prompt_encoder.embedding.weight"}
    for layer in (0, 2):
        for part in ("weight", "bias"):
            names[f"transform.{layer}.{part}"] = f"prompt_encoder.transform.{layer}.{part}"
    _, start = plan_globals(build, plan, list(names.values()))
    pm = get_peft_model(export_hf.build(arch, 0), PrefixTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=VIRTUAL, prefix_projection=True, encoder_hidden_size=hidden))
    encoder = pm.prompt_encoder["default"]
    with torch.no_grad():
        for theirs, ours in names.items():
            encoder.get_parameter(theirs).copy_(torch.tensor(start[ours]))
    want = peft_prompt_steps(pm, rows)
    trained, metrics = os.path.join(d, "projection_trained"), os.path.join(d, "projection.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", str(STEPS), "--no-shuffle", "--lr", str(LR),
        "--lr-schedule", "constant", "--threads", "2", "--metrics", metrics, "--save-adapter", trained])
    losses = losses_of(metrics)
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want)) if len(losses) == STEPS else float("inf")
    pm.eval()
    with torch.no_grad():
        theirs = pm.get_prompt_embedding_to_save("default").numpy()
    ours = load_file(os.path.join(trained, "adapter_model.safetensors"))
    err = rel_err(ours["prompt_embeddings"], theirs) if set(ours) == {"prompt_embeddings"} else float("inf")
    cfg = json.load(open(os.path.join(trained, "adapter_config.json")))
    check(f"{name}, --prefix-projection (MLP width {hidden}): {STEPS} steps from the plan's start give PEFT's losses, "
          f"and the saved prefix is PEFT's MLP output {list(theirs.shape)} (1e-4)",
          loss_err <= 1e-4 and err <= 1e-4 and cfg.get("prefix_projection") is True and
          cfg.get("encoder_hidden_size") == hidden,
          f"losses {losses[:2]} vs PEFT {want[:2]}, worst loss err {loss_err:.1e}, prefix err {err:.1e}, config "
          f"prefix_projection {cfg.get('prefix_projection')} encoder_hidden_size {cfg.get('encoder_hidden_size')}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PeftModel.from_pretrained(export_hf.build(arch, 0).eval(), trained).eval()
    ids = np.random.default_rng(5).integers(0, 256, (BATCH, SEQ)).astype(np.int64)
    with torch.no_grad():
        want_logits = loaded(input_ids=torch.tensor(ids)).logits.numpy()
    err = rel_err(sdrun_logits(sdrun, plain, trained, ids, d, "projected"), want_logits)
    check(f"{name}, --prefix-projection sdc->PEFT: the saved prefix loads in PEFT with no warnings, and a plain "
          "prefix plan's sdrun infer --adapter gives PEFT's logits (1e-4)",
          not peft_warnings(caught) and err <= 1e-4,
          f"relative err {err:.2e}; " + ("; ".join(peft_warnings(caught)) or "no warnings"))
    ids_file, out = os.path.join(d, "projection_ids.npy"), os.path.join(d, "projection_out")
    np.save(ids_file, ids)
    for what, cmd, words, left in (
            ("--adapter on a --prefix-projection plan", [sdrun, "infer", plan, "--adapter", trained, "--input",
                                                         f"input_ids={ids_file}", "--output-dir", out],
             ["--prefix-projection", "MLP"], [out]),
            ("--prefix-projection without --peft prefix", [sdc, "compile", onnx_path, "--peft", "prompt",
                                                           "--prefix-projection", "-o", out + ".sdp"],
             ["--prefix-projection needs --peft prefix"], [out + ".sdp"]),
            ("--encoder-hidden-size without --prefix-projection", [sdc, "compile", onnx_path, "--peft", "prefix",
                                                                   "--encoder-hidden-size", "8", "-o", out + ".sdp"],
             ["--encoder-hidden-size", "needs --prefix-projection"], [out + ".sdp"])):
        problems, line = clean_error_problems(cmd, words, left)
        check(f"refused: {what}", not problems, "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    build = os.path.dirname(os.path.dirname(sdrun))
    import torch
    import export_hf
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    tmp = tempfile.mkdtemp(prefix="sd_prompt_tuning_")
    try:
        for method in ("prompt", "prefix"):
            for arch, with_mask in (("gpt2", False), ("llama", False), ("llama", True)):
                name = f"{method} tuning, {arch}" + (" (attention_mask, position_ids)" if with_mask else "")
                d = os.path.join(tmp, method, arch + ("_mask" if with_mask else ""))
                os.makedirs(d)
                onnx_path = os.path.join(d, "model.onnx")
                if with_mask:
                    export_with_positions(export_hf.build(arch, 0), onnx_path, BATCH, SEQ)
                else:
                    export_hf.export(export_hf.build(arch, 0), onnx_path, opset=17, batch=BATCH, seq=SEQ)
                try:
                    plan, init, trained, losses = model_checks(name, method, arch, onnx_path, d, sdc, sdrun)
                except Exception as e:  # one failing model must not hide the others
                    check(f"{name} runs", False, f"{type(e).__name__}: {str(e)[-400:]}")
                    continue
                if arch == "llama" and not with_mask:
                    generation(method, onnx_path, d, trained, sdc, sdrun)
                    bf16_run(method, onnx_path, d, sdc, sdrun, init, losses)
                    if method == "prefix":
                        projection_checks(name, arch, onnx_path, d, sdc, sdrun, build)
                    if method == "prompt":
                        vocab_init(onnx_path, d, sdc, sdrun, build)
                        text_init(onnx_path, d, sdc, sdrun, build)
                        refusals(onnx_path, d, plan, trained, sdc, sdrun)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_prompt_tuning")


if __name__ == "__main__":
    sys.exit(main())
