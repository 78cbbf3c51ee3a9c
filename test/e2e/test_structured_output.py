#!/usr/bin/env python3
"""Structured output: sdrun generate --json / --json-schema and sdrun serve's
response_format json_object / json_schema, on a tiny Llama. The reference is
xgrammar (the grammar engine vLLM and SGLang use) masking transformers'
logits step by step, with its JSON-schema grammar set to compact JSON (no
white space, "," and ":"): greedy text must equal it byte for byte, on the
byte-level model (multi-byte characters made of single-byte tokens) and with
a BPE tokenizer trained on JSON lines (tokens that span quotes, colons and
keys). Sampled choices (temperature, top-k, top-p, several seeds and n) must
each parse and follow the schema when they finish; streams add up; a schema
the server cannot follow is a 400 naming the keyword; bad flags and schema
files are one-line errors."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2e_util import tool_paths
from test_serve import Server, post
from test_training import check, clean_error, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))

# Enums, booleans, a nested list of objects, a union with null and a
# recursive $ref: what a random model can finish. No maxLength here: xgrammar
# bounds string lengths in UTF-8 bytes of a partial character differently
# (its masks differ from its own accept_string there), so lengths are checked
# with the ASCII tokenizer below.
PERSON = {
    "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", 7, None]},
                                                       "tame": {"type": "boolean"}},
                      "required": ["kind", "tame"], "additionalProperties": False}},
    "type": "object", "title": "Person",
    "properties": {"ok": {"type": "boolean"}, "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"},
                                                        "maxItems": 2},
                   "mood": {"anyOf": [{"type": "null"}, {"enum": ["glad", "sad"]}]},
                   "name": {"type": "string"}},
    "required": ["ok", "pets", "mood"], "additionalProperties": False}
SHORT = {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 6},
                                          "ok": {"type": "boolean"}, "n": {"type": "integer"}},
         "required": ["name", "ok"], "additionalProperties": False}


def follows(value, schema, defs):
    """Whether a parsed value follows a schema of the subset used here."""
    if "$ref" in schema:
        return follows(value, defs[schema["$ref"].split("/")[-1]], defs)
    if "anyOf" in schema:
        return any(follows(value, s, defs) for s in schema["anyOf"])
    if "enum" in schema:
        return any(value == e and type(value) is type(e) for e in schema["enum"])
    t = schema.get("type")
    if t == "object":
        props = schema.get("properties", {})
        keys = list(value) if isinstance(value, dict) else None
        return (keys is not None and all(k in keys for k in schema.get("required", [])) and
                keys == [k for k in props if k in keys] and all(follows(value[k], props[k], defs) for k in keys))
    if t == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", 1 << 30) and
                all(follows(v, schema["items"], defs) for v in value))
    if t == "string":
        return isinstance(value, str) and schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 1 << 30)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "null":
        return value is None
    return True


def valid(text, schema):
    try:
        return follows(json.loads(text), schema, schema.get("$defs", {}))
    except ValueError:
        return False


def xgrammar_greedy(model, info, grammar, ids, new, stop):
    """Greedy decoding of transformers' logits under xgrammar's token masks:
    the tokens until the grammar ends (a stop token or no byte may follow)."""
    import torch
    import xgrammar as xgr
    m = xgr.GrammarMatcher(grammar)
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    ids, out = list(ids), []
    for _ in range(new):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1:].clone()
        m.fill_next_token_bitmask(mask)
        xgr.apply_token_bitmask_inplace(logits, mask)
        t = int(logits[0].argmax())
        if t in stop:
            break
        assert m.accept_token(t)
        ids.append(t)
        out.append(t)
        if m.is_terminated():
            break
    return out


def compact_grammar(info, schema, strict=True):
    import xgrammar as xgr
    return xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                         separators=(",", ":"), strict_mode=strict)


def json_tokenizer(folder, words):
    """A 256-token SentencePiece-style BPE trained on compact JSON lines, so
    its tokens span keys, quotes and colons; </s> is its EOS."""
    import random
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from chat_templates import MISTRAL
    rng = random.Random(0)
    lines = [json.dumps({"name": rng.choice(words)[:6], "ok": rng.random() < 0.5, "n": rng.randint(-99, 999)},
                        separators=(",", ":")) for _ in range(3000)]
    lines += [json.dumps({"ok": rng.random() < 0.5, "pets": [{"kind": rng.choice(["cat", "dog"]), "tame": True}],
                          "mood": rng.choice([None, "glad", "sad"])}, separators=(",", ":")) for _ in range(1000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(lines + words[:2000], trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=90, show_progress=False))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "bos_token": "<s>", "chat_template": MISTRAL}, f)
    return tok


def token_info(lib, specials=("<unk>", "<s>", "</s>"), eos="</s>"):
    """xgrammar's vocabulary for the trained tokenizer: what each token adds
    mid-text (decoded after a plain token), special tokens as none."""
    import xgrammar as xgr
    lead = lib.token_to_id("a")
    base = lib.decode([lead])
    special_ids = {lib.token_to_id(t) for t in specials}
    vocab = [b"" if i in special_ids else lib.decode([lead, i])[len(base):].encode()
             for i in range(lib.get_vocab_size())]
    return xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=256, stop_token_ids=[lib.token_to_id(eos)])


def byte_level(sdc, sdrun, plan, model, tmp):
    import xgrammar as xgr
    info = xgr.TokenizerInfo([bytes([i]) for i in range(256)], vocab_type=xgr.VocabType.RAW, vocab_size=256,
                             stop_token_ids=[0])
    schema_path = os.path.join(tmp, "person.json")
    with open(schema_path, "w") as f:
        json.dump(PERSON, f)
    prompts = ["Person: ", "x", "{\"a\":"]
    for name, flags, grammar in [("--json-schema", ["--json-schema", schema_path], compact_grammar(info, PERSON)),
                                 ("--json", ["--json"], compact_grammar(info, {"type": "object"}, strict=False))]:
        args = [sdrun, "generate", plan, "--temperature", "0", "--max-new-tokens", "48", "--stop-token", "0",
                "--threads", "2", *flags]
        for p in prompts:
            args += ["--prompt", p]
        r = subprocess.run(args, capture_output=True, timeout=300)
        got = r.stdout.split(b"\n")[:len(prompts)]
        want = [p.encode() + bytes(xgrammar_greedy(model, info, grammar, list(p.encode()), 48, {0}))
                for p in prompts]
        check(f"byte-level model, sdrun generate {name}: greedy bytes equal xgrammar's masks on transformers' "
              "logits (3 prompts, 2 rows at a time, multi-byte characters from single-byte tokens)",
              r.returncode == 0 and got == want, f"{got!r} vs {want!r} {r.stderr.decode()[-300:]}")


def trained_tokenizer(sdrun, plan, model, tmp, servers):
    import openai
    words = subprocess.run(["bible", "Gen1:1-Gen11:32"], capture_output=True, text=True,
                           check=True).stdout.replace(",", " ").replace(".", " ").split()
    folder = os.path.join(tmp, "jtok")
    lib = json_tokenizer(folder, words)
    info = token_info(lib)
    eos = lib.token_to_id("</s>")
    spanning = [t for t in lib.get_vocab() if '"' in t and len(t) > 2]
    srv = Server(sdrun, plan, "--tokenizer", folder, "--served-model-name", "llama")
    servers.append(srv)
    client = srv.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "short", "schema": SHORT, "strict": True}}
    for prompt in ["A person:", "Noah"]:
        ids = lib.encode(prompt).ids
        want_ids = xgrammar_greedy(model, info, compact_grammar(info, SHORT), ids, 40, {eos})
        want = lib.decode(ids + want_ids)[len(lib.decode(ids)):]
        r = client.completions.create(model="llama", prompt=prompt, max_tokens=40, temperature=0,
                                      extra_body={"response_format": fmt})
        check(f"serve completions, json_schema with maxLength ({prompt!r}): greedy text equals xgrammar's on "
              f"transformers' logits through a tokenizer whose tokens span JSON ({len(spanning)} with quotes)",
              r.choices[0].text == want, f"{r.choices[0].text!r} vs {want!r}")
    # A pattern (anchored, as xgrammar reads every pattern) and a bounded one.
    coded = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{2,3}$"},
                                              "tag": {"type": "string", "pattern": "^(ok|no+)$"},
                                              "n": {"type": "integer", "minimum": -20, "maximum": 150},
                                              "ok": {"type": "boolean"}},
             "required": ["code", "tag", "n", "ok"], "additionalProperties": False}
    for prompt in ["A code:", "Noah"]:
        ids = lib.encode(prompt).ids
        want = lib.decode(ids + xgrammar_greedy(model, info, compact_grammar(info, coded), ids, 40, {eos}))[
            len(lib.decode(ids)):]
        r = client.completions.create(model="llama", prompt=prompt, max_tokens=40, temperature=0, extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "coded", "schema": coded}}})
        check(f"serve completions, json_schema with patterns and an integer range ({prompt!r}): greedy text equals "
              "xgrammar's",
              r.choices[0].text == want, f"{r.choices[0].text!r} vs {want!r}")
    # vLLM's guided fields (and its newer structured_outputs): a choice, a
    # whole-text regex, a schema; against xgrammar's regex and schema masks.
    import xgrammar as xgr
    comp = xgr.GrammarCompiler(info)
    for name, extra, grammar in [
            ("guided_choice", {"guided_choice": ["cat", "dog", "fish"]}, comp.compile_regex("(cat|dog|fish)")),
            ("structured_outputs regex", {"structured_outputs": {"regex": "[a-z]{2}-[0-9]{2,3}( ok)?"}},
             comp.compile_regex("[a-z]{2}-[0-9]{2,3}( ok)?")),
            ("guided_json", {"guided_json": SHORT}, compact_grammar(info, SHORT))]:
        for prompt in ["A person:", "Noah"]:
            ids = lib.encode(prompt).ids
            want = lib.decode(ids + xgrammar_greedy(model, info, grammar, ids, 30, {eos}))[len(lib.decode(ids)):]
            r = client.completions.create(model="llama", prompt=prompt, max_tokens=30, temperature=0, extra_body=extra)
            check(f"serve, vLLM's {name} ({prompt!r}): greedy text equals xgrammar's, finish_reason stop",
                  r.choices[0].text == want and r.choices[0].finish_reason == "stop",
                  f"{r.choices[0].text!r} vs {want!r} {r.choices[0].finish_reason}")
    for body, must in [({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "give one"),
                       ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs.grammar"),
                       ({"guided_regex": "(ab"}, "unclosed ("), ({"guided_choice": []}, "non-empty")]:
        status, text = post(srv.port, "/v1/completions", {"model": "llama", "prompt": "x", **body})
        check(f"serve refuses {json.dumps(body)[:60]}: 400 saying {must!r}", status == 400 and must in text,
              f"{status} {text[:200]}")
    turn = [{"role": "user", "content": "Describe a person as JSON."}]
    from transformers.utils.chat_template_utils import render_jinja_template
    from chat_templates import MISTRAL
    rendered, _ = render_jinja_template(conversations=[turn], chat_template=MISTRAL, add_generation_prompt=True,
                                        bos_token="<s>", eos_token="</s>")
    ids = lib.encode(rendered[0], add_special_tokens=False).ids
    want_ids = xgrammar_greedy(model, info, compact_grammar(info, PERSON), ids, 60, {eos})
    want = lib.decode(want_ids)
    c = client.chat.completions.create(model="llama", messages=turn, max_tokens=60, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "person", "schema": PERSON}})
    check("serve chat, json_schema ($ref, anyOf, enum, nested arrays): greedy reply equals xgrammar's",
          c.choices[0].message.content == want, f"{c.choices[0].message.content!r} vs {want!r}")
    want_obj = lib.decode(xgrammar_greedy(model, info, compact_grammar(info, {"type": "object"}, False), ids, 60,
                                          {eos}))
    c = client.chat.completions.create(model="llama", messages=turn, max_tokens=60, temperature=0,
                                       response_format={"type": "json_object"})
    check("serve chat, json_object: greedy reply equals xgrammar's (any object)",
          c.choices[0].message.content == want_obj, f"{c.choices[0].message.content!r} vs {want_obj!r}")

    # Draws: each finished choice parses and follows the schema.
    results = []
    for kws in [dict(temperature=1.0), dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, extra_body={"top_k": 8}),
                dict(temperature=1.5)]:
        extra = dict(kws.pop("extra_body", {}))
        extra["response_format"] = fmt
        r = client.completions.create(model="llama", prompt="A person:", max_tokens=60, n=4, seed=11, extra_body=extra,
                                      **kws)
        results += [(ch.text, ch.finish_reason, kws) for ch in r.choices]
    done = [t for t, reason, _ in results if reason == "stop"]
    check("serve, sampled json_schema choices (temperature 0.7-1.5, top_p, top_k; 16 choices): every finished one "
          "parses and follows the schema, and most finish within 60 tokens",
          len(done) >= 12 and all(valid(t, SHORT) for t in done) and len(set(done)) > 4,
          f"{len(done)} finished, {len(set(done))} distinct; {results[:3]}")
    parts, finish = [], None
    for chunk in client.chat.completions.create(model="llama", messages=turn, max_tokens=60, temperature=0, stream=True,
                                                response_format={"type": "json_schema",
                                                                 "json_schema": {"name": "person", "schema": PERSON}}):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    check("serve, a streamed json_schema chat adds up to the whole reply, finish_reason stop when it is whole",
          "".join(parts) == want and finish == ("stop" if valid(want, PERSON) else "length"),
          f"{''.join(parts)!r} {finish}")

    def refused(fmt_value, must, param):
        status, body = post(srv.port, "/v1/chat/completions", {"model": "llama", "messages": turn,
                                                                "response_format": fmt_value})
        try:
            err = json.loads(body)["error"]
        except (ValueError, KeyError):
            err = {"message": body[:200], "param": None}
        check(f"serve refuses response_format {json.dumps(fmt_value)[:60]}: 400 naming {must!r}",
              status == 400 and must in err["message"] and err["param"] == param, f"{status} {err}")
    refused({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
            "'uniqueItems'", "response_format.json_schema.schema")
    refused({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
        "n": {"type": "integer", "multipleOf": 2}}}}}, "/properties/n", "response_format.json_schema.schema")
    refused({"type": "json_schema", "json_schema": {"schema": {}}}, "is required", "response_format.json_schema.name")
    refused({"type": "xml"}, "text, json_object or json_schema", "response_format.type")
    refused({"type": "json_object", "schema": {}}, "not a field", "response_format.schema")
    refused("json", "must be an object", "response_format")
    r = client.completions.create(model="llama", prompt="A", max_tokens=3, temperature=0)
    check("serve keeps serving after refused formats", r.choices[0].finish_reason == "length", str(r.choices[0]))

    # A schema no token can start (a character the vocabulary lacks): that
    # request fails alone, and the stream running in the row beside it goes on.
    missing = next(ch for ch in "~^|`@#" if not any(ch in t for t in lib.get_vocab()))
    stream = client.completions.create(model="llama", prompt="A person:", max_tokens=30, temperature=0, stream=True)
    first = next(iter(stream))
    try:
        client.completions.create(model="llama", prompt="A", max_tokens=5, extra_body={"response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": [missing]}}}})
        dead = "served"
    except openai.InternalServerError as e:
        dead = str(e)
    rest = [c.choices[0] for c in stream if c.choices]
    text = first.choices[0].text + "".join(c.text for c in rest)
    plain = client.completions.create(model="llama", prompt="A person:", max_tokens=30, temperature=0)
    check(f"serve, a schema no token can start ({missing!r}): that request is a 500 saying so, and the stream in the "
          "row beside it finishes as it does alone", "no token of the model's vocabulary" in dead and
          rest and rest[-1].finish_reason == "length" and text == plain.choices[0].text, f"{dead[:200]} {text!r}")
    srv.stop()


def bad_flags(sdrun, plan, tmp):
    schema = os.path.join(tmp, "bad_schema.json")
    with open(schema, "w") as f:
        json.dump({"type": "object", "properties": {"a": {"type": "string", "format": "hostname"}}}, f)
    broken = os.path.join(tmp, "broken_schema.json")
    with open(broken, "w") as f:
        f.write('{"type": "object",')
    base = [sdrun, "generate", plan, "--prompt", "x", "--max-new-tokens", "4"]
    clean_error("generate --json-schema with an unsupported keyword: one line naming it and where",
                base + ["--json-schema", schema], ["format 'hostname'", "/properties/a", schema])
    clean_error("generate --json-schema with broken JSON: one line naming the file", base + ["--json-schema", broken],
                [broken, "JSON"])
    clean_error("generate --json-schema with no such file", base + ["--json-schema", os.path.join(tmp, "none.json")],
                ["--json-schema", "none.json"])
    clean_error("generate --json with --json-schema: one line", base + ["--json", "--json-schema", schema],
                ["--json", "--json-schema"])


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_json_")
    servers = []
    try:
        onnx_path = os.path.join(tmp, "llama.onnx")
        export(build("llama", 0), onnx_path, 17, 2, 16)
        model = build("llama", 0)  # the reference (the export patches its model's forward)
        plan = os.path.join(tmp, "llama.sdp")
        subprocess.run([sdc, "compile", onnx_path, "--kv-cache", "128", "--kv-batch", "2", "--prefill-chunk", "8",
                        "-o", plan], check=True, capture_output=True)
        byte_level(sdc, sdrun, plan, model, tmp)
        trained_tokenizer(sdrun, plan, model, tmp, servers)
        bad_flags(sdrun, plan, tmp)
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return report("structured_output")


if __name__ == "__main__":
    sys.exit(main())
