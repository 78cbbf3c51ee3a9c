"""Helpers shared by the end-to-end tests: running the tools and judging
how they fail on bad input."""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool_paths():
    """(sdc, sdrun) under --build (default: build)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    return os.path.join(args.build, "tools", "sdc"), os.path.join(args.build, "tools", "sdrun")


def export_tiny_gpt(folder):
    """The byte-level GPT of examples/export_models.py at its smallest (one
    layer, d_model 32, seq 8), exported into folder/gpt; returns the .onnx path."""
    out = os.path.join(folder, "gpt")
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "export_models.py"), "--out", out, "--only", "gpt",
                    "--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "8", "--batch", "1"],
                   check=True, capture_output=True)
    return os.path.join(out, "gpt.onnx")


def tiny_cnn_classifier(seed=0):
    """A small image classifier that computes its own loss (forward(image,
    label) -> mean cross-entropy): a padded conv, max pooling, a strided
    grouped conv, average pooling and a linear head, for `sdc compile
    --loss-output loss` (tensor data). 3x16x16 images, 5 classes."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
            self.head = torch.nn.Linear(16 * 2 * 2, 5)

        def forward(self, image, label=None):  # without labels: the class logits, for serving
            x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(image)), 2)
            x = torch.nn.functional.avg_pool2d(torch.relu(self.conv2(x)), 2)
            logits = self.head(x.flatten(1))
            return logits if label is None else torch.nn.functional.cross_entropy(logits, label)

    torch.manual_seed(seed)
    return Net()


def export_tiny_cnn_classifier(path, batch, seed=0, logits=False):
    """tiny_cnn_classifier(seed) exported to `path` for [batch] images (opset 17):
    (image, label) -> loss, or with `logits` image -> logits; returns the module."""
    import torch
    model = tiny_cnn_classifier(seed)
    args = (torch.zeros(batch, 3, 16, 16),) if logits else (torch.zeros(batch, 3, 16, 16), torch.zeros(batch, dtype=torch.long))
    torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                      input_names=["image"] if logits else ["image", "label"], output_names=["logits" if logits else "loss"])
    return model


def batch_normed_cnn(seed=0):
    """A small image classifier with BatchNorm2d after its convolutions and
    BatchNorm1d after a linear layer (forward(image, label) -> cross-entropy,
    or the logits without labels); running statistics set away from 0 and 1."""
    import torch
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            # No biases before the norms, as in ResNets: a norm cancels them, so their
            # exact gradient is 0, and AdamW would turn rounding noise into lr-sized steps.
            self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
            self.fc, self.bn3 = nn.Linear(64, 16, bias=False), nn.BatchNorm1d(16)
            self.head = nn.Linear(16, 5)

        def forward(self, image, label=None):
            x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(image))), 2)
            x = nn.functional.avg_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
            logits = self.head(torch.relu(self.bn3(self.fc(x.flatten(1)))))
            return logits if label is None else nn.functional.cross_entropy(logits, label)

    torch.manual_seed(seed)
    model = Net()
    with torch.no_grad():  # running statistics away from PyTorch's fresh 0 and 1, so using them shows
        for bn in (model.bn1, model.bn2, model.bn3):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model


def export_batch_normed_cnn(path, batch, train, seed=0):
    """batch_normed_cnn(seed) exported for [batch] 3x16x16 images (opset 17): in
    train mode (image, label) -> loss, its BatchNormalizations training_mode=1;
    in eval mode image -> logits, the BatchNormalizations kept as nodes (not
    folded into the convolutions) so trained statistics merge into them.
    Returns the module (tracing in train mode moved its running statistics once)."""
    import torch
    model = batch_normed_cnn(seed)
    if train:
        model.train()
        torch.onnx.export(model, (torch.zeros(batch, 3, 16, 16), torch.zeros(batch, dtype=torch.long)), path,
                          dynamo=False, opset_version=17, input_names=["image", "label"], output_names=["loss"],
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    else:
        model.eval()
        torch.onnx.export(model, (torch.zeros(batch, 3, 16, 16),), path, dynamo=False, opset_version=17,
                          input_names=["image"], output_names=["logits"], do_constant_folding=False)
    return model


def losses_of(metrics):
    """The per-step losses an `sdrun train --metrics FILE` run wrote."""
    return [json.loads(l)["loss"] for l in open(metrics) if '"loss"' in l]


def torch_train_on_images(model, folder, steps, accum, batch, lr, weight_decay, clip, adam_eps):
    """Trains `model` (forward(image, label) -> loss) in PyTorch as `sdrun
    train --no-shuffle --data folder` does: AdamW with weight decay on rank >=
    2 parameters only, `accum` micro-batches of `batch` examples per step in
    file order (wrapping), the global-norm clip; returns the per-step losses
    (the micro-batches' mean)."""
    import numpy as np
    import torch
    images = torch.tensor(np.load(os.path.join(folder, "image.npy")))
    labels = torch.tensor(np.load(os.path.join(folder, "label.npy")))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, eps=adam_eps)
    losses, cursor, n = [], 0, len(labels)
    for _ in range(steps):
        opt.zero_grad()
        total = 0.0
        for _ in range(accum):
            rows = [(cursor + i) % n for i in range(batch)]
            cursor += batch
            loss = model(images[rows], labels[rows])
            (loss / accum).backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(total / accum)
    return losses


def write_image_data(folder, count, seed):
    """`count` random 3x16x16 images and classes in [0, 5) as folder/image.npy and folder/label.npy."""
    import numpy as np
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "image.npy"), rng.standard_normal((count, 3, 16, 16)).astype(np.float32))
    np.save(os.path.join(folder, "label.npy"), rng.integers(0, 5, count).astype(np.int64))
    return folder


def leftovers(*folders):
    """Temp files and folders (names holding ".tmp") a write left behind under folders."""
    found = []
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            found += [os.path.join(root, n) for n in dirs + files if ".tmp" in n]
    return found


def ort_run(model, feeds):
    """Runs an ONNX model with ONNX Runtime (the PyPI package, CPU, the
    benchmarks' session settings: bench/ort_run.py); returns {output name: array}."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from ort_run import make_session
    sess = make_session(model, threads=0, opt_level="all")
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def sh(cmd, **kw):
    """Runs cmd, returns its stdout; raises with the end of stderr if it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return r.stdout


def one_line_file(folder, name, line):
    """folder/name holding `line` as one JSON line (a bad-data case); returns its path."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(json.dumps(line) + "\n")
    return path


def run_module_script(sdrun, script, timeout=600):
    """Runs the Python `script` with the sdc module of sdrun's build on the path, as a user would; (its
    stdout read as JSON, or None when it failed, and its stderr)."""
    build = os.path.dirname(os.path.dirname(sdrun))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, PYTHONPATH=os.path.join(build, "python")))
    return (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def clean_error_problems(cmd, must_contain=(), no_files=(), timeout=60):
    """Bad input must end with exit code 1 (2 for usage errors), exactly one
    stderr line naming the problem, no hang and no file left behind. Returns
    (problems, the error line)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ["hung"], ""
    problems = []
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    if r.returncode not in (1, 2):  # negative: killed by a signal
        problems.append(f"exit code {r.returncode}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines: {r.stderr!r}")
    problems += [f"message lacks {m!r}: {r.stderr.strip()!r}" for m in must_contain if m not in r.stderr]
    problems += [f"left {f} behind" for f in no_files if os.path.exists(f)]
    return problems, lines[0] if lines else ""


def report_checks(test, results):
    """Prints every (name, ok, detail) check; the exit status: 1 if any failed or none ran."""
    failed = 0
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
        failed += not ok
    print(f"{test}: {len(results) - failed}/{len(results)} passed")
    return 1 if failed or not results else 0


def train_peft_model(model, rng, vocab, steps, batch, seq, lr=1e-2):
    """`steps` PyTorch AdamW steps of a PEFT model on random token rows (the
    labels are the inputs), then eval mode; returns the model."""
    import torch
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        ids = torch.tensor(rng.integers(0, vocab, (batch, seq)))
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def peft_steps(model, rows, steps, batch, lr, eps=1e-8):
    """`steps` PyTorch AdamW steps (no weight decay) of a causal LM on token
    rows, batched in order as sdrun train --no-shuffle batches them: row
    (step * batch + i) mod len(rows). Returns the losses."""
    import torch
    import torch.nn.functional as F
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, eps=eps, weight_decay=0.0)
    losses = []
    for step in range(steps):
        ids = torch.tensor([rows[(step * batch + i) % len(rows)] for i in range(batch)])
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def export_with_positions(model, path, batch, seq):
    """A transformers causal LM exported as Optimum exports a decoder without
    its cache: inputs input_ids, attention_mask and position_ids (dynamic
    batch and sequence), output logits."""
    import torch
    import transformers.masking_utils
    # transformers' packed-sequence check traces to aten::diff, which the TorchScript exporter cannot export.
    transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None
    forward = type(model).forward
    model.forward = lambda ids, mask, pos: forward(model, input_ids=ids, attention_mask=mask, position_ids=pos,
                                                   use_cache=False).logits
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    axes = {0: "batch", 1: "seq"}
    try:
        torch.onnx.export(model, (ids, torch.ones_like(ids), torch.arange(seq).expand(batch, seq)), path,
                          input_names=["input_ids", "attention_mask", "position_ids"], output_names=["logits"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "position_ids": axes, "logits": axes})
    finally:
        del model.forward


def write_token_rows(path, rng, vocab, lines, seq):
    """A JSONL training file of `lines` random token rows of length `seq`."""
    import json
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(json.dumps({"input_ids": rng.integers(0, vocab, seq).tolist()}) + "\n")


def write_pair_rows(path, rng, vocab, lines, prompt=(1, 6), completion=(1, 10), unpaired=False):
    """A JSONL file of `lines` random preference pairs (TRL's tokenized
    prompt_ids, chosen_ids, rejected_ids), each part's length drawn from
    [lo, hi) of `prompt` or `completion`; with `unpaired`, KTO's examples
    (prompt_ids, completion_ids, label; desirable and not in turn)."""
    import json
    ids = lambda lo, hi: rng.integers(0, vocab, size=int(rng.integers(lo, hi))).tolist()
    with open(path, "w") as f:
        for i in range(lines):
            line = ({"prompt_ids": ids(*prompt), "completion_ids": ids(*completion), "label": i % 2 == 0} if unpaired
                    else {"prompt_ids": ids(*prompt), "chosen_ids": ids(*completion), "rejected_ids": ids(*completion)})
            f.write(json.dumps(line) + "\n")


def sdrun_logits(sdrun, plan, adapter, ids, tmp, tag):
    """`sdrun infer PLAN [--adapter ADAPTER]` on token ids (or a dict of
    named inputs): its first output."""
    import numpy as np
    inputs = []
    for name, value in (ids if isinstance(ids, dict) else {"input_ids": ids}).items():
        x = os.path.join(tmp, f"{tag}_{name}.npy")
        np.save(x, value)
        inputs += ["--input", f"{name}={x}"]
    out = os.path.join(tmp, f"{tag}_out")
    sh([sdrun, "infer", plan, *(["--adapter", adapter] if adapter else []), *inputs, "--output-dir", out,
        "--output-format", "npy"])
    return np.load(os.path.join(out, "output_0.npy"))


def embedding_model(path):
    """An attention-free token model (Gather, MatMul): neither packing nor a KV cache has
    attention to work on."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [256, 8], rng.standard_normal(256 * 8).astype(np.float32))
    head = helper.make_tensor("head", TensorProto.FLOAT, [8, 256], rng.standard_normal(8 * 256).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "input_ids"], ["x"]), helper.make_node("MatMul", ["x", "head"], ["logits"])],
        "embed", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 256])], [emb, head])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def plan_steps(sdrun, plan):
    """{op: number of steps} over a plan's entries, as `sdrun inspect --kernels cpu` lists them."""
    steps = {}
    for line in sh([sdrun, "inspect", plan, "--kernels", "cpu"]).splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "steps":
            steps[fields[0]] = int(fields[1])
    return steps


def rel_err(got, want):
    """Largest absolute difference relative to the largest reference magnitude."""
    import numpy as np
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def loss_gap(ours, want):
    """Largest relative difference of two runs' per-step losses; inf when
    one run has fewer steps."""
    return max(abs(a - b) / abs(b) for a, b in zip(ours, want)) if len(ours) == len(want) else float("inf")


def max_abs_diff(got, want):
    """Largest absolute difference in float64, where equal values (infinities
    of one sign included) and NaN against NaN count 0, and a NaN against a
    number counts inf: a NaN can neither hide a difference nor be one."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got - want))
    return float(np.max(np.where(np.isnan(diff), np.inf, diff), initial=0))


def norm_rel_err(got, want):
    """Relative difference in the Frobenius norm, in float64."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def peft_match(pm, adapter_dir, losses, want, steps):
    """How far an `sdrun train --save-adapter` run is from PEFT's own run of
    `steps` steps: (worst relative loss error, worst per-tensor error and its
    key, a problem string or ""). Tensors (LoRA factors and modules_to_save)
    pair by PEFT's saved keys; each is compared relative in the Frobenius norm,
    since AdamW moves an element whose gradient is near zero by float noise in
    either implementation."""
    from safetensors.numpy import load_file
    loss_err = loss_gap(losses, want) if len(losses) == steps else float("inf")
    theirs = {k.replace(".default", "").replace(".modules_to_save", ""): v.detach().numpy()
              for k, v in pm.state_dict().items() if "lora_" in k or "modules_to_save" in k}
    ours = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    errs = {k: norm_rel_err(ours[k], v) for k, v in theirs.items() if k in ours}
    worst = max(errs, key=errs.get) if errs else "none"
    problem = "" if set(ours) == set(theirs) else f"{len(ours)} tensors, PEFT has {len(theirs)}"
    return loss_err, errs.get(worst, float("inf")), worst, problem
