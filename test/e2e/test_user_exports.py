#!/usr/bin/env python3
"""What a new user's exports hit, each once broken:

  - torch.onnx.export without dynamic_axes fixes the batch: a training plan's
    default infer bucket (batch 1) must yield to the model's batch, and a
    batch that truly collides names the default and --infer-shapes
  - torch.onnx.export's defaults (dynamo) fold Linear weights into
    transposed copies named val_N: the module names come from the
    exporter's name_scopes metadata, and full fine-tuning restores each
    weight under its name, so the saved weights load into PyTorch strictly
  - torch.onnx.export's defaults on a transformers Llama fold the causal mask
    (repeated per batch item) and the rotary cos/sin tables into weights:
    full fine-tuning still fuses the attention over one shared causal mask,
    trains only the model's parameters (the tables and the mask stay frozen),
    and its logits equal PyTorch's
  - an exporter that merges initializers of equal values (fresh LayerNorm
    weights, zero biases): the TorchScript exporter in eval mode reads the
    duplicates through Identity nodes named after each parameter, and full
    fine-tuning must train each parameter on its own, as an export in
    training mode does; the dynamo exporter's optimizer leaves one weight
    read by every layer, and sdc warns when such a weight trains
  - a nanoGPT-style export names its token input `idx`: sdc finds the token
    input (the int64 [batch, seq] input indexing the embedding), records it in
    the plan, and sdrun train feeds it; when two inputs qualify, the error
    names --token-input, and the flag resolves it
  - torch.onnx.export's defaults on GPT-2, GPT-NeoX, Gemma 3 and StarCoder
    write attention each its own way (keys transposed with the heads merged,
    q|k|v split per head, norms on head-major q and k, one key/value head):
    attention reads the projections' layout in every entry, logits equal
    PyTorch's; Falcon's k and v picks (GatherND) stand between LoRA and the loss
  - a transformers model exported with its own loss takes input_ids and
    labels, named like a token plan's inputs: a folder of arrays feeds them
    by name; its embeddings' padding rows (nn.Embedding's padding_idx, in the
    dynamo exporter's FX sources) get no gradient, as in PyTorch
  - a tied LM head (tie_word_embeddings) exports under one name, while the
    model's state_dict has two: the trained weights are saved under both;
    GPT-2's Conv1D biases, all zero in a fresh model, are removed by the
    exporter's optimizer from its addmm, and restored to train
  - the same optimizer merges Phi's zero LM-head bias with an MLP's behind an
    aten.alias it removed (untied again), folds GPT-J's sinusoidal buffer
    into a gather (frozen, not trained), folds Falcon's `x @ weight.T` into
    transposed copies (restored), and merges GPT-NeoX's and Falcon's two
    fresh norms of one input into one node (computed again for the second
    norm, whose parameters the FX sources tell)
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from e2e_util import ROOT, clean_error_problems, sh, tool_paths
from test_training import check, report

sys.path.insert(0, os.path.join(ROOT, "examples"))
SEQ = 16


def data_file(path, vocab, lines=8):
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(json.dumps({"input_ids": rng.integers(0, vocab, SEQ).tolist()}) + "\n")


def two_token_inputs(path):
    """Token ids and segment ids, both int64 [batch, seq] indexing embeddings."""
    rng = np.random.default_rng(1)
    tok = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "tok_emb")
    seg = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "seg_emb")
    head = numpy_helper.from_array(rng.standard_normal((8, 32)).astype(np.float32), "head.weight")
    nodes = [helper.make_node("Gather", ["tok_emb", "ids"], ["t"]), helper.make_node("Gather", ["seg_emb", "segs"], ["s"]),
             helper.make_node("Add", ["t", "s"], ["h"]), helper.make_node("MatMul", ["h", "head.weight"], ["logits"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("ids", "segs")]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 32])
    model = helper.make_model(helper.make_graph(nodes, "g", ins, [out], [tok, seg, head]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


def main():
    sdc, sdrun = tool_paths()
    import export_hf
    tmp = tempfile.mkdtemp(prefix="sd_user_")
    try:
        # A fixed batch of 4 and a token input called idx, as nanoGPT exports.
        model = export_hf.build("gpt2", seed=0)
        onnx_path = os.path.join(tmp, "fixed.onnx")
        export_hf.export(model, onnx_path, opset=17, batch=4, seq=SEQ, token_input="idx", fixed_batch=True)
        dims = [d.dim_value for d in onnx.load(onnx_path).graph.input[0].type.tensor_type.shape.dim]
        check("the export fixes the batch", dims == [4, SEQ], f"idx dims {dims}")
        plan = os.path.join(tmp, "fixed.sdp")
        sh([sdc, "compile", onnx_path, "--recipe", "sft", "--shapes", f"idx=4x{SEQ}", "--peft", "lora",
            "--target-modules", "c_attn", "-o", plan])
        inspect = sh([sdrun, "inspect", plan]).splitlines()
        at = next(i for i, l in enumerate(inspect) if l.strip().startswith("infer"))
        check("fixed batch: compiles for training; infer takes the model's batch 4",
              inspect[at + 1].split() == ["input", "idx:", f"i64[4x{SEQ}]"], inspect[at + 1].strip())
        inspect = "\n".join(inspect)
        check("the plan records the token input", '"token_input":"idx"' in inspect, "")
        data = os.path.join(tmp, "train.jsonl")
        data_file(data, model.config.vocab_size)
        metrics = os.path.join(tmp, "m.jsonl")
        sh([sdrun, "train", plan, "--data", data, "--steps", "2", "--metrics", metrics])
        losses = [json.loads(l)["loss"] for l in open(metrics)]
        check("sdrun train feeds the data's tokens to idx", len(losses) == 2 and all(np.isfinite(losses)), f"{losses}")

        # A batch that truly collides: the error names the default and the flag.
        out = os.path.join(tmp, "collide.sdp")
        problems, line = clean_error_problems(
            [sdc, "compile", onnx_path, "--shapes", f"idx=4x{SEQ}", "--peft", "none", "--infer-shapes",
             f"idx=2x{SEQ}", "-o", out], ["--infer-shapes idx", "fixes it at 4"], [out])
        check("an explicit --infer-shapes that contradicts the model is a clean error", not problems,
              "; ".join(problems) or line)

        # Two int64 [batch, seq] inputs both index embeddings: ambiguous.
        two = os.path.join(tmp, "two.onnx")
        two_token_inputs(two)
        out = os.path.join(tmp, "two.sdp")
        problems, line = clean_error_problems([sdc, "compile", two, "--shapes", f"ids=2x{SEQ}", "--shapes",
                                               f"segs=2x{SEQ}", "--peft", "none", "-o", out],
                                              ["'ids'", "'segs'", "--token-input"], [out])
        check("two candidate token inputs: the error names both and --token-input", not problems,
              "; ".join(problems) or line)
        sh([sdc, "compile", two, "--shapes", f"ids=2x{SEQ}", "--shapes", f"segs=2x{SEQ}", "--peft", "none",
            "--token-input", "ids", "-o", out])
        check("--token-input resolves it", '"token_input":"ids"' in sh([sdrun, "inspect", out]), "")
        small = os.path.join(tmp, "small_vocab.jsonl")
        data_file(small, 32)
        problems, line = clean_error_problems([sdrun, "train", out, "--data", small, "--steps", "1"],
                                              ["'segs'", "--token-input"])
        check("sdrun train on a plan needing an input it cannot feed: the error names it and the flag",
              not problems, "; ".join(problems) or line)
        problems, line = clean_error_problems([sdc, "compile", two, "--shapes", f"ids=2x{SEQ}", "--shapes",
                                               f"segs=2x{SEQ}", "--peft", "none", "--token-input", "nope", "-o", out],
                                              ["--token-input 'nope'"])
        check("--token-input naming no input is a clean error", not problems, "; ".join(problems) or line)
        dynamo_default_export(sdc, sdrun, tmp)
        dynamo_default_llama_full(sdc, sdrun, tmp)
        dynamo_default_decoders(sdc, sdrun, tmp)
        model_with_its_loss(sdc, sdrun, tmp)
        tied_lm_heads(sdc, sdrun, tmp)
        more_decoders_with_their_loss(sdc, sdrun, tmp)
        merged_equal_weights(sdc, sdrun, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_user_exports")


def dynamo_default_export(sdc, sdrun, tmp):
    """torch.onnx.export with nothing but its defaults (torch 2.x: the dynamo
    exporter, a fixed batch, the input named after forward's argument) renames
    Linear weights val_N and keeps the module path only in node metadata: PEFT's
    module names must still select the layers, and LoRA must train and merge."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc, self.head = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 64)

        def forward(self, idx):
            return self.head(torch.relu(self.fc(self.emb(idx))))
    torch.manual_seed(0)
    path = os.path.join(tmp, "tiny.onnx")
    torch.onnx.export(Tiny(), (torch.zeros((4, SEQ), dtype=torch.long),), path)
    listed = sh([sdc, "compile", path, "--peft", "lora", "--target-modules", ".*", "--shapes", f"idx=4x{SEQ}",
                 "--dry-run"])
    modules = [l.strip() for l in listed.splitlines()[1:] if l.startswith("  ")]
    check("dynamo default export: modules carry PyTorch's names", modules == ["fc", "head"], f"{modules}")
    plan, data, adapter, merged = (os.path.join(tmp, f) for f in ("tiny.sdp", "tiny.jsonl", "tiny_adapter",
                                                                   "tiny_merged.onnx"))
    sh([sdc, "compile", path, "--peft", "lora", "--target-modules", "fc", "--shapes", f"idx=4x{SEQ}", "-o", plan])
    data_file(data, 64)
    sh([sdrun, "train", plan, "--data", data, "--steps", "3", "--lr", "1e-2", "--save-adapter", adapter])
    sh([sdc, "merge", path, "--adapter", adapter, "-o", merged])
    before = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(merged).graph.initializer}
    changed = sorted(n for n in before if not np.array_equal(before[n], after[n]))
    check("dynamo default export: sdc merge folds the adapter into fc's weight only",
          len(changed) == 1 and before[changed[0]].shape == (16, 16), f"changed {changed}")


def merged_equal_weights(sdc, sdrun, tmp):
    """Fresh LayerNorms (all-ones weights, zero biases) and zero Linear biases
    in two blocks: every parameter equals its twin in the other block."""
    import subprocess
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)
            torch.nn.init.zeros_(self.fc.bias)

        def forward(self, x):
            return x + torch.relu(self.fc(self.ln(x)))

    class TwoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64)
            self.blocks = torch.nn.ModuleList([Block(), Block()])

        def forward(self, idx):
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x)
            return self.head(x)
    torch.manual_seed(0)
    model = TwoBlocks().eval()
    ids = (torch.zeros((4, SEQ), dtype=torch.long),)
    params = sorted(n for n, _ in model.named_parameters())
    shapes = ["--shapes", f"idx=4x{SEQ}"]
    data = os.path.join(tmp, "blocks.jsonl")
    data_file(data, 64)
    trained, listing = {}, {}
    numel = sum(p.numel() for p in model.parameters())
    for mode in ("EVAL", "TRAINING"):
        path, plan = os.path.join(tmp, f"blocks_{mode}.onnx"), os.path.join(tmp, f"blocks_{mode}.sdp")
        torch.onnx.export(model, ids, path, dynamo=False, training=getattr(torch.onnx.TrainingMode, mode),
                          input_names=["idx"])
        graph = onnx.load(path).graph
        merged = sum(n.op_type == "Identity" and n.input[0] in {t.name for t in graph.initializer} for n in graph.node)
        listed = sh([sdc, "compile", path, "--peft", "none", *shapes, "--dry-run"])
        listing[mode] = sorted(l.strip() for l in listed.splitlines()[1:] if l.startswith("  "))
        count = int(listed.split("trainable parameters: ")[1].split()[0])
        check(f"TorchScript export in {mode.lower()} mode ({merged} parameters read through Identity): full "
              "fine-tuning trains as many numbers as the model has", count == numel, f"{count} of {numel}")
        sh([sdc, "compile", path, "--peft", "none", *shapes, "-o", plan])
        metrics = os.path.join(tmp, f"blocks_{mode}.jsonl")
        sh([sdrun, "train", plan, "--data", data, "--steps", "4", "--lr", "1e-2", "--no-shuffle", "--metrics", metrics])
        trained[mode] = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    check("both exports train the same weights, each LayerNorm and bias its own",
          listing["EVAL"] == listing["TRAINING"] and "blocks.1.ln.weight" in listing["EVAL"], f"{listing}")
    check("an eval-mode export trains as the training-mode export does (same losses, 4 steps)",
          len(trained["EVAL"]) == 4 and trained["EVAL"] == trained["TRAINING"], f"{trained}")

    path = os.path.join(tmp, "blocks_dynamo.onnx")
    torch.onnx.export(model, ids, path)
    graph = onnx.load(path).graph
    kept = {t.name for t in graph.initializer}
    r = subprocess.run([sdc, "compile", path, "--peft", "none", *shapes, "--dry-run"], capture_output=True, text=True)
    names = sorted(l.strip() for l in r.stdout.splitlines()[1:] if l.startswith("  "))
    check("dynamo default export (its optimizer keeps one weight for both LayerNorms and drops nothing else): full "
          "fine-tuning gives each LayerNorm its own weight again (read from the nodes' FX sources), no warning",
          r.returncode == 0 and "blocks.0.ln.weight" in kept and "blocks.1.ln.weight" not in kept and
          "blocks.1.ln.weight" in names and "warning" not in r.stderr,
          f"rc {r.returncode}, {names}, stderr {r.stderr.strip()[-300:]!r}")
    r = subprocess.run([sdc, "compile", path, "--peft", "lora", "--target-modules", "fc", *shapes, "--dry-run"],
                       capture_output=True, text=True)
    check("the same export with LoRA (the shared weights stay frozen): no warning",
          r.returncode == 0 and "warning" not in r.stderr, r.stderr.strip()[-300:])
    torch.onnx.export(model, ids, path, optimize=False)
    r = subprocess.run([sdc, "compile", path, "--peft", "none", *shapes, "--dry-run"], capture_output=True, text=True)
    names = sorted(l.strip() for l in r.stdout.splitlines()[1:] if l.startswith("  "))
    check("exported with optimize=False: every parameter trains, no warning",
          r.returncode == 0 and names == params and "warning" not in r.stderr, f"{names} {r.stderr.strip()[-300:]}")


def dynamo_default_llama_full(sdc, sdrun, tmp):
    """Full fine-tuning (--peft none) of a Llama exported with torch.onnx.export's defaults."""
    import torch
    import transformers
    from e2e_util import plan_steps, rel_err, sdrun_logits
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                                      use_cache=False, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    ids = np.random.default_rng(3).integers(0, 64, (2, SEQ)).astype(np.int64)
    path, plan, data = (os.path.join(tmp, f) for f in ("llama_dyn.onnx", "llama_full.sdp", "llama.jsonl"))
    torch.onnx.export(model, (torch.tensor(ids),), path)
    shapes = ["--shapes", f"input_ids=2x{SEQ}"]
    listed = sh([sdc, "compile", path, "--peft", "none", *shapes, "--dry-run"])
    # The exporter merges initializers of equal values (the all-ones RMSNorm
    # weights become one); the nodes' FX sources give each its own again.
    # The Linear weights the MatMuls read as transposed copies (val_N) are
    # restored under their names, so the weights save as PyTorch's.
    want = sum(p.numel() for p in model.parameters())
    trainable = int(listed.split("trainable parameters: ")[1].split()[0])
    names = sorted(l.split()[0] for l in listed.splitlines()[1:] if l.startswith("  "))
    want_names = sorted(k for k, _ in model.named_parameters())
    check("dynamo default Llama, full fine-tuning: exactly the model's parameters train, under their own names "
          "(each RMSNorm weight its own again, each Linear weight restored from its transposed copy; not the rotary "
          "tables or causal mask)", trainable == want and names == want_names,
          f"{trainable} trainable, the model has {want}; names other than the model's: "
          f"{sorted(set(names) ^ set(want_names))}")
    sh([sdc, "compile", path, "--peft", "none", *shapes, "-o", plan])
    steps = plan_steps(sdrun, plan)
    layers = config.num_hidden_layers
    check("dynamo default Llama, full fine-tuning: attention and rotary fused in every entry, the backward too",
          not steps.get("Softmax") and steps.get("AttentionGrad", 0) >= layers and steps.get("Rotary", 0) >= 2 * layers,
          f"{steps.get('Attention')} Attention, {steps.get('AttentionGrad')} AttentionGrad, "
          f"{steps.get('Rotary')} Rotary steps")
    # This exporter transposes the repeated keys with the heads merged into
    # the batch; attention still reads q, k and v where the projections wrote them.
    check("dynamo default Llama: no Transpose or Expand step (attention reads the projections' layout and shares "
          "the key/value heads)", not steps.get("Transpose") and not steps.get("Expand"),
          f"{steps.get('Transpose')} Transpose, {steps.get('Expand')} Expand steps")
    got = sdrun_logits(sdrun, plan, None, ids, tmp, "llama_full")
    with torch.no_grad():
        want_logits = model(torch.tensor(ids)).logits.numpy()
    check("dynamo default Llama, full fine-tuning plan: logits equal PyTorch's (1e-4)",
          rel_err(got, want_logits) <= 1e-4, f"relative err {rel_err(got, want_logits):.1e}")
    data_file(data, 64, lines=2)
    metrics = os.path.join(tmp, "llama_metrics.jsonl")
    weights, merged = os.path.join(tmp, "llama_full.safetensors"), os.path.join(tmp, "llama_merged.onnx")
    sh([sdrun, "train", plan, "--data", data, "--steps", "6", "--lr", "1e-2", "--no-shuffle", "--metrics", metrics,
        "--save-weights", weights])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    check("dynamo default Llama, full fine-tuning: 6 steps on one batch bring its loss down every step",
          len(losses) == 6 and all(b < a for a, b in zip(losses, losses[1:])), f"losses {losses}")
    # What a user does next: load the trained weights into the PyTorch model
    # (strictly: every name PyTorch's, in PyTorch's layout), or merge them
    # into the exported file; both then compute the same logits.
    from safetensors.torch import load_file
    from e2e_util import ort_run
    model.load_state_dict(load_file(weights), strict=True)
    sh([sdc, "merge", path, "--weights", weights, "-o", merged])
    with torch.no_grad():
        trained = model(torch.tensor(ids)).logits.numpy()
    theirs = next(iter(ort_run(merged, {"input_ids": ids}).values()))
    check("dynamo default Llama, full fine-tuning: the saved weights load strictly into the PyTorch model, whose "
          "logits equal ONNX Runtime's on the file they were merged into (1e-4), and moved from the start",
          rel_err(theirs, trained) <= 1e-4 and rel_err(trained, want_logits) > 1e-2,
          f"relative err {rel_err(theirs, trained):.1e}; moved by {rel_err(trained, want_logits):.1e}")

def with_loss(model):
    """A transformers model's forward(input_ids, labels) -> loss, as a user exports it to train with its own loss."""
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, labels):
            return self.m(input_ids=input_ids, labels=labels).loss
    return WithLoss()


def train_with_its_loss(sdc, sdrun, tmp, name, model, data, steps, lr, batch=2, optimize=True, compile_args=()):
    """Exports `model` (a with_loss) with torch.onnx.export's defaults, trains
    it in full from a folder of `data`'s arrays with sdrun, and the same
    batches in PyTorch (AdamW): (sdrun's losses, PyTorch's, the saved
    weights, PyTorch's state_dict after, the compile's warnings, the export,
    the saved weights' path)."""
    import subprocess
    import torch
    from safetensors.numpy import load_file
    path, plan = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}.sdp")
    torch.onnx.export(model, tuple(torch.tensor(v[:batch]) for v in data.values()), path, input_names=list(data),
                      output_names=["loss"], optimize=optimize)
    compiled = subprocess.run([sdc, "compile", path, "--peft", "none", "--loss-output", "loss", *compile_args, "-o",
                               plan], capture_output=True, text=True)
    if compiled.returncode:
        raise RuntimeError(f"sdc compile {name} failed: {compiled.stderr.strip()[-800:]}")
    folder = os.path.join(tmp, f"{name}_data")
    os.makedirs(folder, exist_ok=True)
    for key, value in data.items():
        np.save(os.path.join(folder, f"{key}.npy"), value)
    metrics, weights = os.path.join(tmp, f"{name}.jsonl"), os.path.join(tmp, f"{name}.safetensors")
    sh([sdrun, "train", plan, "--data", folder, "--steps", str(steps), "--lr", str(lr), "--no-shuffle", "--threads",
        "2", "--metrics", metrics, "--save-weights", weights])
    ours = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0)
    want = []
    for step in range(steps):
        loss = model(*(torch.tensor(v[step * batch:(step + 1) * batch]) for v in data.values()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return ours, want, load_file(weights), state, compiled.stderr, path, weights


def max_loss_rel(ours, want):
    return max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == len(want) else float("inf")


def model_with_its_loss(sdc, sdrun, tmp):
    """A transformers classifier exported with its own loss (forward's
    input_ids and labels, torch.onnx.export's defaults) and trained in full
    from a folder of arrays: its inputs are named like a token plan's, and its
    word and position embeddings have a padding row (RoBERTa's padding_idx
    1), which PyTorch never trains."""
    import torch
    import transformers
    batch, steps = 2, 4
    config = transformers.RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=SEQ + 2, num_labels=3,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rng = np.random.default_rng(6)
    data = {"input_ids": rng.integers(0, 64, (batch * steps, SEQ)).astype(np.int64),
            "labels": rng.integers(0, 3, (batch * steps,)).astype(np.int64)}
    data["input_ids"][:, -3:] = config.pad_token_id  # padded rows, as a tokenizer pads them
    torch.manual_seed(0)
    model = with_loss(transformers.RobertaForSequenceClassification(config))
    ours, want, got, _, _, _, _ = train_with_its_loss(sdc, sdrun, tmp, "roberta_loss", model, data, steps, 1e-3, batch)
    rel = max_loss_rel(ours, want)
    params = {k: p.detach().numpy() for k, p in model.named_parameters()}
    worst = max((float(np.max(np.abs(got[k] - v))) for k, v in params.items() if k in got), default=float("inf"))
    check("a transformers classifier exported with its loss (inputs input_ids and labels), trained in full from a "
          "folder of arrays: losses and every weight equal PyTorch's, the embeddings' padding rows untrained (1e-5)",
          rel < 1e-5 and worst < 1e-5 and set(got) == set(params),
          f"max rel loss diff {rel:.1e}, max weight diff {worst:.1e}, names other than the model's: "
          f"{sorted(set(got) ^ set(params))}")


def tied_lm_heads(sdc, sdrun, tmp):
    """Decoders whose LM head is the input embedding (tie_word_embeddings,
    GPT-2's and many small LLMs' default), exported with their loss by
    torch.onnx.export's defaults: torch.export keeps one of the two names, but
    the model's state_dict has both, so the trained weights are saved under
    each; `sdc merge` takes them, or Hugging Face's one name. GPT-2's Conv1D
    computes addmm(bias, x, weight), whose all-zero biases the exporter's
    optimizer removes: they are restored and train."""
    import torch
    import transformers
    from safetensors.numpy import save_file
    from e2e_util import ort_run
    batch, steps = 2, 4
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 64, (batch * steps, SEQ)).astype(np.int64)
    data = {"input_ids": ids, "labels": ids}
    torch.manual_seed(0)
    llama = with_loss(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=SEQ, use_cache=False, attn_implementation="eager",
        tie_word_embeddings=True)))
    ours, want, got, state, _, path, weights = train_with_its_loss(sdc, sdrun, tmp, "tied_llama", llama, data, steps,
                                                                     1e-3, batch)
    worst = max((float(np.max(np.abs(got[k] - v))) for k, v in state.items() if k in got), default=float("inf"))
    head, embedding = "m.lm_head.weight", "m.model.embed_tokens.weight"
    check("a Llama with a tied LM head, trained in full with its loss: losses and weights equal PyTorch's (1e-5), "
          "saved under every name of its state_dict, the head's and the embedding's alike",
          max_loss_rel(ours, want) < 1e-5 and worst < 1e-5 and set(got) == set(state) and
          np.array_equal(got[head], got[embedding]),
          f"max rel loss diff {max_loss_rel(ours, want):.1e}, max weight diff {worst:.1e}, names other than the "
          f"model's: {sorted(set(got) ^ set(state))}")
    # What a user does next: merge into the export and run it elsewhere; a
    # file saved by Hugging Face's save_pretrained holds one of the names.
    with torch.no_grad():
        trained = llama(torch.tensor(ids[:batch]), torch.tensor(ids[:batch])).item()
    merged, one = os.path.join(tmp, "tied_merged.onnx"), os.path.join(tmp, "tied_one.safetensors")
    theirs = []
    save_file({k: v for k, v in got.items() if k != head}, one)
    for file in (weights, one):
        sh([sdc, "merge", path, "--weights", file, "-o", merged])
        theirs.append(float(ort_run(merged, {"input_ids": ids[:batch], "labels": ids[:batch]})["loss"]))
    check("the tied Llama's saved weights, and the same with the embedding's name only, merge into the export; "
          "ONNX Runtime's loss then equals trained PyTorch's (1e-5)",
          all(abs(t - trained) <= 1e-5 * abs(trained) for t in theirs), f"{theirs} against {trained}")
    differing = os.path.join(tmp, "tied_differing.safetensors")
    save_file({**got, embedding: got[embedding] + 1}, differing)
    problems, line = clean_error_problems([sdc, "merge", path, "--weights", differing, "-o", merged + ".bad"],
                                          [f"'{embedding}'", f"'{head}'", "tied"], [merged + ".bad"])
    check("merging a tied parameter's two names with different values is refused in one line naming both",
          not problems, "; ".join(problems) or line)

    torch.manual_seed(0)
    gpt2 = with_loss(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=SEQ, use_cache=False, resid_pdrop=0,
        embd_pdrop=0, attn_pdrop=0, attn_implementation="eager", bos_token_id=0, eos_token_id=0)))
    ours, want, got, state, warned, _, _ = train_with_its_loss(sdc, sdrun, tmp, "tied_gpt2", gpt2, data, steps,
                                                                 1e-3, batch)
    biases = [k for k in state if k.endswith(("c_attn.bias", "c_proj.bias", "c_fc.bias"))]
    # A key bias gets no gradient in exact arithmetic (softmax ignores a
    # shift), so AdamW moves it by rounding noise: held to lr / 10.
    worst = max((float(np.max(np.abs(got[k] - state[k]))) for k in biases if k in got), default=float("inf"))
    moved = min((float(np.max(np.abs(got[k]))) for k in biases if k in got), default=0.0)
    # The position rows torch.export gathered by a constant arange train as
    # the copy the exporter folded them into, with a warning.
    check("GPT-2 (tied head, Conv1D's addmm) trained with its loss: losses equal PyTorch's (1e-5); every zero bias "
          "the exporter removed is restored, trains and moves as PyTorch's; the tied names are both saved; the "
          "folded position rows are warned about",
          max_loss_rel(ours, want) < 1e-5 and len(biases) == 8 and worst < 1e-4 and moved > 1e-4 and
          np.array_equal(got["m.lm_head.weight"], got["m.transformer.wte.weight"]) and "transformer.wpe.weight" in warned,
          f"max rel loss diff {max_loss_rel(ours, want):.1e}, {len(biases)} biases, max bias diff {worst:.1e}, "
          f"least moved {moved:.1e}; warnings: {warned.strip()[-300:]}")


def more_decoders_with_their_loss(sdc, sdrun, tmp):
    """Fresh Phi, GPT-J, Falcon and GPT-NeoX decoders exported with their
    loss by torch.onnx.export's defaults, and a BERT masked LM without its
    optimizer, trained in full. Phi's zero LM-head bias is merged with an
    MLP's and read through an aten.alias the optimizer removed; GPT-J's
    sinusoidal table is a buffer the optimizer folds into a gather; Falcon's
    linear layers fold into transposed copies; Falcon's (new architecture)
    and GPT-NeoX's two norms of one input, equal when fresh, become one node
    (common-subexpression elimination), computed again for the second."""
    import torch
    import transformers
    from e2e_util import ort_run
    batch, steps, lr = 2, 4, 1e-3
    ids = np.random.default_rng(8).integers(0, 64, (batch * steps, SEQ)).astype(np.int64)
    data = {"input_ids": ids, "labels": ids}
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    falcon = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, hidden_dropout=0,
                  attention_dropout=0)
    models = {
        "Phi": lambda: transformers.PhiForCausalLM(transformers.PhiConfig(
            **small, max_position_embeddings=SEQ, tie_word_embeddings=True, resid_pdrop=0, embd_pdrop=0,
            attention_dropout=0)),
        "GPT-J": lambda: transformers.GPTJForCausalLM(transformers.GPTJConfig(
            vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=SEQ, rotary_dim=4, resid_pdrop=0,
            embd_pdrop=0, attn_pdrop=0)),
        # Falcon's linear layers compute x @ self.weight.T (aten.permute,
        # folded into a copy named after it): each weight is restored.
        "Falcon": lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
            **falcon, new_decoder_architecture=False)),
        "Falcon (new architecture: ln_attn and ln_mlp of one input)": lambda: transformers.FalconForCausalLM(
            transformers.FalconConfig(**falcon, new_decoder_architecture=True, num_kv_heads=2)),
        "GPT-NeoX (parallel residual: two norms of one input)": lambda: transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(**small, max_position_embeddings=SEQ, hidden_dropout=0, attention_dropout=0)),
        # BERT's MLM head ties its decoder's weight to the word embeddings and
        # its decoder's bias to its own `bias`; exported without the
        # optimizer, as the warnings advise, every parameter is itself.
        "BERT masked LM, exported with optimize=False,": lambda: transformers.BertForMaskedLM(
            transformers.BertConfig(**small, max_position_embeddings=SEQ, hidden_dropout_prob=0,
                                    attention_probs_dropout_prob=0)),
    }
    for name, build in models.items():
        torch.manual_seed(0)
        model = with_loss(build())
        tag = name.split()[0].lower().replace("-", "") + str(len(name))
        ours, want, got, state, warned, path, weights = train_with_its_loss(
            sdc, sdrun, tmp, tag, model, data, steps, lr, batch, optimize="BERT" not in name)
        # Key biases get no gradient in exact arithmetic: AdamW moves them by
        # rounding noise (GPT-NeoX's are in its fused q|k|v bias).
        worst = max((float(np.max(np.abs(got[k] - v))) for k, v in state.items()
                     if k in got and not k.endswith(("k_proj.bias", "query_key_value.bias"))), default=float("inf"))
        check(f"{name} trained in full with its loss: losses and weights equal PyTorch's (1e-5), saved under exactly "
              "the names of its state_dict, no warning",
              max_loss_rel(ours, want) < 1e-5 and worst < 1e-5 and set(got) == set(state) and not warned.strip(),
              f"max rel loss diff {max_loss_rel(ours, want):.1e}, max weight diff {worst:.1e}, names other than the "
              f"model's: {sorted(set(got) ^ set(state))}; warnings: {warned.strip()[-300:]}")
        if name.startswith("GPT-NeoX"):
            # The merge repairs the file as the import did: the second norm
            # is a node of its own again, holding its trained weights.
            merged = os.path.join(tmp, "neox_merged.onnx")
            sh([sdc, "merge", path, "--weights", weights, "-o", merged])
            with torch.no_grad():
                trained = model(torch.tensor(ids[:batch]), torch.tensor(ids[:batch])).item()
            theirs = float(ort_run(merged, {"input_ids": ids[:batch], "labels": ids[:batch]})["loss"])
            check("GPT-NeoX's trained weights merged into the export: ONNX Runtime's loss equals trained PyTorch's "
                  "(1e-5)", abs(theirs - trained) <= 1e-5 * abs(trained), f"{theirs} against {trained}")
    # Marian's sinusoidal positions are parameters PyTorch keeps with
    # requires_grad=False, which no export records: --freeze keeps them
    # (exported with optimize=False, which keeps them under their names).
    torch.manual_seed(0)
    marian = with_loss(transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=SEQ, dropout=0,
        attention_dropout=0, activation_dropout=0, pad_token_id=0, decoder_start_token_id=0)))
    ours, want, got, state, _, _, _ = train_with_its_loss(sdc, sdrun, tmp, "marian", marian, data, steps, lr, batch,
                                                          optimize=False, compile_args=("--freeze", ".*embed_positions.*"))
    worst = max((float(np.max(np.abs(got[k] - v))) for k, v in state.items() if k in got), default=float("inf"))
    check("Marian, exported with optimize=False, trained in full with --freeze '.*embed_positions.*' (PyTorch's "
          "requires_grad=False): losses and weights equal PyTorch's (1e-5), the positions neither trained nor saved",
          max_loss_rel(ours, want) < 1e-5 and worst < 1e-5 and not any("embed_positions" in k for k in got),
          f"max rel loss diff {max_loss_rel(ours, want):.1e}, max weight diff {worst:.1e}, saved positions: "
          f"{[k for k in got if 'embed_positions' in k]}")


def dynamo_lora_plan(sdc, sdrun, tmp, name, model, ids, what):
    """Exports `model` with torch.onnx.export's defaults, compiles LoRA on all
    linear layers and checks that its attention reads the projections' layout
    (no Transpose step in any entry; `what` says what made that hard) and that
    its logits equal PyTorch's. Returns the plan."""
    import torch
    from e2e_util import plan_steps, rel_err, sdrun_logits
    tag = name.lower().replace(" ", "").replace("-", "")
    path, plan = os.path.join(tmp, f"{tag}_dyn.onnx"), os.path.join(tmp, f"{tag}_lora.sdp")
    torch.onnx.export(model, (torch.tensor(ids),), path)
    sh([sdc, "compile", path, "--peft", "lora", "--target-modules", "all-linear", "--shapes", f"input_ids=2x{SEQ}",
        "-o", plan])
    steps = plan_steps(sdrun, plan)
    layers = model.config.num_hidden_layers
    grads = steps.get("AttentionGrad", 0) + steps.get("QkvAttentionGrad", 0)  # QkvAttention: a fused q|k|v read as it is
    check(f"dynamo default {name}, LoRA: no Transpose or Softmax step in any entry ({what})",
          not steps.get("Transpose") and not steps.get("Softmax") and grads >= layers,
          f"{steps.get('Transpose')} Transpose, {steps.get('Softmax')} Softmax, {steps.get('AttentionGrad')} "
          f"AttentionGrad, {steps.get('QkvAttentionGrad')} QkvAttentionGrad steps")
    got = sdrun_logits(sdrun, plan, None, ids, tmp, tag)
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits.numpy()
    check(f"dynamo default {name}, LoRA plan: logits equal PyTorch's (1e-4)", rel_err(got, want) <= 1e-4,
          f"relative err {rel_err(got, want):.1e}")
    return plan


def trains_down(sdrun, name, plan, data, tmp):
    """6 steps on the one batch of `data` lower the loss every step."""
    metrics = os.path.join(tmp, f"{name}_metrics.jsonl")
    sh([sdrun, "train", plan, "--data", data, "--steps", "6", "--lr", "1e-2", "--no-shuffle", "--batch", "2",
        "--metrics", metrics])
    losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
    check(f"dynamo default {name}, LoRA: 6 steps on one batch bring its loss down every step",
          len(losses) == 6 and all(b < a for a, b in zip(losses, losses[1:])), f"losses {losses}")


def dynamo_default_decoders(sdc, sdrun, tmp):
    """Transformers decoders exported with torch.onnx.export's defaults, each
    writing attention its own way: attention must still read q, k and v where
    the projections wrote them."""
    import torch
    import transformers
    torch.manual_seed(0)
    ids = np.random.default_rng(4).integers(0, 64, (2, SEQ)).astype(np.int64)
    data = os.path.join(tmp, "decoders.jsonl")
    data_file(data, 64, lines=2)
    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, use_cache=False)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                                n_positions=SEQ, use_cache=False)).eval()
    plan = dynamo_lora_plan(sdc, sdrun, tmp, "GPT-2", gpt2, ids,
                            "keys transposed with the heads merged into the batch: Reshape, 3-D Transpose, Reshape")
    trains_down(sdrun, "GPT-2", plan, data, tmp)
    neox = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        intermediate_size=64, max_position_embeddings=SEQ, rotary_pct=0.25, **small)).eval()
    dynamo_lora_plan(sdc, sdrun, tmp, "GPT-NeoX", neox, ids,
                     "q|k|v packed per head and split head-major, rotary on a quarter of each head")
    gemma = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        intermediate_size=64, num_key_value_heads=2, head_dim=8, max_position_embeddings=SEQ,
        sliding_window=SEQ // 2, **small)).eval()
    dynamo_lora_plan(sdc, sdrun, tmp, "Gemma 3", gemma, ids,
                     "RMSNorm on each head of the head-major q and k, a sliding window shorter than the sequence")
    bigcode = transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=SEQ, multi_query=True, use_cache=False)).eval()
    starcoder = dynamo_lora_plan(sdc, sdrun, tmp, "StarCoder", bigcode, ids, "multi-query attention: one key/value head")
    # Its c_attn is one [q | k | v] projection (4 query heads, one key/value head): attention reads it as it is.
    from e2e_util import plan_steps
    for name, plan_file in (("GPT-2", plan), ("StarCoder", starcoder)):
        steps = plan_steps(sdrun, plan_file)
        check(f"dynamo default {name}, LoRA: attention reads the fused q|k|v projection as it is (sd-qkv-attention)",
              steps.get("QkvAttention", 0) > 0 and steps.get("QkvAttentionGrad", 0) > 0 and not steps.get("Split")
              and not steps.get("Concat"), f"{steps.get('QkvAttention')} QkvAttention, {steps.get('Split')} Split, "
              f"{steps.get('Concat')} Concat steps")
    # Falcon's exporter picks k and v out of the fused projection with GatherND
    # ([-2] and [-1] on the leading axis), which LoRA's backward passes through
    # (it did not compile before); its attention keeps its transposes.
    from e2e_util import rel_err, sdrun_logits
    falcon = transformers.FalconForCausalLM(transformers.FalconConfig(
        new_decoder_architecture=True, num_kv_heads=2, **small)).eval()
    path, falcon_plan = os.path.join(tmp, "falcon_dyn.onnx"), os.path.join(tmp, "falcon_lora.sdp")
    torch.onnx.export(falcon, (torch.tensor(ids),), path)
    sh([sdc, "compile", path, "--peft", "lora", "--target-modules", "all-linear", "--shapes", f"input_ids=2x{SEQ}",
        "-o", falcon_plan])
    got = sdrun_logits(sdrun, falcon_plan, None, ids, tmp, "falcon_lora")
    with torch.no_grad():
        want = falcon(torch.tensor(ids)).logits.numpy()
    check("dynamo default Falcon, LoRA: compiles (GatherND picks as Gather), logits equal PyTorch's (1e-4)",
          rel_err(got, want) <= 1e-4, f"relative err {rel_err(got, want):.1e}")
    trains_down(sdrun, "Falcon", falcon_plan, data, tmp)


if __name__ == "__main__":
    sys.exit(main())
