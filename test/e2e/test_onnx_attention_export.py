#!/usr/bin/env python3
"""A tiny LlamaForCausalLM (grouped-query attention, SDPA) exported by
PyTorch's dynamo exporter at opset 23, which emits ONNX's own `Attention` and
`RMSNormalization` ops:

  infer   sdrun's logits equal PyTorch's (1e-4 relative)
  train   sdc compile --peft lora on q_proj,v_proj: sdrun train's first loss
          equals PyTorch's loss on the same rows (1e-4), and the adapter moves
  mask    an Attention node with a bool mask given at run time (a query that
          sees no key included) fuses and equals ONNX's reference
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from e2e_util import plan_steps, sdrun_logits, sh, tool_paths
from test_training import check, report

BATCH, SEQ = 2, 16


def main():
    sdc, sdrun = tool_paths()
    import onnx
    import onnx.parser
    import torch
    import transformers
    tmp = tempfile.mkdtemp(prefix="sd_onnx23_")
    try:
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                       use_cache=False, tie_word_embeddings=False, attn_implementation="sdpa")
        model = transformers.LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 256, (BATCH, SEQ))
        path = os.path.join(tmp, "llama.onnx")
        torch.onnx.export(model, (ids,), path, dynamo=True, opset_version=23, input_names=["input_ids"],
                          output_names=["logits"])
        ops = [n.op_type for n in onnx.load(path).graph.node]
        check("the export holds ONNX Attention and RMSNormalization ops",
              ops.count("Attention") == 2 and "RMSNormalization" in ops,
              f"{ops.count('Attention')} Attention, {ops.count('RMSNormalization')} RMSNormalization")

        plan = os.path.join(tmp, "infer.sdp")
        sh([sdc, "compile", path, "--shapes", f"input_ids={BATCH}x{SEQ}", "-o", plan])
        np.save(os.path.join(tmp, "ids.npy"), ids.numpy())
        out = os.path.join(tmp, "out")
        sh([sdrun, "infer", plan, "--input", f"input_ids={os.path.join(tmp, 'ids.npy')}", "--output-dir", out,
            "--output-format", "npy"])
        got = np.load(os.path.join(out, "output_0.npy"))
        with torch.no_grad():
            want = model(ids).logits.numpy()
        err = float(np.abs(got - want).max() / np.abs(want).max())
        check("infer: sdrun's logits equal PyTorch's (1e-4)", err <= 1e-4, f"relative err {err:.1e}")

        data = os.path.join(tmp, "train.jsonl")
        rows = np.random.default_rng(1).integers(0, 256, (8, SEQ))
        with open(data, "w") as f:
            for r in rows:
                f.write(json.dumps({"input_ids": r.tolist()}) + "\n")
        lora = os.path.join(tmp, "lora.sdp")
        sh([sdc, "compile", path, "--peft", "lora", "--target-modules", "q_proj,v_proj", "--shapes",
            f"input_ids={BATCH}x{SEQ}", "-o", lora])
        metrics, adapter = os.path.join(tmp, "metrics.jsonl"), os.path.join(tmp, "adapter")
        sh([sdrun, "train", lora, "--data", data, "--no-shuffle", "--steps", "3", "--lr", "1e-2", "--metrics", metrics,
            "--save-adapter", adapter])
        losses = [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]
        first = torch.tensor(rows[:BATCH])
        with torch.no_grad():
            want_loss = float(model(input_ids=first, labels=first).loss)
        check("train: LoRA through ONNX Attention starts from PyTorch's loss (1e-4)",
              abs(losses[0] - want_loss) <= 1e-4 * abs(want_loss), f"sdrun {losses[0]:.6f}, PyTorch {want_loss:.6f}")
        from safetensors.numpy import load_file
        b = [v for k, v in load_file(os.path.join(adapter, "adapter_model.safetensors")).items() if "lora_B" in k]
        check("train: the gradient reaches the adapters through the imported attention",
              len(b) == 4 and all(np.abs(x).max() > 0 for x in b), f"{len(b)} lora_B tensors")

        # A bool mask given at run time, one query seeing no key: fused into one
        # Attention step (zero_masked_rows), equal to ONNX's reference.
        from onnx.reference import ReferenceEvaluator
        masked = onnx.parser.parse_model("""<ir_version: 9, opset_import: ["" : 23]>
            g (float[2, 2, 4, 8] q, float[2, 2, 5, 8] k, float[2, 2, 5, 8] v, bool[2, 1, 4, 5] m) => (float[2, 2, 4, 8] y)
            { y = Attention (q, k, v, m) }""")
        masked_path = os.path.join(tmp, "masked.onnx")
        onnx.save(masked, masked_path)
        r = np.random.default_rng(3)
        feeds = {"q": r.standard_normal((2, 2, 4, 8)).astype(np.float32),
                 "k": r.standard_normal((2, 2, 5, 8)).astype(np.float32),
                 "v": r.standard_normal((2, 2, 5, 8)).astype(np.float32), "m": r.random((2, 1, 4, 5)) > 0.4}
        feeds["m"][1, 0, 2, :] = False
        masked_plan = os.path.join(tmp, "masked.sdp")
        sh([sdc, "compile", masked_path, "-o", masked_plan])
        got = sdrun_logits(sdrun, masked_plan, None, feeds, tmp, "masked")
        want = ReferenceEvaluator(masked).run(None, feeds)[0]
        steps = plan_steps(sdrun, masked_plan)
        check("a run-time bool mask hiding every key of a query: one fused Attention step, equal to ONNX's reference "
              "(1e-5; that query's output 0)",
              "Softmax" not in steps and "Attention" in steps and float(np.abs(got - want).max()) <= 1e-5 and
              not np.isnan(got).any(), f"max abs err {float(np.abs(got - want).max()):.1e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("onnx_attention_export")


if __name__ == "__main__":
    sys.exit(main())
