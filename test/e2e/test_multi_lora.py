#!/usr/bin/env python3
"""Several LoRA adapters in one batch. `sdc compile --max-loras N` makes a
serving plan whose adapter factors are stacks of slots and whose generation
entries take each row's slot (lora_ids); `sdrun serve --lora-modules` then
serves every adapter from one session and one set of rows, writing adapters
into slots as requests need them (more adapters than slots swap), and
`sdrun generate --adapter` puts one in slot 0.

Checked on a tiny Llama with a small BPE tokenizer, against three adapters of
different ranks, alphas and target modules: two trained by sdrun on ordinary
--peft lora plans, one made by PEFT itself (random B, use_rslora). Each
adapter's text from the slot plan equals its own plan's (sdrun generate
--adapter) or PEFT's greedy generate, alone and with requests of all four
models (the base one too) in flight at once over two slots; seeded sampling
equals the one-session-per-adapter server's; /metrics counts slot loads; bad
flags and adapters the slots cannot take are one-line errors."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request

from e2e_util import clean_error_problems, run_module_script, tool_paths, write_token_rows
from test_serve import Server, generate_cli, genesis_tokenizer, greedy
from test_training import check, report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
PROMPTS = ["And God said, Let there be", "In the beginning", "And the earth was without form, and void",
           "Noah found grace"]
NEW = 10


def train_adapter(sdc, sdrun, onnx_path, tmp, name, seed, *flags):
    """An adapter sdrun trained on an ordinary LoRA plan compiled with `flags`; (plan, adapter folder)."""
    import numpy as np
    plan, data, adapter = (os.path.join(tmp, f"{name}{ext}") for ext in (".sdp", ".jsonl", "_adapter"))
    subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", *flags, "--shapes", "input_ids=2x16", "--kv-cache",
                    "96", "--kv-batch", "2", "-o", plan], check=True, capture_output=True)
    write_token_rows(data, np.random.default_rng(seed), 256, 16, 16)
    subprocess.run([sdrun, "train", plan, "--data", data, "--steps", "30", "--lr", "5e-2", "--save-adapter", adapter],
                   check=True, capture_output=True)
    return plan, adapter


def peft_adapter(tmp, name, **config):
    """A PEFT LoRA of random factors (init_lora_weights=False) on the tiny Llama; (PEFT model, folder)."""
    import torch
    from export_hf import build
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(7)
    model = get_peft_model(build("llama", 0), LoraConfig(init_lora_weights=False, **config)).eval()
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder)
    return model, folder


def peft_text(model, lib, prompt):
    ids = lib.encode(prompt).ids
    out = greedy(model, ids, NEW)
    return lib.decode(ids + out, skip_special_tokens=True)[len(lib.decode(ids, skip_special_tokens=True)):]


def complete(client, model, prompt, **kw):
    return client.completions.create(model=model, prompt=prompt, max_tokens=NEW, temperature=0, **kw).choices[0].text


def metric(srv, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=30) as r:
        m = re.search(rf"^{name} (\d+)$", r.read().decode(), re.M)
    return int(m.group(1)) if m else -1


def post(srv, path, body):
    """(status, text) of a POST with a JSON body."""
    req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def python_batches(sdrun, slots, tok, want, ad_a, ad_b, ad_c):
    """The Python module (the C API's sd_generator_generate_batch): texts of several adapters in each batch."""
    script = f"""
import json, sdc, tokenizers
lib = tokenizers.Tokenizer.from_file({os.path.join(tok, "tokenizer.json")!r})
prompts = {PROMPTS!r}
ids = [lib.encode(p).ids for p in prompts]
def text(i, new):
    return lib.decode(ids[i] + new, skip_special_tokens=True)[len(lib.decode(ids[i], skip_special_tokens=True)):]
g = sdc.Generator(sdc.Session(sdc.Plan({slots!r}), threads=2), temperature=0)
out = {{"slots": g.adapter_slots, "rows": g.batch_size}}
g.load_adapter(1, {ad_a!r})
g.load_adapter(2, {ad_c!r})
# 12 texts through 4 rows: every batch mixes the base model (slot 0) and both adapters.
order = [(k, slot) for k in range(len(prompts)) for slot in (0, 1, 2)]
got = g.generate_batch([ids[k] for k, _ in order], {NEW}, adapters=[slot for _, slot in order])
out["mixed"] = {{f"{{k}},{{slot}}": text(k, new) for (k, slot), new in zip(order, got)}}
out["single"] = text(0, g.generate(ids[0], {NEW}))
g.load_adapter(1, {ad_b!r})  # the rows that cached a's keys and values must not keep them
out["rewritten"] = [text(k, new) for k, new in enumerate(g.generate_batch(ids, {NEW}, adapters=[1] * len(ids)))]
full = g.generate_batch(ids[:1], {NEW}, adapters=[2])[0]
out["stopped"] = [full, g.generate_batch(ids[:1], {NEW}, adapters=[2], stop_tokens=[full[3]])[0]]
errors = []
for bad in (lambda: g.generate_batch(ids, 2, adapters=[3, 0, 0, 0]), lambda: g.load_adapter(5, {ad_a!r}),
            lambda: g.generate_batch(ids, 2, adapters=[0]), lambda: g.generate_batch([ids[0], []], 2)):
    try:
        bad()
        errors.append("no error")
    except Exception as e:
        errors.append(str(e))
out["errors"] = errors
print(json.dumps(out))
"""
    out, err = run_module_script(sdrun, script)
    if out is None:
        check("Python: Generator.generate_batch with adapter slots", False, err[-600:])
        return
    mixed, names = out["mixed"], {0: "base", 1: "a", 2: "c"}
    check("Python: Generator.adapter_slots is 2 and batch_size 4", out["slots"] == 2 and out["rows"] == 4, out)
    check("Python: generate_batch, 12 texts through 4 rows, each batch mixing slot 0 and adapters a and c "
          "(load_adapter): every text equals its model's reference",
          all(mixed[f"{k},{slot}"] == want[names[slot]][k] for k in range(len(PROMPTS)) for slot in names), mixed)
    check("Python: generate() after a batch goes through slot 0 (the base model)",
          out["single"] == want["base"][0], out["single"])
    check("Python: load_adapter(1, b) over a: slot 1's texts are b's (its rows' cached a drops)",
          out["rewritten"] == want["b"], f"{out['rewritten']} vs {want['b']}")
    full, stopped = out["stopped"]
    check("Python: stop_tokens ends a text before the stop token",
          stopped == full[:full.index(full[3])] and len(full) == NEW,
          out["stopped"])
    errors = out["errors"]
    check("Python: bad batches are errors naming what is wrong (slot 3 of 0 to 2, load into slot 5, 1 slot "
          "for 4 texts, a text of no tokens)",
          "adapter slot 3" in errors[0] and "0 to 2" in errors[0] and "slot 5" in errors[1] and
          "1 slots for 4 texts" in errors[2] and "text 2 has no tokens" in errors[3], errors)


def no_starving(sdrun, onnx_path, sdc, tmp, tok, servers, want, ad_a, ad_c):
    """One slot, two rows kept busy with adapter a by four clients out of step: a request for c gets
    its text through the only slot while a's requests keep coming (the slot drains for it: a waiting
    choice lets at most twice the rows' count of others take a row first; these loads need not reach
    that bound)."""
    one = os.path.join(tmp, "one_slot.sdp")
    subprocess.run([sdc, "compile", onnx_path, "--max-loras", "1", "--target-modules", "q_proj,v_proj", "--kv-cache",
                    "96", "--kv-batch", "2", "--prefill-chunk", "8", "--tokenizer", tok, "-o", one], check=True,
                   capture_output=True)
    srv = Server(sdrun, one, "--served-model-name", "base", "--lora-modules", f"a={ad_a}", "--lora-modules",
                 f"c={ad_c}")
    servers.append(srv)
    client = srv.client()
    done, started, lock = [], threading.Event(), threading.Lock()

    def stream_a(tokens):
        for _ in range(8):
            client.completions.create(model="a", prompt=PROMPTS[2], max_tokens=tokens, temperature=0)
            with lock:
                done.append("a")
            started.set()
    got = {}

    def ask_c():
        started.wait(60)
        got["c"] = complete(client, "c", PROMPTS[0])
        with lock:
            done.append("c")
    threads = [threading.Thread(target=stream_a, args=(n,)) for n in (9, 11, 14, 17)] + [threading.Thread(target=ask_c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = len(done) - 1 - done.index("c") if "c" in done else -1
    check("one slot, two rows kept busy by adapter a's four clients: a request for c gets its text (its adapter "
          "swapped into the only slot) while a's requests still come", got.get("c") == want["c"][0] and after >= 8,
          f"{after} of a's 32 requests ended after c's; {got} vs {want['c'][0]!r}; {done}")
    srv.stop()
    servers.remove(srv)


def runtime_updates(sdrun, slots, servers, want, ad_a, ad_c, tmp):
    """--allow-runtime-lora-updating: vLLM's load and unload routes."""
    srv = Server(sdrun, slots, "--served-model-name", "base", "--allow-runtime-lora-updating")
    servers.append(srv)
    client = srv.client()
    loaded = [post(srv, "/v1/load_lora_adapter", {"lora_name": n, "lora_path": d}) for n, d in (("a", ad_a),
                                                                                             ("c", ad_c))]
    names = [m.id for m in client.models.list().data]
    texts = {m: [complete(client, m, p) for p in PROMPTS[:2]] for m in ("base", "a", "c")}
    check("runtime updates: /v1/load_lora_adapter adds models served through the slots, each with its reference "
          "text", [st for st, _ in loaded] == [200, 200] and "added successfully" in loaded[0][1] and
          names == ["base", "a", "c"] and all(texts[m] == want[m][:2] for m in texts), f"{loaded} {names} {texts}")
    gone = post(srv, "/v1/unload_lora_adapter", {"lora_name": "a"})
    names = [m.id for m in client.models.list().data]
    status = post(srv, "/v1/completions", {"model": "a", "prompt": PROMPTS[0], "max_tokens": 2})[0]
    again = post(srv, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": ad_a})
    check("runtime updates: /v1/unload_lora_adapter removes one (its requests then 404), and it loads again",
          gone[0] == 200 and names == ["base", "c"] and status == 404 and again[0] == 200 and
          complete(client, "a", PROMPTS[0]) == want["a"][0], f"{gone} {names} {status} {again}")
    for what, path, body, must in [
            ("a name taken", "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": ad_a}, "already served"),
            ("a missing folder", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": os.path.join(tmp, "gone")},
             "gone"),
            ("no lora_path", "/v1/load_lora_adapter", {"lora_name": "x"}, "lora_path"),
            ("an unknown field", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": ad_a, "inplace": True},
             "'inplace'"),
            ("the plan's own model", "/v1/unload_lora_adapter", {"lora_name": "base"}, "plan's own model"),
            ("an unknown model", "/v1/unload_lora_adapter", {"lora_name": "zz"}, "does not exist")]:
        st, text = post(srv, path, body)
        check(f"runtime updates, bad request: {what} is a 400 naming it", st == 400 and must in text,
              f"{st} {text[:300]}")
    srv.stop()
    servers.remove(srv)
    plain = Server(sdrun, slots, "--served-model-name", "base")
    servers.append(plain)
    st, text = post(plain, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": ad_a})
    check("runtime updates: off without --allow-runtime-lora-updating (a 404 saying how to turn them on)",
          st == 404 and "--allow-runtime-lora-updating" in text, f"{st} {text[:300]}")
    plain.stop()
    servers.remove(plain)


def main():
    sdc, sdrun = tool_paths()
    import torch
    from export_hf import build, export
    torch.set_num_threads(2)
    tmp = tempfile.mkdtemp(prefix="sd_multi_lora_")
    servers = []
    try:
        tok = os.path.join(tmp, "tok")
        lib = genesis_tokenizer(tok)
        onnx_path = os.path.join(tmp, "llama.onnx")
        export(build("llama", 0), onnx_path, 17, 2, 16)
        plan_a, ad_a = train_adapter(sdc, sdrun, onnx_path, tmp, "a", 1, "--target-modules", "q_proj,v_proj")
        plan_b, ad_b = train_adapter(sdc, sdrun, onnx_path, tmp, "b", 2, "--target-modules", "q_proj", "--lora-r",
                                     "4", "--lora-alpha", "16")
        peft_c, ad_c = peft_adapter(tmp, "c_adapter", r=2, lora_alpha=5, use_rslora=True,
                                    target_modules=["q_proj", "v_proj"])
        slots = os.path.join(tmp, "slots.sdp")
        r = subprocess.run([sdc, "compile", onnx_path, "--max-loras", "2", "--target-modules", "q_proj,v_proj",
                            "--kv-cache", "96", "--kv-batch", "4", "--prefill-chunk", "8", "--tokenizer", tok,
                            "-o", slots], capture_output=True, text=True)
        check("sdc compile --max-loras 2: a plan whose generation entries take lora_ids", r.returncode == 0, r.stderr)
        shown = subprocess.run([sdrun, "inspect", slots], capture_output=True, text=True).stdout
        check("sdrun inspect: the entries take lora_ids [batch], the stacks hold 3 slots, no training entries",
              "lora_ids: i64[4]" in shown and "q_proj.lora_A.slots: f32[3x64x8]" in shown and
              "adapter slots: 2 besides the plan's own" in shown and "train_step" not in shown,
              "; ".join(l.strip() for l in shown.splitlines() if "lora" in l or "adapter slots" in l)[:600])

        base = build("llama", 0)
        want = {"base": [peft_text(base, lib, p) for p in PROMPTS],
                "a": [generate_cli(sdrun, plan_a, p, NEW, "--tokenizer", tok, "--adapter", ad_a)[len(p):-1]
                      for p in PROMPTS],
                "b": [generate_cli(sdrun, plan_b, p, NEW, "--tokenizer", tok, "--adapter", ad_b)[len(p):-1]
                      for p in PROMPTS],
                "c": [peft_text(peft_c, lib, p) for p in PROMPTS]}
        check("the four references differ from each other", len({tuple(v) for v in want.values()}) == 4,
              f"{want}")
        got = {name: [generate_cli(sdrun, slots, p, NEW, *flags)[len(p):-1] for p in PROMPTS]
               for name, flags in (("base", []), ("a", ["--adapter", ad_a]), ("b", ["--adapter", ad_b]),
                                   ("c", ["--adapter", ad_c]))}
        check("sdrun generate on the slot plan: the base model equals transformers, --adapter (slot 0) each "
              "adapter's own plan or PEFT (ranks 8, 4 and 2; alphas 8, 16 and rslora 5; q,v and q alone)",
              got == want, f"{got} vs {want}")

        for what, flags in (("an NF4 base (--quantize nf4)", ["--quantize", "nf4"]),
                            ("bf16 (--precision bf16)", ["--precision", "bf16"])):
            both = []
            for kind in (["--max-loras", "2"], ["--peft", "lora", "--shapes", "input_ids=2x16"]):
                out = os.path.join(tmp, f"variant{len(both)}.sdp")
                subprocess.run([sdc, "compile", onnx_path, *kind, *flags, "--target-modules", "q_proj,v_proj",
                                "--kv-cache", "96", "--kv-batch", "2", "--tokenizer", tok, "-o", out], check=True,
                               capture_output=True)
                both.append([generate_cli(sdrun, out, p, NEW, "--adapter", ad_a) for p in PROMPTS[:2]])
            check(f"{what}: the slot plan's text with --adapter equals the ordinary LoRA plan's compiled alike",
                  both[0] == both[1] and not both[0][0].startswith("error"), f"{both}")

        srv = Server(sdrun, slots, "--served-model-name", "base", "--lora-modules", f"a={ad_a}", "--lora-modules",
                     f"b={ad_b}", "--lora-modules", f"c={ad_c}")
        servers.append(srv)
        check("serve: the startup line says 3 adapters share 2 slots", "3 adapters in 2 slots" in srv.text(),
              srv.text()[-300:])
        client = srv.client()
        alone = {m: [complete(client, m, p) for p in PROMPTS] for m in want}
        check("serve: each model alone (adapters swapping through 2 slots) gives its reference text",
              alone == want, f"{alone} vs {want}")
        loads = metric(srv, "sdrun_lora_slot_loads_total")
        together = {}

        def run(model, k):
            together[(model, k)] = complete(client, model, PROMPTS[k])
        threads = [threading.Thread(target=run, args=(m, k)) for k in range(len(PROMPTS)) for m in want]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check("serve: 16 requests to 4 models at once (4 rows, mixed adapters in each batch) each get their "
              "model's text", all(together.get((m, k)) == want[m][k] for m in want for k in range(len(PROMPTS))),
              f"{together}")
        more = metric(srv, "sdrun_lora_slot_loads_total")
        check("/metrics: sdrun_lora_slot_loads_total counts adapters written into slots (3 adapters, 2 slots: "
              "more loads than adapters)", loads >= 3 and more >= loads, f"{loads} then {more}")
        sampled = [c.text for c in client.completions.create(model="a", prompt=PROMPTS[0], max_tokens=NEW,
                                                             temperature=0.9, top_p=0.95, seed=5, n=3).choices]
        srv.stop()
        servers.remove(srv)
        own = Server(sdrun, plan_a, "--tokenizer", tok, "--served-model-name", "base", "--lora-modules", f"a={ad_a}")
        servers.append(own)
        sessions = [c.text for c in own.client().completions.create(model="a", prompt=PROMPTS[0], max_tokens=NEW,
                                                                     temperature=0.9, top_p=0.95, seed=5,
                                                                     n=3).choices]
        check("serve: seeded sampling through a slot equals the adapter's own session (--lora-modules on its "
              "plan)", sampled == sessions and len(set(sampled)) > 1, f"{sampled} vs {sessions}")
        own.stop()
        servers.remove(own)

        python_batches(sdrun, slots, tok, want, ad_a, ad_b, ad_c)
        runtime_updates(sdrun, slots, servers, want, ad_a, ad_c, tmp)
        no_starving(sdrun, onnx_path, sdc, tmp, tok, servers, want, ad_a, ad_c)

        # Adapters the slots cannot take.
        big_plan, big = train_adapter(sdc, sdrun, onnx_path, tmp, "big", 3, "--target-modules", "q_proj",
                                      "--lora-r", "16")
        k_plan, k_proj = train_adapter(sdc, sdrun, onnx_path, tmp, "k", 4, "--target-modules", "k_proj")
        _, dora = peft_adapter(tmp, "dora_adapter", r=2, use_dora=True, target_modules=["q_proj"])
        for what, spec, must in [
                ("a rank above the plan's", f"big={big}", ["--lora-modules big", "r=16", "ranks 1 to 8"]),
                ("a module the plan does not adapt", f"k={k_proj}", ["--lora-modules k", "k_proj",
                                                                      "not a LoRA factor"]),
                ("DoRA", f"d={dora}", ["--lora-modules d", "use_dora"])]:
            problems, line = clean_error_problems([sdrun, "serve", slots, "--port", "0", "--lora-modules", spec], must)
            check(f"bad input: --lora-modules with {what} is a one-line error", not problems,
                  "; ".join(problems) or line)
        for what, cmd, must in [
                ("sdc --max-loras without --kv-cache", [sdc, "compile", onnx_path, "--max-loras", "2",
                                                        "--target-modules", "q_proj", "-o", slots + ".x"],
                 ["--max-loras", "--kv-cache"]),
                ("sdc --max-loras with --use-dora", [sdc, "compile", onnx_path, "--max-loras", "2", "--use-dora",
                                                     "--target-modules", "q_proj", "--kv-cache", "32", "-o",
                                                     slots + ".x"], ["--max-loras", "--use-dora"]),
                ("sdc --max-loras with --peft ia3", [sdc, "compile", onnx_path, "--max-loras", "2", "--peft", "ia3",
                                                     "--target-modules", "q_proj", "--kv-cache", "32", "-o",
                                                     slots + ".x"], ["--max-loras", "--peft"]),
                ("sdc --max-loras 0", [sdc, "compile", onnx_path, "--max-loras", "0", "--kv-cache", "32", "-o",
                                       slots + ".x"], ["--max-loras"]),
                ("sdrun train on the slot plan", [sdrun, "train", slots, "--data", os.path.join(tmp, "a.jsonl"),
                                                  "--steps", "1"], ["--max-loras", "no training entries"]),
                ("sdrun generate --adapter with too high a rank", [sdrun, "generate", slots, "--prompt", "In",
                                                                   "--adapter", big], ["r=16"])]:
            problems, line = clean_error_problems(cmd, must, no_files=[slots + ".x"])
            check(f"bad input: {what} is a one-line error", not problems, "; ".join(problems) or line)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report("multi_lora")


if __name__ == "__main__":
    sys.exit(main())
