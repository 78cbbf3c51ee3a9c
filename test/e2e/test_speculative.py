#!/usr/bin/env python3
"""Speculative decoding by prompt lookup. `sdc compile --kv-cache L --speculate
K` adds a verify entry taking K + 1 tokens a row; `sdrun generate` and `sdrun
serve` guess up to K tokens a step from each row's text (what followed the last
time its final tokens occurred) and check them in that one call, drawing each
token as plain decoding would. Checked on a tiny Llama (byte-level): the plan's
verify entry; greedy text equals transformers' greedy generate and the same
plan with --speculate 0, with guesses confirmed (more than one token a row and
step); seeded sampling (temperature, top-k, top-p, repetition penalty) and
--json give the same text with and without speculation, as does the Python
module's Generator.generate (the C API's sd_generator_generate), and its
generate_batch with a draft model; sdrun serve gives the
same texts, streams, log-probabilities, stop texts, token counts and JSON
replies with and without it, while /metrics counts the guessed and confirmed
tokens; a row reaching the cache's end beside a row checking guesses; bad
flags are one-line errors. --speculate-always makes every step with guesses
check them, so the checks exercise guessing whatever the measured costs say."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

from e2e_util import clean_error_problems, run_module_script, tool_paths
from test_kv_cache import reference
from test_serve import Server
from test_training import check, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
NEW = 48
# Random weights: greedy text soon repeats itself, which prompt lookup guesses;
# the last prompt repeats itself from the start.
PROMPTS = ["In the beginning God created", "And", "abcabcabcabcabc", "Let there be light: and there was light"]


def generate(sdrun, plan, prompts, *flags, new=NEW):
    """(stdout, stderr) of sdrun generate, greedy unless the flags say otherwise."""
    cmd = [sdrun, "generate", plan, "--temperature", "0", "--max-new-tokens", str(new), "--threads", "2", *flags]
    for p in prompts:
        cmd += ["--prompt", p]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    return (r.stdout if r.returncode == 0 else b"failed: " + r.stderr), r.stderr.decode()


def speculation(stderr):
    """(confirmed, guessed, tokens a row and step) from generate's stderr line."""
    m = re.search(r"speculation: (\d+) of (\d+) guessed tokens confirmed; ([\d.]+) tokens a row and step", stderr)
    return (int(m.group(1)), int(m.group(2)), float(m.group(3))) if m else (0, 0, 0.0)


def metrics(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {k: int(v) for k, v in re.findall(r"^(sdrun_spec_decode_\w+) (\d+)$", text, re.M)}


def served_replies(srv):
    """What one server answers to the same requests, for comparing two servers."""
    client = srv.client()
    out = {}
    out["greedy"] = [client.completions.create(model="spec", prompt=p, max_tokens=NEW, temperature=0).choices[0].text
                     for p in PROMPTS]
    r = client.completions.create(model="spec", prompt=PROMPTS[2], max_tokens=7, temperature=0)
    out["short"] = (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens)
    out["sampled"] = [c.text for c in client.completions.create(model="spec", prompt=PROMPTS[0], max_tokens=NEW,
                                                                 temperature=0.8, top_p=0.9, seed=11, n=3).choices]
    r = client.completions.create(model="spec", prompt=PROMPTS[1], max_tokens=24, temperature=0, logprobs=2)
    out["logprobs"] = (r.choices[0].text, r.choices[0].logprobs.tokens, r.choices[0].logprobs.token_logprobs)
    out["stream"] = "".join(c.choices[0].text for c in client.completions.create(
        model="spec", prompt=PROMPTS[3], max_tokens=NEW, temperature=0, stream=True) if c.choices)
    out["stop"] = out["greedy"][3][4:7]
    r = client.completions.create(model="spec", prompt=PROMPTS[3], max_tokens=NEW, temperature=0, stop=[out["stop"]])
    out["stopped"] = (r.choices[0].text, r.choices[0].finish_reason)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "tags": {"type": "array", "items": {"enum": ["ab", "abc"]}}},
              "required": ["name", "tags"]}
    r = client.completions.create(model="spec", prompt=PROMPTS[2], max_tokens=NEW, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "t", "schema": schema}}})
    out["json"] = (r.choices[0].text, r.choices[0].finish_reason)
    return out


def serve_checks(sdrun, plan, want_greedy, servers):
    on = Server(sdrun, plan, "--served-model-name", "spec", "--speculate-always")
    servers.append(on)
    off = Server(sdrun, plan, "--served-model-name", "spec", "--speculate", "0")
    servers.append(off)
    check("sdrun serve says it guesses up to 4 tokens a step (the plan's --speculate 4)",
          "up to 4 guessed tokens a step" in on.text() and "guessed" not in off.text(), on.text()[-300:])
    a, b = served_replies(on), served_replies(off)
    check("serve greedy completions of 4 prompts equal transformers' greedy text, with and without speculation",
          a["greedy"] == b["greedy"] == want_greedy, f"{a['greedy']} vs {b['greedy']} vs {want_greedy}")
    for key, what in (("short", "max_tokens 7 (text, finish_reason length, 7 completion tokens)"),
                      ("sampled", "3 seeded choices drawn with temperature 0.8, top_p 0.9"),
                      ("stream", "a streamed reply"), ("stopped", "a stop text (cut, finish_reason stop)"),
                      ("json", "a json_schema reply")):
        check(f"serve with speculation: {what} as without", a[key] == b[key], f"{a[key]!r} vs {b[key]!r}")
    check("serve: max_tokens 7 gives 7 tokens though a step may confirm more", a["short"][1:] == ("length", 7),
          f"{a['short']}")
    check("serve: the stop text is cut where it first comes", a["stopped"] == (a["greedy"][3][:4], "stop") and
          a["stop"] not in a["stopped"][0], f"{a['stopped']} (stop {a['stop']!r})")
    check("serve: the json_schema reply parses and ends when whole", a["json"][1] == "stop" and
          json.loads(a["json"][0])["tags"] is not None, f"{a['json']}")
    gap = max(abs(x - y) for x, y in zip(a["logprobs"][2], b["logprobs"][2]))
    check("serve: log-probabilities with speculation (verify entry's logits) equal those without within 1e-5",
          a["logprobs"][:2] == b["logprobs"][:2] and gap < 1e-5, f"gap {gap:.2e}")
    m_on, m_off = metrics(on), metrics(off)
    guessed, confirmed = m_on.get("sdrun_spec_decode_draft_tokens_total", 0), m_on.get(
        "sdrun_spec_decode_accepted_tokens_total", 0)
    check("/metrics counts guessed and confirmed tokens (none with --speculate 0)",
          guessed > 0 and 0 < confirmed <= guessed and m_off == {"sdrun_spec_decode_draft_tokens_total": 0,
                                                                  "sdrun_spec_decode_accepted_tokens_total": 0},
          f"on {m_on}, off {m_off}")
    for srv in (on, off):
        srv.stop()


def bad_flags(sdc, sdrun, onnx, spec, plain, tmp):
    out = os.path.join(tmp, "bad.sdp")
    for cmd, must, what in (
            ([sdc, "compile", onnx, "--speculate", "4", "-o", out], ["--kv-cache"], "--speculate without --kv-cache"),
            ([sdc, "compile", onnx, "--kv-cache", "8", "--speculate", "8", "-o", out], ["--speculate 8", "fit"],
             "--speculate as long as the cache"),
            ([sdc, "compile", onnx, "--kv-cache", "8", "--speculate", "0", "-o", out], ["positive integer"],
             "--speculate 0 at compile"),
            ([sdrun, "generate", spec, "--prompt", "a", "--speculate", "5"], ["at most 4"],
             "generate --speculate past the plan's 4"),
            ([sdrun, "generate", plain, "--prompt", "a", "--speculate", "2"], ["--speculate K"],
             "generate --speculate on a plan without a verify entry"),
            ([sdrun, "generate", spec, "--prompt", "a", "--speculate", "-1"], ["--speculate"],
             "generate --speculate -1"),
            ([sdrun, "serve", spec, "--port", "0", "--speculate", "9"], ["at most 4"], "serve --speculate past 4")):
        problems, line = clean_error_problems(cmd, must, no_files=(out,))
        check(f"bad flag, one line: {what}", not problems, "; ".join(problems) or line)


def python_module(sdrun, plan, plain, expect, sampled):
    """The Python module's Generator.generate (the C API's sd_generator_generate) against next(); its
    generate_batch (sd_generator_generate_batch) and draft (sd_generator_set_draft) against sdrun generate."""
    script = f"""
import json, sdc
s = sdc.Session(sdc.Plan({plan!r}), threads=2)
ids = list({PROMPTS[2].encode()!r})
def gen(**kw):
    return sdc.Generator(s, **kw)
g = gen(temperature=0)
out = {{"speculation": g.speculation, "greedy": g.generate(ids, {NEW}), "off": gen(temperature=0).generate(ids, {NEW}, speculate=0)}}
one, t = gen(temperature=0), list(ids)
out["next"] = []
for _ in range({NEW}):
    out["next"].append(one.next(t)); t.append(out["next"][-1])
out["sampled"] = gen(temperature=0.9, top_k=0, seed=4).generate(ids, {NEW})
out["sampled_off"] = gen(temperature=0.9, top_k=0, seed=4).generate(ids, {NEW}, speculate=0)
try:
    g.generate(ids, 4, speculate=5)
except Exception as e:
    out["error"] = str(e)
texts = [list(p.encode()) for p in {PROMPTS!r}]
d = sdc.Generator(sdc.Session(sdc.Plan({plain!r}), threads=2), temperature=0)
g.draft = d
out["draft_one"] = g.generate(ids, {NEW})
out["draft_batch"] = [bytes(t + new).decode("latin-1") for t, new in zip(texts, g.generate_batch(texts, {NEW}))]
sampled = gen(temperature=0.9, top_k=0, seed=4)
sampled.draft = d
out["sampled_batch"] = [bytes(t + new).decode("latin-1") for t, new in
                        zip(texts, sampled.generate_batch(texts, {NEW}, speculate=4))]
out["draft_errors"] = []
for bad in (lambda: setattr(g, "draft", g), lambda: setattr(d, "draft", g)):
    try:
        bad()
        out["draft_errors"].append("no error")
    except Exception as e:
        out["draft_errors"].append(str(e))
g.draft = None
print(json.dumps(out))
"""
    out, err = run_module_script(sdrun, script, timeout=300)
    if out is None:
        check("the Python module's Generator.generate", False, err[-400:])
        return
    check("Python: Generator.speculation is the plan's 4; generate() gives next()'s tokens with and without "
          "guesses, greedy and seeded", out["speculation"] == 4 and out["greedy"] == out["off"] == out["next"] and
          out["sampled"] == out["sampled_off"] and len(out["greedy"]) == NEW, json.dumps(out)[:400])
    check("Python: speculate past the plan's 4 is an error naming both", "5 tokens" in out.get("error", "") and
          "checks 4" in out.get("error", ""), out.get("error"))
    batch = "".join(t + "\n" for t in out["draft_batch"]).encode("latin-1")
    check("Python: a draft (Generator.draft, the same model's plan without a verify entry): generate() and "
          "generate_batch (4 texts, 2 rows) give transformers' greedy tokens",
          out["draft_one"] == out["greedy"] and batch == expect, f"{batch!r} vs {expect!r}")
    batch = "".join(t + "\n" for t in out["sampled_batch"]).encode("latin-1")
    check("Python: generate_batch seeded sampling with a draft (text i drawing with seed + i) equals sdrun "
          "generate's rows with the same --seed", batch == sampled, f"{batch!r} vs {sampled!r}")
    errors = out["draft_errors"]
    check("Python: a generator as its own draft, and a draft on a plan without a verify entry, are errors",
          "its own draft" in errors[0] and "verify entry" in errors[1], errors)


def draft_checks(sdc, sdrun, tmp, spec, plain, expect, servers):
    """--draft PLAN: a second model's greedy tokens as the guesses."""
    import transformers
    from export_hf import build, export
    other, onnx_other = os.path.join(tmp, "other.sdp"), os.path.join(tmp, "other.onnx")
    export(build("llama", 1), onnx_other, 17, 2, 16)  # other weights: its guesses often fail
    subprocess.run([sdc, "compile", onnx_other, "--kv-cache", "128", "--kv-batch", "2", "-o", other], check=True,
                   capture_output=True)
    same, err_same = generate(sdrun, spec, PROMPTS, "--draft", plain, "--speculate-always")
    confirmed, guessed, per_step = speculation(err_same)
    check("generate --draft (the model itself as its draft): transformers' greedy text, every guess confirmed, "
          "4 guesses and the drawn token a row and step", same == expect and confirmed == guessed > 0 and
          per_step > 3, f"{same!r}; {err_same.strip()}")
    got, err = generate(sdrun, spec, PROMPTS, "--draft", other, "--speculate-always")
    confirmed, guessed, _ = speculation(err)
    auto, _ = generate(sdrun, spec, PROMPTS, "--draft", other)
    check("generate --draft (another model's weights): transformers' greedy text whatever the draft guesses "
          "(some confirmed, some not), with every guess checked and with the default policy",
          got == auto == expect and 0 < confirmed < guessed, f"{got!r}; {err.strip()}")
    flags = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "4"]
    a, _ = generate(sdrun, spec, PROMPTS, *flags, "--draft", other, "--speculate-always")
    b, _ = generate(sdrun, spec, PROMPTS, *flags, "--speculate", "0")
    check("generate --draft, seeded top-p sampling: the same draws as without speculation",
          a == b and not a.startswith(b"failed"), f"{a!r} vs {b!r}")
    on = Server(sdrun, spec, "--served-model-name", "spec", "--draft", other, "--speculate-always")
    servers.append(on)
    off = Server(sdrun, spec, "--served-model-name", "spec", "--speculate", "0")
    servers.append(off)
    got, want = served_replies(on), served_replies(off)
    check("serve --draft: greedy, short, seeded top-p, logprobs, stream, stop and JSON replies are the same as "
          "without speculation, and guesses were checked", got == want and metrics(on).get(
              "sdrun_spec_decode_draft_tokens_total", 0) > 0, f"{got} vs {want}")
    on.stop()
    off.stop()
    # Drafts that do not fit the plan.
    torch_cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=256)
    wide, onnx_wide = os.path.join(tmp, "wide.sdp"), os.path.join(tmp, "wide.onnx")
    export(transformers.LlamaForCausalLM(torch_cfg).eval(), onnx_wide, 17, 2, 16)
    one, short = os.path.join(tmp, "one.sdp"), os.path.join(tmp, "shortdraft.sdp")
    for out, onnx_path, flags in ((wide, onnx_wide, ["--kv-batch", "2", "--kv-cache", "128"]),
                                  (one, onnx_other, ["--kv-batch", "1", "--kv-cache", "128"]),
                                  (short, onnx_other, ["--kv-batch", "2", "--kv-cache", "64"])):
        subprocess.run([sdc, "compile", onnx_path, *flags, "-o", out], check=True, capture_output=True)
    for what, cmd, must in [
            ("another vocabulary", [spec, "--draft", wide], ["--draft", "300 logits", "same tokenizer"]),
            ("fewer rows", [spec, "--draft", one], ["--draft", "1 rows", "--kv-batch 2"]),
            ("a shorter cache", [spec, "--draft", short], ["--draft", "context", "--kv-cache"]),
            ("a plan without a verify entry", [plain, "--draft", other], ["--draft", "--speculate K"]),
            ("--speculate 0", [spec, "--draft", other, "--speculate", "0"], ["--draft", "--speculate 0"]),
            ("a missing draft plan", [spec, "--draft", os.path.join(tmp, "gone.sdp")], ["--draft", "gone.sdp"])]:
        problems, line = clean_error_problems([sdrun, "generate", cmd[0], "--prompt", "In", *cmd[1:]], must)
        check(f"bad input: --draft with {what} is a one-line error", not problems, "; ".join(problems) or line)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_spec_")
    servers = []
    try:
        onnx = os.path.join(tmp, "llama.onnx")
        export(build("llama", 0), onnx, 17, 2, 16)
        model = build("llama", 0)
        want = [reference(model, p, NEW) for p in PROMPTS]
        spec, plain = os.path.join(tmp, "spec.sdp"), os.path.join(tmp, "plain.sdp")
        subprocess.run([sdc, "compile", onnx, "--kv-cache", "128", "--kv-batch", "2", "--prefill-chunk", "8",
                        "--speculate", "4", "-o", spec], check=True, capture_output=True)
        subprocess.run([sdc, "compile", onnx, "--kv-cache", "128", "--kv-batch", "2", "--prefill-chunk", "8",
                        "-o", plain], check=True, capture_output=True)
        shown = subprocess.run([sdrun, "inspect", spec], capture_output=True, text=True, check=True).stdout
        check("--speculate 4: a verify entry of 5 tokens a row (i64[2x5] tokens and positions -> f32[2x5x256])",
              "verify [batch=2, seq=5]" in shown and "output logits: f32[2x5x256]" in shown, shown[-600:])

        got, err = generate(sdrun, spec, PROMPTS, "--speculate-always")
        auto, _ = generate(sdrun, spec, PROMPTS)
        off, _ = generate(sdrun, spec, PROMPTS, "--speculate", "0")
        base, _ = generate(sdrun, plain, PROMPTS)
        expect = b"".join(w + b"\n" for w in want)
        check("generate greedy, 4 prompts 2 rows at a time: equals transformers' greedy generate token for token "
              "checking every guess, guessing when it pays (the default), with --speculate 0, and on the plan "
              "without a verify entry", got == auto == off == base == expect, f"{got!r} vs {expect!r}")
        confirmed, guessed, per_step = speculation(err)
        check("generate --speculate-always: guesses are confirmed, more than one token a row and step on these "
              "prompts", 0 < confirmed <= guessed and per_step > 1.2, err.strip())

        for flags in (["--temperature", "0.9", "--top-k", "0", "--seed", "5"],
                      ["--temperature", "0.7", "--top-p", "0.8", "--repetition-penalty", "1.3", "--seed", "3"],
                      ["--temperature", "1.2", "--top-k", "8", "--seed", "9"]):
            a, _ = generate(sdrun, spec, PROMPTS, *flags, "--speculate-always")
            b, _ = generate(sdrun, spec, PROMPTS, *flags, "--speculate", "0")
            check(f"generate {' '.join(flags)}: the same draws with and without speculation",
                  a == b and not a.startswith(b"failed"), f"{a!r} vs {b!r}")
        a, err = generate(sdrun, spec, PROMPTS[1:3], "--json", "--speculate-always")
        b, _ = generate(sdrun, spec, PROMPTS[1:3], "--json", "--speculate", "0")
        docs = [line[len(p):] for line, p in zip(a.decode("utf-8", "replace").splitlines(), PROMPTS[1:3])]
        check("generate --json: the same JSON with and without speculation", a == b and all(
            isinstance(json.loads(d), dict) for d in docs), f"{a!r} vs {b!r}")

        # A byte-level model's served text has each invalid UTF-8 sequence as U+FFFD.
        # A row that reaches the cache's last slot while the row beside it checks guesses.
        short = os.path.join(tmp, "short.sdp")
        subprocess.run([sdc, "compile", onnx, "--kv-cache", "40", "--kv-batch", "2", "--prefill-chunk", "8",
                        "--speculate", "4", "-o", short], check=True, capture_output=True)
        pair = [PROMPTS[3][:30], PROMPTS[2]]
        a, err = generate(sdrun, short, pair, "--speculate-always", new=30)
        b, _ = generate(sdrun, short, pair, "--speculate", "0", new=30)
        check("a row filling the cache (40 positions) beside a row checking guesses: the same text as without "
              "guesses, and the note that the context ended", a == b and "context of 40 tokens" in err and
              not a.startswith(b"failed"), f"{a!r} vs {b!r}; {err.strip()}")
        sampled, _ = generate(sdrun, spec, PROMPTS, "--temperature", "0.9", "--top-k", "0", "--seed", "4")
        python_module(sdrun, spec, plain, expect, sampled)
        serve_checks(sdrun, spec, [w[len(p.encode()):].decode("utf-8", "replace") for w, p in zip(want, PROMPTS)],
                     servers)
        bad_flags(sdc, sdrun, onnx, spec, plain, tmp)
        draft_checks(sdc, sdrun, tmp, spec, plain, expect, servers)
    finally:
        for srv in servers:
            if srv.proc.poll() is None:
                srv.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return report("speculative")


if __name__ == "__main__":
    sys.exit(main())
