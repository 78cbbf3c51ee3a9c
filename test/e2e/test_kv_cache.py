#!/usr/bin/env python3
"""KV-cache generation against transformers. `sdc compile --kv-cache L` adds
prefill and decode entries whose key/value caches live in plan state;
`sdrun generate` feeds a prompt in prefill chunks, then one decode step per
token, several prompts together (--kv-batch) each at its own length. Checked:
greedy text equals transformers' generate token for token on the same weights
(tiny Llama with grouped-query attention and rotary positions, tiny GPT-2 with
learned positions), batched rows equal each prompt generated alone, the
cached plan equals the windowed one, a trained LoRA adapter (--adapter)
decodes as PEFT's model does, and bad input is a one-line error."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import clean_error_problems, embedding_model, export_with_positions, sh, tool_paths, write_token_rows
from test_training import check, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
NEW = 20
PROMPTS = ["In the beginning God created", "And", "Let there be light: and there was light. And God saw"]


def reference(model, prompt, new=NEW):
    """transformers' greedy continuation of the prompt's bytes, as bytes."""
    import torch
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([list(prompt.encode())]), max_new_tokens=new, do_sample=False,
                             pad_token_id=0, eos_token_id=None)[0].tolist()
    return bytes(out)


def generate(sdrun, plan, prompts, *flags, new=NEW):
    cmd = [sdrun, "generate", plan, "--temperature", "0", "--max-new-tokens", str(new), "--threads", "2", *flags]
    for p in prompts:
        cmd += ["--prompt", p]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    return r.stdout if r.returncode == 0 else r.stderr


def inspect_globals(sdrun, plan):
    out = subprocess.run([sdrun, "inspect", plan], capture_output=True, text=True, check=True).stdout
    return [l.strip() for l in out.splitlines() if "kv_cache" in l and l.strip().startswith("kv_cache/")]


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_kv_")
    try:
        models = {}
        for arch in ("llama", "gpt2"):
            models[arch] = build(arch, 0)
            export(models[arch], os.path.join(tmp, f"{arch}.onnx"), 17, 2, 16)
        want = {arch: [reference(models[arch], p) for p in PROMPTS] for arch in models}

        llama = os.path.join(tmp, "llama_kv.sdp")
        sh([sdc, "compile", os.path.join(tmp, "llama.onnx"), "--kv-cache", "80", "--prefill-chunk", "8",
            "--kv-batch", "2", "-o", llama])
        caches = inspect_globals(sdrun, llama)
        check("llama --kv-cache 80 --kv-batch 2: a key and a value cache per layer, [2 rows, 2 kv heads (not the 4 "
              "query heads), 80 positions, 16]", len(caches) == 4 and all("f32[2x2x80x16] kv_cache" in c for c in caches),
              "; ".join(caches))
        got = generate(sdrun, llama, PROMPTS)
        expect = b"".join(w + b"\n" for w in want["llama"])
        check("llama: three prompts of 3 to 52 bytes decoded two rows at a time (prefill chunks of 8, then decode) "
              "equal transformers' greedy generate, token for token", got == expect, f"{got!r} vs {expect!r}")
        got = generate(sdrun, llama, PROMPTS[2:])
        check("llama: one prompt alone (its batch row beside an idle one, streamed) equals transformers",
              got == want["llama"][2] + b"\n", f"{got!r}")

        windowed = os.path.join(tmp, "llama_window.sdp")
        sh([sdc, "compile", os.path.join(tmp, "llama.onnx"), "--shapes", "input_ids=1x80", "-o", windowed])
        got = generate(sdrun, windowed, PROMPTS[:1])
        check("llama: the windowed plan (no cache, the window re-run per token) gives the same text",
              got == want["llama"][0] + b"\n", f"{got!r}")

        gpt2 = os.path.join(tmp, "gpt2_kv.sdp")
        sh([sdc, "compile", os.path.join(tmp, "gpt2.onnx"), "--kv-cache", "80", "-o", gpt2])
        got = generate(sdrun, gpt2, PROMPTS)
        expect = b"".join(w + b"\n" for w in want["gpt2"])
        check("gpt2 (learned positions) --kv-cache 80: three prompts one after another equal transformers' greedy "
              "generate", got == expect, f"{got!r} vs {expect!r}")

        sampled = [generate(sdrun, llama, PROMPTS[:1], "--temperature", "0.9", "--top-k", "0", "--seed", str(s))
                   for s in (5, 5, 6)]
        check("llama: seeded sampling through the cache repeats with the seed and changes with it",
              sampled[0] == sampled[1] and sampled[0] != sampled[2] and sampled[0].startswith(PROMPTS[0].encode()),
              f"{sampled}")

        # A LoRA training plan with generation entries: train, save the adapter, decode with --adapter.
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
        hf = os.path.join(tmp, "hf")
        models["llama"].save_pretrained(hf)
        lora = os.path.join(tmp, "lora.sdp")
        sh([sdc, "compile", os.path.join(tmp, "llama.onnx"), "--peft", "lora", "--target-modules", "q_proj,v_proj",
            "--shapes", "input_ids=2x16", "--kv-cache", "48", "-o", lora])
        data, adapter = os.path.join(tmp, "train.jsonl"), os.path.join(tmp, "adapter")
        write_token_rows(data, np.random.default_rng(1), 256, 16, 16)
        sh([sdrun, "train", lora, "--data", data, "--steps", "6", "--lr", "3e-2", "--save-adapter", adapter])
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf), adapter).eval()
        expect = reference(tuned, PROMPTS[0])
        got = generate(sdrun, lora, PROMPTS[:1], "--adapter", adapter)
        check("llama LoRA plan with --kv-cache: after 6 steps, sdrun generate --adapter equals PEFT's model "
              "(PeftModel.from_pretrained) greedy, and differs from the base model",
              got == expect + b"\n" and expect != want["llama"][0], f"{got!r} vs {expect!r}")

        def bad(name, cmd, must):
            problems, line = clean_error_problems(cmd, must, timeout=120)
            check(f"bad input: {name}", not problems, "; ".join(problems) or line)

        out = os.path.join(tmp, "never.sdp")

        # An export that takes position_ids (Optimum's inputs): a training plan binds them to 0..seq-1 as
        # transformers' default [1, seq], so the rotary tables fold to one row for --kv-batch 2 too.
        positioned, trained_kv = os.path.join(tmp, "positions.onnx"), os.path.join(tmp, "positions_kv.sdp")
        export_with_positions(models["llama"], positioned, 2, 16)
        sh([sdc, "compile", positioned, "--peft", "lora", "--target-modules", "q_proj", "--shapes", "input_ids=2x16",
            "--kv-cache", "80", "--kv-batch", "2", "--prefill-chunk", "4", "-o", trained_kv])
        got = generate(sdrun, trained_kv, PROMPTS[:2])
        expect = b"".join(w + b"\n" for w in want["llama"][:2])
        check("an export taking attention_mask and position_ids, LoRA training plan with --kv-cache --kv-batch 2: two "
              "prompts decode as transformers does (the adapter starts as zeros)", got == expect,
              f"{got!r} vs {expect!r}")

        # A user's own export with torch.onnx.export's defaults: the input called `tokens`, the batch fixed.
        class Wrapped(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, tokens):
                return self.model(input_ids=tokens, use_cache=False).logits
        sample = torch.randint(0, 256, (2, 16))
        fixed, free_seq = os.path.join(tmp, "user_fixed.onnx"), os.path.join(tmp, "user_seq.onnx")
        torch.onnx.export(Wrapped(models["llama"]), (sample,), fixed)
        torch.onnx.export(Wrapped(models["llama"]), (sample,), free_seq,
                          dynamic_shapes=({1: torch.export.Dim("seq", max=128)},))
        user = os.path.join(tmp, "user.sdp")
        sh([sdc, "compile", free_seq, "--kv-cache", "80", "-o", user])
        caches = inspect_globals(sdrun, user)
        got = generate(sdrun, user, PROMPTS[:2])
        expect = b"".join(w + b"\n" for w in want["llama"][:2])
        check("a user's export (input 'tokens', batch fixed at 2, sequence free): --kv-cache takes the model's "
              "batch, and two prompts decode as transformers does",
              got == expect and all("f32[2x2x80x16]" in c for c in caches), f"{caches}; {got!r} vs {expect!r}")
        bad("--kv-batch other than the batch the model fixes",
            [sdc, "compile", free_seq, "--kv-cache", "80", "--kv-batch", "3", "-o", out], ["batch 2", "--kv-batch 2"])
        bad("--kv-cache on a model exported with a fixed sequence length",
            [sdc, "compile", fixed, "--kv-cache", "80", "-o", out], ["'tokens'", "16 tokens per row", "dynamic sequence axis"])
        bad("a prompt longer than the plan's key/value cache",
            [sdrun, "generate", gpt2, "--prompt", "x" * 81, "--temperature", "0"], ["81 tokens", "context is 80"])
        onnx_path = os.path.join(tmp, "llama.onnx")
        bad("--kv-batch without --kv-cache", [sdc, "compile", onnx_path, "--kv-batch", "2", "-o", out], ["--kv-cache"])
        bad("--prefill-chunk longer than the cache",
            [sdc, "compile", onnx_path, "--kv-cache", "16", "--prefill-chunk", "32", "-o", out], ["longer than the cache"])
        check("bad input: no plan left behind by refused compiles", not os.path.exists(out), out)
        no_attention = os.path.join(tmp, "embed.onnx")
        embedding_model(no_attention)
        bad("a model without attention", [sdc, "compile", no_attention, "--kv-cache", "16", "-o", out],
            ["--kv-cache", "no attention"])
        import onnx
        from onnx import TensorProto, helper
        square = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in ("a", "b", "y")]
        contrib = helper.make_graph(
            [helper.make_node("FusedMatMul", ["a", "b"], ["y"], name="head_fused", domain="com.microsoft")],
            "contrib", square[:2], square[2:])
        contrib_path = os.path.join(tmp, "contrib.onnx")
        onnx.save(helper.make_model(contrib, opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("com.microsoft", 1)]), contrib_path)
        bad("an unsupported contrib op (the error names op, domain and node)",
            [sdc, "compile", contrib_path, "-o", out], ["FusedMatMul", "com.microsoft", "head_fused"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("kv_cache")


if __name__ == "__main__":
    sys.exit(main())
