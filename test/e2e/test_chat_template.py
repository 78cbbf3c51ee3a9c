#!/usr/bin/env python3
"""Chat templates: `sdrun tokenize --chat` renders every template of
chat_templates.py, on every conversation, with and without the generation
prompt, exactly as transformers' apply_chat_template (jinja2 with
trim_blocks and lstrip_blocks) renders it; where the template raises
(roles that do not alternate, a system turn Gemma refuses) both refuse. A
template outside our Jinja subset is a clear error naming the construct, and
so is a message with an unknown role."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from chat_templates import CONVERSATIONS, TEMPLATES
from e2e_util import tool_paths
from test_training import check, report

TOKENIZER = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "post_processor": None,
             "decoder": None, "model": {"type": "BPE", "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3},
                                        "merges": [], "unk_token": "<unk>"}}


def tokenizer_dir(root, name, template):
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(TOKENIZER, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}, f)
    return folder


def ours(sdrun, folder, conversation, generation):
    line = json.dumps({"messages": conversation, "add_generation_prompt": generation}) + "\n"
    r = subprocess.run([sdrun, "tokenize", "--tokenizer", folder, "--chat"], input=line, capture_output=True, text=True,
                       timeout=60)
    return (json.loads(r.stdout), None) if r.returncode == 0 else (None, r.stderr.strip())


def reference(template, conversation, generation):
    from transformers.utils.chat_template_utils import render_jinja_template
    try:
        rendered, _ = render_jinja_template(conversations=[conversation], chat_template=template,
                                            add_generation_prompt=generation, bos_token="<s>", eos_token="</s>")
        return rendered[0], None
    except Exception as e:  # jinja2's TemplateError from raise_exception
        return None, str(e)


def main():
    _, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_chat_")
    try:
        for name, template in TEMPLATES.items():
            folder = tokenizer_dir(tmp, name, template)
            cases, bad = 0, []
            for c, conversation in enumerate(CONVERSATIONS):
                for generation in (False, True):
                    got, err = ours(sdrun, folder, conversation, generation)
                    want, want_err = reference(template, conversation, generation)
                    cases += 1
                    if want_err is not None:
                        if err is None or want_err not in err or len(err.splitlines()) != 1:
                            bad.append(f"conversation {c}: the template raises '{want_err}', we gave {got!r} {err}")
                    elif got != want:
                        bad.append(f"conversation {c}, generation prompt {generation}: {got!r} != {want!r} ({err})")
            check(f"chat template '{name}' renders as transformers' apply_chat_template", not bad and cases == 8,
                  f"{cases} renderings" + (f"; {bad[0]}" if bad else ""))

        for what, template, words in [
                ("a macro (outside the subset)", "{% macro m() %}x{% endmacro %}{{ m() }}", ["macro", "line 1"]),
                ("an unknown filter", "{{ messages | wordcount }}", ["wordcount"]),
                ("an unclosed block", "{% for m in messages %}{{ m.content }}", ["endfor"])]:
            folder = tokenizer_dir(tmp, "bad", template)
            _, err = ours(sdrun, folder, CONVERSATIONS[0], False)
            check(f"bad template: {what}", err is not None and len(err.splitlines()) == 1 and all(w in err for w in words),
                  str(err))
        # transformers 5 saves the template as chat_template.jinja beside a config without one, and reads that
        # file first when the config has one too.
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        saved = os.path.join(tmp, "saved")
        fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(TOKENIZER)), bos_token="<s>",
                                       eos_token="</s>")
        fast.chat_template = TEMPLATES["chatml"]
        fast.save_pretrained(saved)
        config = json.load(open(os.path.join(saved, "tokenizer_config.json")))
        config["chat_template"] = TEMPLATES["zephyr"]  # a stale copy the .jinja file overrides
        json.dump(config, open(os.path.join(saved, "tokenizer_config.json"), "w"))
        got, err = ours(sdrun, saved, CONVERSATIONS[0], True)
        want = AutoTokenizer.from_pretrained(saved).apply_chat_template(CONVERSATIONS[0], tokenize=False,
                                                                        add_generation_prompt=True)
        check("a tokenizer saved by transformers' save_pretrained (chat_template.jinja) renders as transformers "
              "loads it, the .jinja file before tokenizer_config.json's",
              os.path.exists(os.path.join(saved, "chat_template.jinja")) and got == want, f"{got!r} vs {want!r} {err}")
        folder = tokenizer_dir(tmp, "roles", TEMPLATES["chatml"])
        _, err = ours(sdrun, folder, [{"role": "wizard", "content": "hi"}], False)
        check("a message with an unknown role is a clear error", err is not None and "wizard" in err, str(err))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_chat_template")


if __name__ == "__main__":
    sys.exit(main())
