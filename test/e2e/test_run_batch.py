#!/usr/bin/env python3
"""sdrun run-batch: a file of OpenAI batch requests answered offline, as
vLLM's run-batch and OpenAI's Batch API take them ({"custom_id", "method",
"url", "body"} a line in; {"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"} a line out, in the input's order).

Checked on a tiny Llama with a small BPE tokenizer and a plan of adapter
slots serving two PEFT adapters beside the base model: every request's
status and body (completions greedy and sampled, several prompts, log
probabilities, chats, a guided choice, the adapters' models, refused requests)
equal sdrun serve's reply to the same body over HTTP, whatever the number of
requests in flight; a stream is refused in the output; malformed files are
one-line errors naming the line, and leave no output file."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

from e2e_util import clean_error_problems, tool_paths
from test_multi_lora import peft_adapter
from test_serve import Server, genesis_tokenizer
from test_training import check, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))

PROMPTS = ["And God said, Let there be", "In the beginning", "And the earth was without form, and void",
           "Noah found grace"]
CHAT = [{"role": "user", "content": "Who made the light?"}]


def requests():
    """(custom_id, url, body) of the batch: more requests than the plan's rows, of three models."""
    out = []
    for k, prompt in enumerate(PROMPTS):
        for model in ("base", "c", "d"):
            out.append((f"{model}-{k}", "/v1/completions",
                        {"model": model, "prompt": prompt, "max_tokens": 6 + k, "temperature": 0}))
    out += [
        ("sampled", "/v1/completions", {"model": "c", "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0.9,
                                        "top_p": 0.9, "seed": 5, "n": 2}),
        ("two-prompts", "/v1/completions", {"model": "d", "prompt": PROMPTS[1:3], "max_tokens": 5,
                                            "temperature": 0}),
        ("logprobs", "/v1/completions", {"model": "base", "prompt": PROMPTS[3], "max_tokens": 4, "temperature": 0,
                                         "logprobs": 2}),
        ("chat", "/v1/chat/completions", {"model": "c", "messages": CHAT, "max_tokens": 8, "temperature": 0}),
        ("choice", "/v1/chat/completions", {"model": "d", "messages": CHAT, "max_tokens": 12, "temperature": 0,
                                            "guided_choice": ["the light", "the darkness", "God"]}),
        ("unknown-field", "/v1/completions", {"model": "base", "prompt": "In", "bogus": 1}),
        ("unknown-model", "/v1/chat/completions", {"model": "zz", "messages": CHAT}),
        ("embeddings", "/v1/embeddings", {"model": "base", "input": "In the beginning"}),
    ]
    return out


def write_batch(path, reqs, extra=()):
    with open(path, "w") as f:
        for cid, url, body in reqs:
            f.write(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n")
        for line in extra:
            f.write(line + "\n")


def comparable(body):
    """A reply without what differs between any two runs (its id and time)."""
    if isinstance(body, dict):
        return {k: v for k, v in body.items() if k not in ("id", "created")}
    return body


def serve_reply(port, url, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{url}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def run_batch(sdrun, plan, flags, inp, out, *extra):
    return subprocess.run([sdrun, "run-batch", plan, "-i", inp, "-o", out, *flags, *extra], capture_output=True,
                          text=True, timeout=600)


def bad_files(sdrun, plan, flags, tmp):
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": "In", "max_tokens": 2}})
    out = os.path.join(tmp, "bad_out.jsonl")
    for what, lines, must in [
            ("a line that is not JSON", [good, "{not json"], ["bad.jsonl:2"]),
            ("a line that is not an object", [good, "[1, 2]"], ["bad.jsonl:2", "JSON object"]),
            ("a missing custom_id", [good, '{"method": "POST", "url": "/v1/completions", "body": {}}'],
             ["bad.jsonl:2", "custom_id"]),
            ("a custom_id used twice", [good, "", good], ["bad.jsonl:3", "'a' is used twice"]),
            ("method GET", [good.replace('"POST"', '"GET"')], ["bad.jsonl:1", "method", "GET"]),
            ("an unknown url", [good.replace("/v1/completions", "/v1/responses")], ["bad.jsonl:1", "/v1/responses"]),
            ("a body that is not an object", ['{"custom_id": "b", "method": "POST", "url": "/v1/completions", '
                                              '"body": "In"}'], ["bad.jsonl:1", "body"]),
            ("an unknown field", [good[:-1] + ', "priority": 1}'], ["bad.jsonl:1", "priority"]),
            ("no requests", ["", "  "], ["no requests"])]:
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write("\n".join(lines) + "\n")
        problems, line = clean_error_problems([sdrun, "run-batch", plan, "-i", bad, "-o", out, *flags], must,
                                              no_files=(out,))
        check(f"bad input: {what} is a one-line error naming the line, and no output file", not problems,
              "; ".join(problems) or line)
    for what, cmd, must in [
            ("no -o", [sdrun, "run-batch", plan, "-i", os.path.join(tmp, "bad.jsonl")], ["-o OUTPUT.jsonl"]),
            ("a missing input file", [sdrun, "run-batch", plan, "-i", os.path.join(tmp, "gone.jsonl"), "-o", out],
             ["gone.jsonl"]),
            ("an output in a missing folder", [sdrun, "run-batch", plan, "-i", os.path.join(tmp, "bad.jsonl"), "-o",
                                               os.path.join(tmp, "no", "out.jsonl")], ["-o", "no/out.jsonl"]),
            ("--max-in-flight 0", [sdrun, "run-batch", plan, "-i", os.path.join(tmp, "bad.jsonl"), "-o", out,
                                   "--max-in-flight", "0"], ["--max-in-flight"])]:
        problems, line = clean_error_problems(cmd, must, no_files=(out,))
        check(f"bad input: {what} is a one-line error", not problems, "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_run_batch_")
    servers = []
    try:
        tok = os.path.join(tmp, "tok")
        genesis_tokenizer(tok)
        onnx_path = os.path.join(tmp, "llama.onnx")
        export(build("llama", 0), onnx_path, 17, 2, 16)
        _, ad_c = peft_adapter(tmp, "c_adapter", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        _, ad_d = peft_adapter(tmp, "d_adapter", r=2, lora_alpha=5, use_rslora=True,
                               target_modules=["q_proj", "v_proj"])
        plan = os.path.join(tmp, "slots.sdp")
        subprocess.run([sdc, "compile", onnx_path, "--max-loras", "2", "--target-modules", "q_proj,v_proj",
                        "--kv-cache", "96", "--kv-batch", "4", "--prefill-chunk", "8", "--tokenizer", tok,
                        "-o", plan], check=True, capture_output=True)
        flags = ["--served-model-name", "base", "--lora-modules", f"c={ad_c}", "--lora-modules", f"d={ad_d}",
                 "--threads", "2"]
        reqs = requests()
        inp, out, one = (os.path.join(tmp, n) for n in ("in.jsonl", "out.jsonl", "one.jsonl"))
        write_batch(inp, reqs + [("stream", "/v1/completions", {"model": "c", "prompt": "In", "stream": True})])
        r = run_batch(sdrun, plan, flags, inp, out)
        check("run-batch: exit 0 and a summary line naming the output", r.returncode == 0 and
              f"{len(reqs) + 1} requests answered" in r.stderr and out in r.stderr, r.stderr[-600:])
        if r.returncode:
            return report("run_batch")
        lines = [json.loads(l) for l in open(out)]
        check("run-batch: a line a request, in the input's order, with OpenAI's batch output fields",
              [l["custom_id"] for l in lines] == [c for c, _, _ in reqs] + ["stream"] and
              all(l["id"] == f"batch_req_{i + 1}" and l["error"] is None and
                  l["response"]["request_id"] == f"req_{i + 1}" for i, l in enumerate(lines)),
              json.dumps(lines[0])[:300])
        stream = lines[-1]["response"]
        check("run-batch: a stream is refused in its line (400 naming stream), the others run",
              stream["status_code"] == 400 and stream["body"]["error"]["param"] == "stream", stream)

        srv = Server(sdrun, plan, *flags)
        servers.append(srv)
        differ = []
        for (cid, url, body), line in zip(reqs, lines):
            status, reply = serve_reply(srv.port, url, body)
            got = line["response"]
            if (status, comparable(reply)) != (got["status_code"], comparable(got["body"])):
                differ.append(f"{cid}: serve {status} {json.dumps(reply)[:200]} vs run-batch {got['status_code']} "
                              f"{json.dumps(got['body'])[:200]}")
        statuses = [l["response"]["status_code"] for l in lines[:-1]]
        check(f"run-batch: all {len(reqs)} responses equal sdrun serve's to the same bodies (status and body: "
              "greedy and seeded completions of three models through the slots, 2 prompts, logprobs, chats, a "
              "guided choice; 400 and 404 refusals)", not differ and statuses.count(200) == len(reqs) - 3 and
              sorted(statuses[-3:]) == [400, 400, 404], "; ".join(differ)[:1500] or statuses)
        texts = {l["custom_id"]: l["response"]["body"]["choices"][0]["text"] for l in lines[:12]}
        check("run-batch: the three models' texts differ (the adapters are applied per request)",
              all(len({texts[f"{m}-{k}"] for m in ("base", "c", "d")}) == 3 for k in range(len(PROMPTS))), texts)
        srv.stop()
        servers.remove(srv)

        write_batch(inp, reqs)
        r = run_batch(sdrun, plan, flags, inp, one, "--max-in-flight", "1")
        alone = [json.loads(l) for l in open(one)] if r.returncode == 0 else []
        check("run-batch --max-in-flight 1 (one request at a time): the same responses as many in flight",
              [comparable(l["response"]["body"]) for l in alone] ==
              [comparable(l["response"]["body"]) for l in lines[:-1]], r.stderr[-300:])
        bad_files(sdrun, plan, flags, tmp)
    finally:
        for srv in servers:
            if srv.proc.poll() is None:
                srv.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return report("run_batch")


if __name__ == "__main__":
    sys.exit(main())
