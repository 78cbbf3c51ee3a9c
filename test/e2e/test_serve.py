#!/usr/bin/env python3
"""sdrun serve through the official OpenAI Python client: completions and
chat completions on a tiny Llama with a trained 256-token tokenizer. Checked:
greedy text equals transformers' generate on the same weights (chat: on the
ids of apply_chat_template's rendering) and sdrun generate; streamed deltas
add up to the whole text; stop texts are cut and held back while streaming;
an EOS ends with finish_reason "stop", max_tokens with "length"; usage
counts; token-id prompts and echo; n choices; concurrent clients batched into
the plan's rows give each what it gets alone, and a seeded draw does not
depend on its neighbours; the windowed (no cache) and byte-level (no
tokenizer) paths; --api-key; and bad requests are OpenAI-style errors while
the server keeps serving (malformed HTTP and JSON, unknown fields and
routes, a too long prompt, an oversized body, a stalled client, a client
gone mid-stream), bad flags are one-line errors, and SIGTERM stops it."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from e2e_util import clean_error_problems, tool_paths
from test_training import check, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
PROMPTS = ["And God said, Let there be", "In the beginning", "And the earth was without form, and void",
           "Noah found grace"]


class Server:
    """sdrun serve on a free port; stderr kept for the log checks."""

    count = 0

    def __init__(self, sdrun, plan, *flags):
        Server.count += 1
        self.log_path = os.path.join(os.path.dirname(plan), f"serve{Server.count}.log")
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen([sdrun, "serve", plan, "--port", "0", "--threads", "2", *flags],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.port is None:
            m = re.search(r"on http://[^ ]*:(\d+)/v1", open(self.log_path).read())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                raise RuntimeError("sdrun serve exited: " + open(self.log_path).read()[-400:])
            else:
                time.sleep(0.05)
        if self.port is None:
            raise RuntimeError("sdrun serve did not start")
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def client(self, key="none"):
        import openai
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)

    def text(self):
        return open(self.log_path).read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "hung"
        self.log.close()
        return rc


class Replies:
    """HTTP responses read off one connection in turn (a kept connection
    carries several): by Content-Length, chunks, or up to the close."""

    def __init__(self, sock):
        self.sock, self.buf, self.closed = sock, b"", False

    def _more(self):
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            chunk = b""
        self.closed = not chunk
        self.buf += chunk
        return bool(chunk)

    def _until(self, mark):
        while mark not in self.buf:
            if not self._more():
                return None
        part, _, self.buf = self.buf.partition(mark)
        return part

    def _take(self, n):
        while len(self.buf) < n and self._more():
            pass
        part, self.buf = self.buf[:n], self.buf[n:]
        return part

    def next(self):
        """(status, headers with lower-cased names, body); interim 1xx skipped; status None at a close."""
        while True:
            head = self._until(b"\r\n\r\n")
            if head is None:
                return None, {}, self.buf.decode("utf-8", "replace")
            lines = head.split(b"\r\n")
            m = re.match(rb"HTTP/1\.1 (\d+)", lines[0])
            status = int(m.group(1)) if m else None
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.decode("latin-1").partition(":") for line in lines[1:])}
            if status is None or status >= 200:
                break
        if "content-length" in headers:
            body = self._take(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while (size := self._until(b"\r\n")) not in (None, b"0"):
                body += self._take(int(size, 16))
                self._take(2)
            self._take(2)
        else:
            while self._more():
                pass
            body, self.buf = self.buf, b""
        return status, headers, body.decode("utf-8", "replace")


def raw(port, data, read=True, timeout=10):
    """Sends bytes as they are; the status code and body of the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return None, ""
        status, _, body = Replies(s).next()
    return status, body


def post(port, path, body, extra=b""):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return raw(port, b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
               b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


def error_of(status, body):
    try:
        return status, json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return status, f"not an OpenAI error body: {body[:200]!r}"


def greedy(model, ids, new, eos=None):
    import torch
    with torch.no_grad():
        # Every position attended: the prompt's <unk> (id 0, the pad id) is a token here, not padding.
        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)[0].tolist()
    return out[len(ids):]


def generate_cli(sdrun, plan, prompt, new, *flags):
    r = subprocess.run([sdrun, "generate", plan, "--prompt", prompt, "--max-new-tokens", str(new), "--temperature", "0",
                        "--threads", "2", *flags], capture_output=True, timeout=120)
    return r.stdout.decode("utf-8", "replace") if r.returncode == 0 else "error: " + r.stderr.decode()[-300:]


def completions(srv, lib, model, sdrun, plan, tok, eos):
    client = srv.client()
    prompt = PROMPTS[0]
    ids = lib.encode(prompt).ids
    want_ids = greedy(model, ids, 12)
    want = lib.decode(ids + want_ids, skip_special_tokens=True)[len(lib.decode(ids, skip_special_tokens=True)):]
    r = client.completions.create(model="llama", prompt=prompt, max_tokens=12, temperature=0)
    check("completions: greedy text equals transformers' generate on the same weights, finish_reason length, usage "
          "counts", r.choices[0].text == want and r.choices[0].finish_reason == "length" and
          (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 12, len(ids) + 12),
          f"{r.choices[0].text!r} vs {want!r}, {r.choices[0].finish_reason}, {r.usage}")
    cli = generate_cli(sdrun, plan, prompt, 12, "--tokenizer", tok)
    check("completions: the same text as sdrun generate --tokenizer", cli == prompt + r.choices[0].text + "\n",
          f"{cli!r}")
    default = client.completions.create(model="llama", prompt=prompt, temperature=0)
    check("completions: max_tokens defaults to OpenAI's 16", default.usage.completion_tokens == 16 and
          default.choices[0].text.startswith(want), f"{default.usage.completion_tokens} {default.choices[0].text!r}")

    parts = list(client.completions.create(model="llama", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    text = "".join(p.choices[0].text for p in parts if p.choices)
    finish = [p.choices[0].finish_reason for p in parts if p.choices and p.choices[0].finish_reason]
    check("completions stream: the deltas add up to the whole text, one finish_reason, then a usage chunk",
          text == want and finish == ["length"] and parts[-1].usage is not None and
          parts[-1].usage.completion_tokens == 12 and len(parts) > 3, f"{text!r}, {finish}, {len(parts)} chunks")

    # A stop text two tokens long that spans token boundaries: cut before it, and never streamed in part.
    stop = want[4:9]
    cut = want[:want.index(stop)]
    r = client.completions.create(model="llama", prompt=prompt, max_tokens=12, temperature=0, stop=[stop, "@@"])
    streamed = "".join(p.choices[0].text for p in client.completions.create(
        model="llama", prompt=prompt, max_tokens=12, temperature=0, stop=stop, stream=True) if p.choices)
    check("completions stop: the text ends before the first stop text, finish_reason stop, also streamed",
          r.choices[0].text == cut and r.choices[0].finish_reason == "stop" and streamed == cut,
          f"stop {stop!r}: {r.choices[0].text!r}, streamed {streamed!r}, want {cut!r}")

    # The start of a stop text that never comes is held back, then given at the end.
    never = want[-2:] + "\u2603"
    r = client.completions.create(model="llama", prompt=prompt, max_tokens=12, temperature=0, stop=never)
    streamed = "".join(p.choices[0].text for p in client.completions.create(
        model="llama", prompt=prompt, max_tokens=12, temperature=0, stop=never, stream=True) if p.choices)
    check("completions stop: text held back as the possible start of a stop text is given when the choice ends "
          "without it", r.choices[0].text == want == streamed and r.choices[0].finish_reason == "length",
          f"stop {never!r}: {r.choices[0].text!r}, streamed {streamed!r}")

    r = client.completions.create(model="llama", prompt=ids, max_tokens=12, temperature=0, echo=True)
    check("completions: a prompt of token ids equals its text; echo puts the prompt before the text",
          r.choices[0].text == lib.decode(ids, skip_special_tokens=True) + want, f"{r.choices[0].text!r}")
    r = client.completions.create(model="llama", prompt=PROMPTS[:3], max_tokens=6, temperature=0)
    singles = [client.completions.create(model="llama", prompt=p, max_tokens=6, temperature=0).choices[0].text
               for p in PROMPTS[:3]]
    check("completions: a list of prompts gives a choice each, in order, each as when sent alone",
          [c.text for c in r.choices] == singles and [c.index for c in r.choices] == [0, 1, 2],
          f"{[c.text for c in r.choices]} vs {singles}")

    # EOS: generation_config.json's eos_token_id naming the third greedy token.
    with_eos = os.path.join(os.path.dirname(tok), "tok_eos")
    shutil.copytree(tok, with_eos, dirs_exist_ok=True)
    at = next(i for i in range(1, len(want_ids)) if want_ids[i] not in want_ids[:i])
    with open(os.path.join(with_eos, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos, want_ids[at]]}, f)
    return with_eos, at, want_ids


def logprobs(srv, lib, model):
    """Log-probabilities of the model's own distribution against transformers' log-softmax: each generated
    token's with the likeliest; an echoed prompt scored with max_tokens 0 (what lm-evaluation-harness asks a
    server for its loglikelihood tasks); chat's content list; streamed chunks add up to the whole."""
    import torch
    client = srv.client()
    prompt = PROMPTS[2]
    ids = lib.encode(prompt).ids
    r = client.completions.create(model="llama", prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    with torch.no_grad():
        full = ids + greedy(model, ids, 6)
        logp = torch.log_softmax(model(input_ids=torch.tensor([full]),
                                       attention_mask=torch.ones(1, len(full), dtype=torch.long)).logits[0].double(), -1)
    want = [logp[len(ids) - 1 + i, full[len(ids) + i]].item() for i in range(6)]
    got = r.choices[0].logprobs.token_logprobs
    gap = max(abs(a - b) for a, b in zip(got, want))
    tops = r.choices[0].logprobs.top_logprobs
    top_ok = all(len(t) == 3 and max(t.values()) == t[tok] for t, tok in zip(tops, r.choices[0].logprobs.tokens))
    offsets = r.choices[0].logprobs.text_offset
    check("logprobs: each greedy token's log-probability equals transformers' log-softmax (raw logits), the drawn "
          "token the likeliest of the top 3, text_offset counting the tokens' text",
          len(got) == 6 and gap < 1e-4 and top_ok and offsets[0] == 0 and
          "".join(r.choices[0].logprobs.tokens) == r.choices[0].text and
          all(offsets[i + 1] - offsets[i] == len(r.choices[0].logprobs.tokens[i]) for i in range(5)),
          f"gap {gap:.2e}, tokens {r.choices[0].logprobs.tokens}, tops {tops[:2]}")
    e = client.completions.create(model="llama", prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = e.choices[0].logprobs
    want_prompt = [logp[j - 1, ids[j]].item() for j in range(1, len(ids))]
    gap = max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], want_prompt))
    check("logprobs: echo with max_tokens 0 scores the prompt (the first token null), generates nothing, as "
          "lm-evaluation-harness asks", e.choices[0].text == prompt and lp.token_logprobs[0] is None and
          len(lp.token_logprobs) == len(ids) and gap < 1e-4 and e.usage.completion_tokens == 0,
          f"{e.choices[0].text!r}, {len(lp.token_logprobs)} vs {len(ids)}, gap {gap:.2e}, {e.usage}")
    e2 = client.completions.create(model="llama", prompt=prompt, max_tokens=2, echo=True, logprobs=0, temperature=0)
    lp2 = e2.choices[0].logprobs
    check("logprobs: echo with new tokens: the prompt's scores, then the new tokens'",
          len(lp2.token_logprobs) == len(ids) + 2 and max(abs(a - b) for a, b in zip(
              lp2.token_logprobs[1:], want_prompt + want[:2])) < 1e-4, f"{lp2.token_logprobs}")
    streamed = []
    for p in client.completions.create(model="llama", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                       stream=True):
        if p.choices and p.choices[0].logprobs:
            streamed += p.choices[0].logprobs.token_logprobs
    check("logprobs: streamed chunks carry their tokens' log-probabilities, adding up to the whole",
          streamed == got, f"{streamed} vs {got}")
    c = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": prompt}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    check("logprobs: chat's content list, a token's bytes and its 2 likeliest",
          len(content) == 4 and all(len(x.top_logprobs) == 2 and bytes(x.bytes) == x.token.encode() and
                                    x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob for x in content) and
          "".join(x.token for x in content).strip() == c.choices[0].message.content.strip(),
          f"{[(x.token, round(x.logprob, 3)) for x in content]}")
    return lp.token_logprobs


def penalties(srv, lib, model):
    """OpenAI's presence and frequency penalties over the generated tokens and logit_bias, greedy, against the
    same rule applied to transformers' logits step by step."""
    import torch
    client = srv.client()
    ids = lib.encode(PROMPTS[3]).ids
    seq, counts = list(ids), {}
    with torch.no_grad():
        for _ in range(12):
            logits = model(input_ids=torch.tensor([seq]), attention_mask=torch.ones(1, len(seq), dtype=torch.long)
                           ).logits[0, -1].double()
            for t, c in counts.items():
                logits[t] -= 1.5 * c + 0.5
            logits[7] += 3.0
            t = int(torch.argmax(logits))
            counts[t] = counts.get(t, 0) + 1
            seq.append(t)
    want = lib.decode(seq, skip_special_tokens=True)[len(lib.decode(ids, skip_special_tokens=True)):]
    r = client.completions.create(model="llama", prompt=PROMPTS[3], max_tokens=12, temperature=0,
                                  frequency_penalty=1.5, presence_penalty=0.5, logit_bias={"7": 3})
    plain = client.completions.create(model="llama", prompt=PROMPTS[3], max_tokens=12, temperature=0)
    check("frequency_penalty 1.5, presence_penalty 0.5 and logit_bias: greedy text equals the rule applied to "
          "transformers' logits step by step, and differs from plain greedy",
          r.choices[0].text == want and want != plain.choices[0].text,
          f"{r.choices[0].text!r} vs {want!r} (plain {plain.choices[0].text!r})")
    forced = client.completions.create(model="llama", prompt=PROMPTS[3], max_tokens=5, temperature=1.0, seed=1,
                                       logit_bias={"50": 100}, logprobs=0)
    check("logit_bias 100 on a token makes every sampled token that one (logprobs still the model's own)",
          forced.choices[0].text == lib.decode([50] * 5) and
          all(lp < -1 for lp in forced.choices[0].logprobs.token_logprobs),
          f"{forced.choices[0].text!r} {forced.choices[0].logprobs.token_logprobs}")


def sampling(srv):
    client = srv.client()
    kw = dict(model="llama", prompt=PROMPTS[1], max_tokens=10, temperature=1.0, seed=11)
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    greedy_text = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=10, temperature=0)
    # The same seeded request beside another running request: a row's draws are its own.
    results = {}

    def run(name, **kws):
        results[name] = client.completions.create(**kws).choices[0].text
    t1 = threading.Thread(target=run, args=("seeded",), kwargs=kw)
    t2 = threading.Thread(target=run, args=("other",), kwargs=dict(model="llama", prompt=PROMPTS[2], max_tokens=30,
                                                                   temperature=1.0))
    t2.start()
    t1.start()
    t1.join()
    t2.join()
    check("sampling: a seeded request gives the same text again, alone or beside another request, and differs from "
          "greedy", a == b == results["seeded"] and a != greedy_text.choices[0].text,
          f"{a!r} {b!r} {results['seeded']!r} greedy {greedy_text.choices[0].text!r}")
    n = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=10, temperature=1.0, n=3, seed=5)
    check("sampling: n=3 gives three choices, not all the same", len(n.choices) == 3 and
          len({c.text for c in n.choices}) > 1 and n.usage.completion_tokens == 30,
          f"{[c.text for c in n.choices]} {n.usage}")
    t = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=10, temperature=1.5, top_p=1e-6,
                                  seed=3)
    k = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=10, temperature=1.5, seed=3,
                                  extra_body={"top_k": 1})
    check("sampling: top_p 1e-6 and vLLM's top_k 1 keep only the likeliest token, so they are greedy",
          t.choices[0].text == k.choices[0].text == greedy_text.choices[0].text, f"{t.choices[0].text!r}")


def concurrent(srv):
    """Six clients at once on a plan of 2 rows: each gets what it gets alone."""
    client = srv.client()
    alone = [client.completions.create(model="llama", prompt=p, max_tokens=8 + 3 * i, temperature=0).choices[0].text
             for i, p in enumerate(PROMPTS)]
    alone += [client.chat.completions.create(model="llama", messages=[{"role": "user", "content": p}], max_tokens=7,
                                             temperature=0).choices[0].message.content for p in PROMPTS[:2]]
    got = [None] * 6

    def run(i):
        if i < 4:
            got[i] = client.completions.create(model="llama", prompt=PROMPTS[i], max_tokens=8 + 3 * i,
                                               temperature=0).choices[0].text
        else:
            got[i] = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": PROMPTS[i - 4]}],
                                                    max_tokens=7, temperature=0).choices[0].message.content
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("six concurrent clients (completions and chats of different lengths) share the plan's 2 rows; each gets "
          "the text it gets alone", got == alone, f"{got} vs {alone}")


def chat(srv, lib, model, sdrun, plan, tok):
    from chat_templates import MISTRAL
    from transformers.utils.chat_template_utils import render_jinja_template
    client = srv.client()
    messages = [{"role": "user", "content": "Who made the light?"}, {"role": "assistant", "content": "God did."},
                {"role": "user", "content": PROMPTS[2]}]
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=MISTRAL, add_generation_prompt=True,
                                        bos_token="<s>", eos_token="</s>")
    ids = lib.encode(rendered[0], add_special_tokens=False).ids
    want_ids = greedy(model, ids, 10)
    want = lib.decode(want_ids, skip_special_tokens=True)
    r = client.chat.completions.create(model="llama", messages=messages, max_tokens=10, temperature=0)
    check("chat: greedy reply equals transformers' generate on apply_chat_template's ids (Mistral's template), the "
          "new tokens decoded alone; usage counts the rendered prompt", r.choices[0].message.content == want and
          r.choices[0].message.role == "assistant" and r.usage.prompt_tokens == len(ids),
          f"{r.choices[0].message.content!r} vs {want!r}, {r.usage}")
    one = client.chat.completions.create(model="llama", messages=[{"role": "user", "content": PROMPTS[0]}],
                                         max_completion_tokens=9, temperature=0).choices[0].message.content
    cli = generate_cli(sdrun, plan, PROMPTS[0], 9, "--tokenizer", tok, "--chat")
    check("chat: a one-turn reply equals sdrun generate --chat", cli == one + "\n", f"{one!r} vs {cli!r}")
    chunks = list(client.chat.completions.create(model="llama", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    first = chunks[0].choices[0].delta
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check("chat stream: the first chunk carries the assistant role, the deltas add up to the reply, the last "
          "carries finish_reason", first.role == "assistant" and text == want and
          chunks[-1].choices[0].finish_reason == "length", f"{first} {text!r}")
    parts = client.chat.completions.create(
        model="llama", temperature=0, max_tokens=10,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Who made"}, {"type": "text", "text": "it?"}]}])
    joined = client.chat.completions.create(model="llama", temperature=0, max_tokens=10,
                                            messages=[{"role": "user", "content": "Who made\nit?"}])
    check("chat: text content parts are joined by newlines", parts.choices[0].message.content ==
          joined.choices[0].message.content, parts.choices[0].message.content)


def errors(srv):
    import openai
    client = srv.client()
    port = srv.port

    def api_error(name, call, kind, must):
        try:
            call()
            check(name, False, "no error")
        except kind as e:
            msg = f"{e} (code {e.code})"
            check(name, all(m in msg for m in must), msg[:300])
        except Exception as e:  # noqa: BLE001
            check(name, False, f"{type(e).__name__}: {str(e)[:300]}")

    api_error("error: a field the server does not implement (prediction) is a 400 naming it",
              lambda: client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "x"}],
                                                     prediction={"type": "content", "content": "x"}),
              openai.BadRequestError, ["prediction", "not supported"])
    api_error("error: a logit_bias naming a token outside the vocabulary is a 400",
              lambda: client.completions.create(model="llama", prompt="x", logit_bias={"99999": 5}),
              openai.BadRequestError, ["logit_bias", "99999"])
    api_error("error: presence_penalty outside [-2, 2] is a 400",
              lambda: client.completions.create(model="llama", prompt="x", presence_penalty=3),
              openai.BadRequestError, ["'presence_penalty'"])
    api_error("error: top_logprobs without logprobs is a 400",
              lambda: client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "x"}],
                                                     top_logprobs=2), openai.BadRequestError, ["top_logprobs"])
    api_error("error: tools in a chat request are a 400 naming them",
              lambda: client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "x"}],
                                                     tools=[{"type": "function", "function": {"name": "f"}}]),
              openai.BadRequestError, ["tools"])
    api_error("error: another model's name is a 404 model_not_found",
              lambda: client.completions.create(model="gpt-4", prompt="x"), openai.NotFoundError,
              ["gpt-4", "model_not_found"])
    api_error("error: max_tokens beyond the context is a 400 saying how many fit",
              lambda: client.completions.create(model="llama", prompt="x", max_tokens=500), openai.BadRequestError,
              ["context is 96", "max_tokens 500"])
    api_error("error: a prompt longer than the context is a 400",
              lambda: client.completions.create(model="llama", prompt=" ".join(PROMPTS * 8)), openai.BadRequestError,
              ["the prompt is", "context is 96"])
    api_error("error: temperature out of range is a 400 naming it",
              lambda: client.completions.create(model="llama", prompt="x", temperature=7), openai.BadRequestError,
              ["'temperature'"])
    api_error("error: a token id outside the vocabulary is a 400",
              lambda: client.completions.create(model="llama", prompt=[5, 99999]), openai.BadRequestError,
              ["99999", "vocabulary"])
    api_error("error: a message role the template does not know is a 400",
              lambda: client.chat.completions.create(model="llama", messages=[{"role": "wizard", "content": "x"}]),
              openai.BadRequestError, ["wizard"])
    api_error("error: the chat template's own raise_exception (roles not alternating) is a 400 with its message",
              lambda: client.chat.completions.create(model="llama", messages=[{"role": "assistant", "content": "x"}]),
              openai.BadRequestError, ["alternate"])

    cases = [
        ("malformed JSON", post(port, "/v1/completions", b'{"prompt": "x",'), 400, "invalid JSON"),
        ("a body that is not an object", post(port, "/v1/completions", b'[1, 2]'), 400, "JSON object"),
        ("no prompt", post(port, "/v1/completions", {"max_tokens": 3}), 400, "'prompt' is required"),
        ("an unknown route", raw(port, b"GET /v2/things HTTP/1.1\r\nHost: x\r\n\r\n"), 404, "no route"),
        ("GET on a POST route", raw(port, b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"), 405, "takes POST"),
        ("a malformed request line", raw(port, b"HELLO\r\n\r\n"), 400, "request line"),
        ("HTTP/2's preface", raw(port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 505, "HTTP/1.1"),
        ("a malformed header", raw(port, b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n"), 400, "header"),
        ("a bad Content-Length", raw(port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n"), 400,
         "Content-Length"),
        ("an oversized body", raw(port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n"), 413,
         "999999999"),
        ("a chunked body", raw(port, b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
         501, "Content-Length"),
        ("headers past 64 KiB", raw(port, b"GET /health HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n"), 431,
         "headers"),
    ]
    for name, (status, body), want_status, must in cases:
        got_status, msg = error_of(status, body)
        check(f"error: {name} is a {want_status} with a JSON error", got_status == want_status and must in msg,
              f"{got_status}: {msg}")
    # A client that sends half a request and stalls gets 408 after --request-timeout (2 s here).
    t0 = time.time()
    status, body = raw(port, b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{", timeout=20)
    check("error: a stalled client gets 408 after --request-timeout, and the server serves others meanwhile",
          status == 408 and time.time() - t0 < 10, f"{status} after {time.time() - t0:.1f} s: {body[:100]}")
    # A client gone mid-stream: its request is cancelled, the next one is served.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # 16 x 80 tokens: long enough to see it go
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 80, "n": 16, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.recv(200)
    r = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=4, temperature=0)
    time.sleep(0.3)
    check("a client gone mid-stream: its request is cancelled (logged) and the next is served",
          r.usage.completion_tokens == 4 and "request cancelled" in srv.text(), srv.text()[-300:])
    # Expect: 100-continue (curl's for bodies over 1 KiB) is answered before the body comes.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        body = json.dumps({"prompt": "x" * 10, "max_tokens": 2, "temperature": 0}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n")
        interim = s.recv(100)
        s.sendall(body)
        rest = b""
        while chunk := s.recv(65536):
            rest += chunk
    check("Expect: 100-continue gets 100 Continue, then the response", interim.startswith(b"HTTP/1.1 100") and
          b"HTTP/1.1 200" in rest, f"{interim[:40]!r} {rest[:40]!r}")
    status, text = raw(port, b"GET /metrics HTTP/1.1\r\n\r\n")
    values = dict(re.findall(r"^(sdrun_[a-z_]+(?:\{[^}]*\})?) (\d+)$", text, re.M))
    check("GET /metrics: Prometheus counters of responses by status, tokens, and each model's running and waiting "
          "choices", status == 200 and int(values.get('sdrun_responses_total{status="200"}', 0)) > 20 and
          int(values.get('sdrun_responses_total{status="400"}', 0)) >= 10 and
          int(values.get("sdrun_generation_tokens_total", 0)) > 200 and
          values.get('sdrun_choices_running{model="llama"}') == "0" and
          values.get('sdrun_choices_waiting{model="llama"}') == "0", text[:300])
    health = raw(port, b"GET /health HTTP/1.1\r\n\r\n")
    models = client.models.list()
    check("after all that the server still serves (/health, /v1/models)", health[0] == 200 and
          [m.id for m in models.data] == ["llama"], f"{health} {models}")


def request(path, body=None, extra=b"", version=b"HTTP/1.1"):
    data = b"" if body is None else json.dumps(body).encode()
    return ((b"POST " if body is not None else b"GET ") + path.encode() + b" " + version + b"\r\nHost: x\r\n" + extra +
            (b"Content-Length: " + str(len(data)).encode() + b"\r\n" if body is not None else b"") + b"\r\n" + data)


def keep_alive(srv):
    """Connections stay open for the next request (HTTP/1.1's default), as
    the openai client's pool expects; pipelined requests are answered in
    turn; streams are chunked so a connection outlives them; HTTP/1.0 and
    Connection: close are closed after their response."""
    client = srv.client()
    port = srv.port

    def connections():
        _, text = raw(port, b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        m = re.search(r"^sdrun_connections_total (\d+)$", text, re.M)
        return int(m.group(1)) if m else -1
    alone = [client.completions.create(model="llama", prompt=p, max_tokens=3, temperature=0).choices[0].text
             for p in PROMPTS[:2]]
    before = connections()
    for _ in range(5):
        client.completions.create(model="llama", prompt=PROMPTS[0], max_tokens=2, temperature=0)
    after = connections()
    check("keep-alive: the openai client's five requests in a row open no connection (its pooled one stays open)",
          after - before == 1, f"{after - before - 1} new connections for 5 requests")  # 1: the /metrics read itself
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        replies = Replies(s)
        s.sendall(request("/health"))
        first = replies.next()
        s.sendall(request("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0}))
        second = replies.next()
        # Two requests in one write (pipelined): answered in order.
        s.sendall(request("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0}) +
                  request("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 3, "temperature": 0}))
        third, fourth = replies.next(), replies.next()
        s.sendall(request("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 4, "stream": True,
                                              "temperature": 0}))
        stream = replies.next()
        s.sendall(request("/health"))
        after_stream = replies.next()
    texts = [json.loads(r[2])["choices"][0]["text"] if r[0] == 200 else r for r in (second, third, fourth)]
    check("keep-alive: one connection carries a request after another, and two pipelined ones answered in order",
          first[0] == 200 and first[1].get("connection") == "keep-alive" and texts == [alone[0], alone[0], alone[1]],
          f"{first[:2]} {texts} vs {alone}")
    check("keep-alive: a stream is sent chunked, ends with [DONE], and the connection then serves the next request",
          stream[1].get("transfer-encoding") == "chunked" and stream[2].endswith("data: [DONE]\n\n") and
          after_stream[0] == 200, f"{stream[1]} {stream[2][-40:]!r} {after_stream[:2]}")
    for name, data in [("HTTP/1.0", request("/health", version=b"HTTP/1.0")),
                       ("Connection: close", request("/health", extra=b"Connection: close\r\n"))]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
            replies = Replies(s)
            status, headers, _ = replies.next()
            replies._more()
            check(f"keep-alive: a request with {name} is answered and its connection closed",
                  status == 200 and headers.get("connection") == "close" and replies.closed, f"{status} {headers}")


def lora_models(sdc, sdrun, onnx_path, tok, tmp, servers):
    """--lora-modules: two trained adapters and the base model from one server, each as sdrun generate --adapter
    gives it, also when their requests run at once."""
    import numpy as np
    from e2e_util import write_token_rows
    lora = os.path.join(tmp, "lora.sdp")
    subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj,v_proj", "--shapes",
                    "input_ids=2x16", "--kv-cache", "96", "--kv-batch", "2", "-o", lora], check=True, capture_output=True)
    adapters = {}
    for name, seed in (("first", 1), ("second", 2)):
        data, adapters[name] = os.path.join(tmp, f"{name}.jsonl"), os.path.join(tmp, f"adapter_{name}")
        write_token_rows(data, np.random.default_rng(seed), 256, 16, 16)
        subprocess.run([sdrun, "train", lora, "--data", data, "--steps", "6", "--lr", "3e-2", "--save-adapter",
                        adapters[name]], check=True, capture_output=True)
    srv = Server(sdrun, lora, "--tokenizer", tok, "--served-model-name", "base", "--lora-modules",
                 f"first={adapters['first']}", "--lora-modules", f"second={adapters['second']}")
    servers.append(srv)
    client = srv.client()
    names = [m.id for m in client.models.list().data]
    want, alone = {}, {}
    for model, flags in (("base", []), ("first", ["--adapter", adapters["first"]]),
                         ("second", ["--adapter", adapters["second"]])):
        cli = generate_cli(sdrun, lora, PROMPTS[0], 10, "--tokenizer", tok, *flags)
        want[model] = cli[len(PROMPTS[0]):-1]
        alone[model] = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=10,
                                                 temperature=0).choices[0].text
    check("--lora-modules: /v1/models lists the base model and each adapter; each answers as sdrun generate "
          "--adapter does, and the three differ", names == ["base", "first", "second"] and alone == want and
          len(set(want.values())) == 3, f"{names} {alone} vs {want}")
    got = {}

    def run(model, k):
        got[(model, k)] = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=10,
                                                    temperature=0).choices[0].text
    threads = [threading.Thread(target=run, args=(m, k)) for m in want for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check("--lora-modules: six requests to three models at once each get their model's text",
          all(got[(m, k)] == want[m] for m in want for k in range(2)), f"{got}")
    srv.stop()
    for name, spec, must in [("without NAME=", "first", ["NAME=ADAPTER_DIR"]),
                             ("a missing adapter", f"gone={os.path.join(tmp, 'gone')}", ["gone"]),
                             ("a name taken twice", f"base={adapters['first']}", ["'base'", "twice"])]:
        problems, line = clean_error_problems([sdrun, "serve", lora, "--served-model-name", "base", "--port", "0",
                                               "--lora-modules", spec], must)
        check(f"bad input: --lora-modules {name} is a one-line error", not problems, "; ".join(problems) or line)


def genesis_tokenizer(folder):
    """test_tokenizer's small BPE trained on Genesis (KJV), saved in `folder`; the tokenizers library's object."""
    from test_tokenizer import small_tokenizer
    texts = subprocess.run(["bible", "Gen1:1-Gen50:26"], capture_output=True, text=True, check=True).stdout
    return small_tokenizer(texts.splitlines()[:3000], folder)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_serve_")
    servers = []
    try:
        tok = os.path.join(tmp, "tok")
        lib = genesis_tokenizer(tok)
        eos = lib.token_to_id("</s>")
        onnx_path = os.path.join(tmp, "llama.onnx")
        export(build("llama", 0), onnx_path, 17, 2, 16)
        model = build("llama", 0)  # the reference (the export patches its model's forward)
        plan, windowed = os.path.join(tmp, "llama.sdp"), os.path.join(tmp, "window.sdp")
        subprocess.run([sdc, "compile", onnx_path, "--kv-cache", "96", "--kv-batch", "2", "--prefill-chunk", "8",
                        "-o", plan], check=True, capture_output=True)
        subprocess.run([sdc, "compile", onnx_path, "--shapes", "input_ids=1x32", "-o", windowed], check=True,
                       capture_output=True)

        srv = Server(sdrun, plan, "--tokenizer", tok, "--served-model-name", "llama", "--request-timeout", "2")
        servers.append(srv)
        with_eos, at, want_ids = completions(srv, lib, model, sdrun, plan, tok, eos)
        prompt_scores = logprobs(srv, lib, model)
        penalties(srv, lib, model)
        sampling(srv)
        concurrent(srv)
        chat(srv, lib, model, sdrun, plan, tok)
        keep_alive(srv)
        errors(srv)
        rc = srv.stop()
        log = srv.text()
        check("SIGTERM stops the server: exit 0, 'stopped' logged; each request logged in one line with its tokens",
              rc == 0 and "sdrun: serve: stopped" in log and
              re.search(r"POST /v1/completions 200 \(1 choice, \d+ prompt \+ 12 completion tokens", log),
              f"rc {rc}: {log[-300:]}")

        srv = Server(sdrun, plan, "--tokenizer", with_eos, "--served-model-name", "llama")
        servers.append(srv)
        r = srv.client().completions.create(model="llama", prompt=PROMPTS[0], max_tokens=12, temperature=0)
        want = lib.decode(lib.encode(PROMPTS[0]).ids + want_ids[:at], skip_special_tokens=True)[
            len(lib.decode(lib.encode(PROMPTS[0]).ids, skip_special_tokens=True)):]
        check("an eos_token_id of generation_config.json ends the choice before it: finish_reason stop, the EOS "
              "counted in usage", r.choices[0].text == want and r.choices[0].finish_reason == "stop" and
              r.usage.completion_tokens == at + 1, f"{r.choices[0].text!r} vs {want!r} {r.usage}")
        srv.stop()

        plain_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        chatml = os.path.join(tmp, "plain.jinja")
        with open(chatml, "w") as f:
            f.write(plain_template)
        srv = Server(sdrun, windowed, "--tokenizer", tok, "--api-key", "sesame", "--chat-template", chatml,
                     "--keep-alive", "1")
        servers.append(srv)
        ids = lib.encode(PROMPTS[1]).ids
        want_w = greedy(model, ids, 10)
        want_text = lib.decode(ids + want_w, skip_special_tokens=True)[len(lib.decode(ids, skip_special_tokens=True)):]
        r = srv.client("sesame").completions.create(model="window", prompt=PROMPTS[1], max_tokens=10, temperature=0)
        check("a plan without a cache (the infer entry's 32-token window; the model named after the plan file) "
              "equals transformers' greedy text", r.choices[0].text == want_text, f"{r.choices[0].text!r} vs "
              f"{want_text!r}")
        e = srv.client("sesame").completions.create(model="window", prompt=PROMPTS[2], max_tokens=0, echo=True,
                                                    logprobs=0)
        gap = max(abs(a - b) for a, b in zip(e.choices[0].logprobs.token_logprobs[1:], prompt_scores[1:]))
        check("a plan without a cache scores an echoed prompt as the cached plan does", gap < 1e-5 and
              len(e.choices[0].logprobs.token_logprobs) == len(prompt_scores), f"gap {gap:.2e}")
        from transformers.utils.chat_template_utils import render_jinja_template
        turn = [{"role": "user", "content": "Who made the light?"}]
        rendered, _ = render_jinja_template(conversations=[turn], chat_template=plain_template,
                                            add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
        c = srv.client("sesame").chat.completions.create(model="window", messages=turn, max_tokens=4, temperature=0)
        from chat_templates import MISTRAL
        own, _ = render_jinja_template(conversations=[turn], chat_template=MISTRAL, add_generation_prompt=True,
                                       bos_token="<s>", eos_token="</s>")
        want_count = len(lib.encode(rendered[0], add_special_tokens=False).ids)
        check("--chat-template FILE renders chats with that template instead of the tokenizer's (Mistral's)",
              c.usage.prompt_tokens == want_count != len(lib.encode(own[0], add_special_tokens=False).ids),
              f"{c.usage.prompt_tokens} vs {want_count}")
        import openai
        try:
            srv.client("wrong").completions.create(model="window", prompt="x", max_tokens=2)
            check("--api-key: a wrong key is a 401", False, "served")
        except openai.AuthenticationError as e:
            check("--api-key: a wrong key is a 401", "API key" in str(e), str(e)[:200])
        status, _ = raw(srv.port, b"GET /health HTTP/1.1\r\n\r\n")
        check("--api-key: /health needs no key", status == 200, str(status))
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(request("/health"))
            replies = Replies(s)
            first = replies.next()
            t0 = time.time()
            replies._more()
            idle = time.time() - t0
        check("--keep-alive 1: an idle kept connection is closed after about a second, without a response",
              first[0] == 200 and replies.closed and 0.5 < idle < 5 and not replies.buf, f"{first[:2]} {idle:.2f} s")
        srv.stop()

        srv = Server(sdrun, plan, "--keep-alive", "0")
        servers.append(srv)
        prompt = "Let there be"
        r = srv.client().completions.create(model="llama", prompt=prompt, max_tokens=10, temperature=0)
        cli = subprocess.run([sdrun, "generate", plan, "--prompt", prompt, "--max-new-tokens", "10", "--temperature",
                              "0", "--threads", "2"], capture_output=True, timeout=120).stdout
        want = cli[len(prompt):-1].decode("utf-8", "replace")
        check("byte-level model without --tokenizer: the text is sdrun generate's bytes, invalid UTF-8 as U+FFFD",
              r.choices[0].text == want and r.usage.prompt_tokens == len(prompt), f"{r.choices[0].text!r} vs {want!r}")
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(request("/health"))
            replies = Replies(s)
            status, headers, _ = replies.next()
            replies._more()
        check("--keep-alive 0: every response closes its connection", status == 200 and
              headers.get("connection") == "close" and replies.closed, f"{status} {headers}")
        try:
            srv.client().chat.completions.create(model="llama", messages=[{"role": "user", "content": "x"}])
            check("byte-level model: chat is a 400 asking for --tokenizer", False, "served")
        except openai.BadRequestError as e:
            check("byte-level model: chat is a 400 asking for --tokenizer", "--tokenizer" in str(e), str(e)[:200])
        busy_port = srv.port
        problems, line = clean_error_problems([sdrun, "serve", plan, "--port", str(busy_port)], ["cannot listen",
                                                                                               str(busy_port)])
        check("bad input: a port in use is a one-line error", not problems, "; ".join(problems) or line)
        srv.stop()

        lora_models(sdc, sdrun, onnx_path, tok, tmp, servers)

        for name, cmd, must in [
            ("--port out of range", [sdrun, "serve", plan, "--port", "70000"], ["--port"]),
            ("a missing plan", [sdrun, "serve", os.path.join(tmp, "none.sdp")], ["none.sdp"]),
            ("a missing tokenizer", [sdrun, "serve", plan, "--tokenizer", os.path.join(tmp, "no_tok")], ["no_tok"]),
            ("a host that does not resolve", [sdrun, "serve", plan, "--host", "no.such.host.invalid", "--port", "0"],
             ["--host"]),
            ("an unknown flag", [sdrun, "serve", plan, "--max-batch", "4"], ["--max-batch"]),
            ("a missing --chat-template", [sdrun, "serve", plan, "--tokenizer", tok, "--chat-template",
                                           os.path.join(tmp, "none.jinja")], ["--chat-template", "none.jinja"]),
        ]:
            problems, line = clean_error_problems(cmd, must)
            check(f"bad input: {name} is a one-line error", not problems, "; ".join(problems) or line)
        r = subprocess.run([sdrun, "serve", "--help"], capture_output=True, text=True)
        check("sdrun serve --help lists the routes", r.returncode == 0 and "/v1/chat/completions" in r.stdout,
              r.stdout[:100])
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return report("serve")


if __name__ == "__main__":
    sys.exit(main())
