#!/usr/bin/env python3
"""Tool calling in sdrun serve, through the openai client, on a tiny Llama
with a tokenizer whose chat template is Qwen2.5's tool format (tools as JSON
in the system turn, calls in <tool_call> tags, results in <tool_response>).

Checked: a conversation with tools, an assistant turn's calls and a tool
result renders as transformers renders it (the prompt's token count, and the
reply generated from it); a named tool_choice is generated under the
function's parameters schema, greedy text equal to xgrammar's masks on
transformers' logits, returned as a tool call (streamed: id and name first,
then the arguments in pieces); tool_choice "required" writes a list of calls
under a grammar of every tool, equal to xgrammar's on the same schema
(streamed: each call's id and name as soon as the name is whole, then its
arguments in pieces; cut at max_tokens, the calls as far as they came), and
parallel_tool_calls false keeps it to one; with --tool-call-parser hermes, a
LoRA adapter trained with sdrun train to answer with a <tool_call> comes
back as the call (tool_choice "auto"), while a reply without one is plain
content; and requests that cannot be served are 400s naming the field."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from e2e_util import tool_paths
from test_serve import Server, post
from test_structured_output import compact_grammar, follows, token_info, xgrammar_greedy
from test_training import check, clean_error, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "local"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'


def tool_tokenizer(folder, words):
    """A 256-token BPE trained on JSON lines and tool-call text, with
    Qwen2.5's tool template; <|im_end|> (a special token, as Qwen's) is its EOS."""
    import random
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from chat_templates import QWEN_TOOLS
    rng = random.Random(0)
    lines = [json.dumps({"city": rng.choice(words)[:8], "unit": rng.choice("cf")}, separators=(",", ":"))
             for _ in range(2000)]
    lines += [CALL, "<|im_start|>system\n<tools>\n</tools><|im_end|>\n<|im_start|>user\n<tool_response>"] * 200
    lines += [json.dumps(t) for t in TOOLS] * 50
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(lines + words[:2000], trainers.BpeTrainer(
        vocab_size=256, special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"], limit_alphabet=100,
        show_progress=False))
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": "<s>", "chat_template": QWEN_TOOLS}, f)
    return tok


def rendered_ids(lib, messages, tools):
    """transformers' rendering, with each call's arguments an object as
    vLLM hands them to templates, tokenized as apply_chat_template does."""
    from transformers.utils.chat_template_utils import render_jinja_template
    from chat_templates import QWEN_TOOLS
    msgs = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {"name": c["function"]["name"],
                                                  "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        msgs.append(m)
    out, _ = render_jinja_template(conversations=[msgs], tools=tools, chat_template=QWEN_TOOLS,
                                   add_generation_prompt=True, bos_token="<s>", eos_token="<|im_end|>")
    return lib.encode(out[0], add_special_tokens=False).ids


def required_schema(tools, parallel=True):
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "parameters": t["function"]["parameters"]},
              "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def served_calls(sdrun, plan, model, lib, folder, servers):
    info = token_info(lib, ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"], "<|im_end|>")
    eos = lib.token_to_id("<|im_end|>")
    srv = Server(sdrun, plan, "--tokenizer", folder, "--served-model-name", "llama")
    servers.append(srv)
    client = srv.client()
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
               {"role": "user", "content": "And the time?"}]
    ids = rendered_ids(lib, history, TOOLS)
    params = TIME["function"]["parameters"]
    want = lib.decode(xgrammar_greedy(model, info, compact_grammar(info, params), ids, 40, {eos}))
    r = client.chat.completions.create(model="llama", messages=history, tools=TOOLS, temperature=0, max_tokens=40,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls or []
    check("a conversation with tools, an assistant's calls and a tool result renders as transformers renders it "
          "(Qwen2.5's tool template): the prompt's token count", r.usage.prompt_tokens == len(ids),
          f"{r.usage.prompt_tokens} vs {len(ids)}")
    check("tool_choice naming a function: the reply is that call, its arguments generated under the function's "
          "schema equal to xgrammar's greedy text on transformers' logits; content null",
          len(calls) == 1 and calls[0].function.name == "get_time" and calls[0].function.arguments == want and
          calls[0].id.startswith("call_") and r.choices[0].message.content is None and
          follows(json.loads(want), params, {}) and r.choices[0].finish_reason == "stop",
          f"{calls} vs {want!r}; {r.choices[0].message.content!r} {r.choices[0].finish_reason}")
    pieces, first = [], None
    for chunk in client.chat.completions.create(model="llama", messages=history, tools=TOOLS, temperature=0,
                                                max_tokens=40, stream=True,
                                                tool_choice={"type": "function", "function": {"name": "get_time"}}):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if first is None:
                first = d
            if d.function and d.function.arguments:
                pieces.append(d.function.arguments)
    check("a named call streamed: id and name first, then the arguments in pieces that add up to the whole",
          first is not None and first.id and first.function.name == "get_time" and "".join(pieces) == want and
          len(pieces) > 1, f"{first} {pieces}")

    turn = [{"role": "user", "content": "What is the weather?"}]
    ids = rendered_ids(lib, turn, TOOLS)
    # The random model goes on listing calls until max_tokens: with parallel
    # calls its list is cut (and comes back as text); with one call it ends.
    for parallel in (True, False):
        want = lib.decode(xgrammar_greedy(model, info, compact_grammar(info, required_schema(TOOLS, parallel)), ids,
                                          80, {eos}))
        r = client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80, parallel_tool_calls=parallel)
        calls = r.choices[0].message.tool_calls or []
        streamed, finish = {}, None
        for chunk in client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, tool_choice="required",
                                                    temperature=0, max_tokens=80, parallel_tool_calls=parallel,
                                                    stream=True):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                call = streamed.setdefault(d.index, {"id": d.id, "name": d.function.name, "pieces": []})
                if d.function.arguments:
                    call["pieces"].append(d.function.arguments)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        got = [(c.id, c.function.name, c.function.arguments) for c in calls]
        sent = [(c["id"], c["name"], "".join(c["pieces"])) for _, c in sorted(streamed.items())]
        check(f"tool_choice required{'' if parallel else ', parallel_tool_calls false'}, streamed: each call's id and "
              f"name first, then its arguments in pieces; the same calls as the response's",
              [g[1:] for g in got] == [t[1:] for t in sent] and all(t[0] and t[0].startswith("call_") for t in sent)
              and finish == r.choices[0].finish_reason and
              all(len(c["pieces"]) > 1 for c in streamed.values() if c["pieces"]),
              f"{sent} vs {got}; {finish}")
        if parallel:
            # The text cut inside a call: the calls as far as they came.
            cut = re.findall(r'\{"name":"([^"]*)"', want)  # the names whole
            written = "[" + "},".join(f'{{"name":"{c.function.name}","parameters":{c.function.arguments}'
                                      for c in calls)
            check("tool_choice required: the list of calls is written as xgrammar writes it under every tool's "
                  "schema; cut at max_tokens here, so the calls come as far as they came, finish_reason length",
                  [c.function.name for c in calls] == cut and r.choices[0].finish_reason == "length" and
                  len(calls) > 1 and (want.startswith(written) or written.startswith(want)),
                  f"{got} vs {want!r} {r.choices[0].finish_reason}")
            continue
        listed = json.loads(want)
        check("tool_choice required, parallel_tool_calls false: one call, as xgrammar writes it, returned with its "
              "name and arguments (finish_reason tool_calls)",
              [(c.function.name, json.loads(c.function.arguments)) for c in calls] ==
              [(c["name"], c["parameters"]) for c in listed] and len(calls) == 1 and
              r.choices[0].finish_reason == "tool_calls", f"{calls} vs {want!r} {r.choices[0].finish_reason}")
    r = client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=8)
    check("tool_choice none: plain content, no calls", r.choices[0].message.tool_calls is None and
          r.choices[0].message.content, str(r.choices[0].message))

    def refused(body, must, param):
        status, text = post(srv.port, "/v1/chat/completions", {"model": "llama", "messages": turn, **body})
        try:
            err = json.loads(text)["error"]
        except (ValueError, KeyError):
            err = {"message": text[:200], "param": None}
        check(f"refused: {json.dumps(body)[:70]}: 400 naming {param}",
              status == 400 and must in err["message"] and err["param"] == param, f"{status} {err}")
    refused({"tools": TOOLS}, "--tool-call-parser", "tool_choice")
    refused({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'", "tool_choice")
    refused({"tool_choice": "required"}, "needs tools", "tool_choice")
    refused({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string",
                                                                                    "format": "hostname"}}}],
             "tool_choice": "required"}, "'hostname'", "tools[0].function.parameters")
    refused({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "letters", "tools[0].function.name")
    refused({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool call",
            "response_format")
    refused({"tools": TOOLS, "tool_choice": "required", "logprobs": True}, "logprobs", "logprobs")
    status, text = post(srv.port, "/v1/chat/completions", {"model": "llama", "messages": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                               "function": {"name": "f", "arguments": "{not json"}}]}]})
    check("refused: a call whose arguments are not JSON, naming the message", status == 400 and
          "messages[0].tool_calls[0].function.arguments" in text, f"{status} {text[:200]}")
    srv.stop()

    # tool_choice auto on a model that writes no call: its reply is content,
    # streamed as it comes (only text that may start a call waits).
    srv = Server(sdrun, plan, "--tokenizer", folder, "--served-model-name", "llama", "--tool-call-parser", "hermes")
    servers.append(srv)
    client = srv.client()
    whole = client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, temperature=0, max_tokens=24)
    parts, finish = [], None
    for chunk in client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, temperature=0,
                                                max_tokens=24, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    check("tool_choice auto without a call: the reply is content, streamed in pieces that add up to it",
          whole.choices[0].message.tool_calls is None and "".join(parts) == whole.choices[0].message.content and
          len(parts) > 3 and finish == whole.choices[0].finish_reason == "length",
          f"{parts} vs {whole.choices[0].message.content!r} {finish}")
    srv.stop()


def data_lines(sdrun, lib, folder, tmp):
    """Chat data with tools renders as transformers renders it, arguments
    given as objects or as JSON text; bad tool calls are one-line errors."""
    conversation = [{"role": "user", "content": "Weather in Rome?"},
                    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                        "name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "64 F"},
                    {"role": "assistant", "content": "Warm."}]
    as_text = json.loads(json.dumps(conversation))
    as_text[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Rome", "unit": "f"}'
    lines = "".join(json.dumps({"messages": c, "tools": TOOLS, "add_generation_prompt": False}) + "\n"
                    for c in (conversation, as_text))
    r = subprocess.run([sdrun, "tokenize", "--tokenizer", folder, "--chat"], input=lines, capture_output=True,
                       text=True, timeout=60)
    from transformers.utils.chat_template_utils import render_jinja_template
    from chat_templates import QWEN_TOOLS
    want, _ = render_jinja_template(conversations=[conversation], tools=TOOLS, chat_template=QWEN_TOOLS,
                                    bos_token="<s>", eos_token="<|im_end|>")
    got = [json.loads(x) for x in r.stdout.splitlines()] if r.returncode == 0 else [r.stderr]
    check("chat data with tools and tool_calls (arguments as an object or as JSON text) renders as transformers "
          "renders it", got == [want[0], want[0]], f"{got!r} vs {want[0]!r}")
    bad = os.path.join(tmp, "bad_calls.jsonl")
    for name, line, must in [
            ("arguments that are not JSON", {"messages": [{"role": "user", "content": "x"}, {
                "role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
             "messages[1].tool_calls[0].function.arguments is not JSON"),
            ("tools on a text line", {"text": "x", "tools": TOOLS}, "'tools' go with 'messages'"),
            ("an unknown message field", {"messages": [{"role": "user", "content": "x", "mood": "glad"}]},
             "messages[0].mood is not supported")]:
        with open(bad, "w") as f:
            f.write(json.dumps(line) + "\n")
        clean_error(f"sdrun train: chat data with {name} is a one-line error naming the line and field",
                    [sdrun, "train", os.path.join(tmp, "lora.sdp"), "--data", bad, "--steps", "1"], [must, "bad_calls.jsonl:1"])


def trained_call(sdc, sdrun, onnx_path, lib, folder, tmp, servers):
    """sdrun train teaches a LoRA adapter to answer with a call; served with
    --tool-call-parser hermes, tool_choice auto returns it as a call."""
    plan = os.path.join(tmp, "lora.sdp")
    subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj,v_proj,o_proj,up_proj",
                    "--lora-r", "16", "--lora-alpha", "32", "--kv-cache", "512", "--kv-batch", "2", "--prefill-chunk",
                    "8", "--shapes", "input_ids=4x320", "--tokenizer", folder, "-o", plan], check=True,
                   capture_output=True)
    # TRL's conversational format with tools: the call as tool_calls (its
    # arguments an object), the functions in "tools"; the template writes both.
    data = os.path.join(tmp, "calls.jsonl")
    with open(data, "w") as f:
        for city in ["Paris", "Rome", "Oslo", "Lima"]:
            call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city, "unit": "c"}}}
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Weather in {city}?"},
                                             {"role": "assistant", "tool_calls": [call]}], "tools": TOOLS}) + "\n")
    adapter = os.path.join(tmp, "adapter")
    data_lines(sdrun, lib, folder, tmp)
    r = subprocess.run([sdrun, "train", plan, "--data", data, "--steps", "150", "--lr", "3e-3", "--threads", "2",
                        "--save-adapter", adapter], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        check("sdrun train teaches the call", False, r.stderr[-300:])
        return
    srv = Server(sdrun, plan, "--adapter", adapter, "--tool-call-parser", "hermes", "--served-model-name", "llama")
    servers.append(srv)
    client = srv.client()
    turn = [{"role": "user", "content": "Weather in Paris?"}]
    plain = client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=40)
    r = client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, temperature=0, max_tokens=40)
    calls = r.choices[0].message.tool_calls or []
    check("--tool-call-parser hermes: a LoRA trained with sdrun train on tool_calls data (TRL's format, with tools) "
          "is served with tool_choice auto, its <tool_call> returned as the call (finish_reason tool_calls); with "
          "tool_choice none the same text comes as content",
          len(calls) == 1 and calls[0].function.name == "get_weather" and
          json.loads(calls[0].function.arguments) == {"city": "Paris", "unit": "c"} and
          r.choices[0].finish_reason == "tool_calls" and CALL in (plain.choices[0].message.content or ""),
          f"{calls} {r.choices[0].finish_reason}; plain: {plain.choices[0].message.content!r}")
    parts, names, args, finish = [], [], [], None
    for chunk in client.chat.completions.create(model="llama", messages=turn, tools=TOOLS, temperature=0,
                                                max_tokens=40, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        parts += [d.content] if d.content else []
        for c in d.tool_calls or []:
            names.append(c.function.name)
            args.append(c.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    check("tool_choice auto streamed: the call comes whole at the end", names == ["get_weather"] and
          json.loads(args[0]) == {"city": "Paris", "unit": "c"} and finish == "tool_calls", f"{names} {args} {finish}")
    srv.stop()


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_tools_")
    servers = []
    try:
        words = subprocess.run(["bible", "Gen1:1-Gen11:32"], capture_output=True, text=True,
                               check=True).stdout.replace(",", " ").replace(".", " ").split()
        folder = os.path.join(tmp, "tok")
        lib = tool_tokenizer(folder, words)
        onnx_path = os.path.join(tmp, "llama.onnx")
        export(build("llama", 0), onnx_path, 17, 2, 16)
        model = build("llama", 0)  # the reference (the export patches its model's forward)
        plan = os.path.join(tmp, "llama.sdp")
        subprocess.run([sdc, "compile", onnx_path, "--kv-cache", "512", "--kv-batch", "2", "--prefill-chunk", "32",
                        "-o", plan], check=True, capture_output=True)
        served_calls(sdrun, plan, model, lib, folder, servers)
        trained_call(sdc, sdrun, onnx_path, lib, folder, tmp, servers)
        clean_error("serve --tool-call-parser with an unknown parser: one line naming the parsers",
                    [sdrun, "serve", plan, "--tool-call-parser", "granite_20b"],
                    ["--tool-call-parser", "hermes", "llama3_json", "mistral", "granite", "pythonic"])
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return report("tool_calls")


if __name__ == "__main__":
    sys.exit(main())
