"""AdapterHub's own bottleneck adapters (the `adapters` library, which pins
transformers 4.57, so this runs in .venv-optimum) trained as test_bottleneck
trains sdc's: the test's model weights, the plan's starting adapter, AdamW
steps on the same rows. Writes OUT.json (losses, logits of --ids after
training) and OUT.safetensors (the trained adapter, AdapterHub's keys).

With --classify it trains test_classify's MiniLM classifier instead (the
adapter in its BERT encoder, the head beside it). With --save DIR it also saves the trained adapter as AdapterHub saves one,
named "hub" (loaded back under that name: its keys carry it). With --load DIR
it only loads an adapter folder (sdrun train --save-adapter's) with
load_adapter and writes the logits of --ids to OUT.logits.npy.

Usage: adapterhub_reference.py --arch A --base W.safetensors --config C
       [--reduction-factor R] [--non-linearity F] [--leave-out N,...] [--autocast bf16]
       [--scaling S|learned|channel] [--use-gating 1] [--init I]
       --start S.safetensors --rows FILE.jsonl --steps N --batch B --lr X
       --ids IDS.npy --out OUT [--save DIR]
       adapterhub_reference.py --arch A --base W.safetensors --load DIR --ids IDS.npy --out OUT
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, HERE)


def bottleneck_config(name, **fields):
    """AdapterHub's configuration class for sdc's --bottleneck-config NAME."""
    import adapters
    return {"seq_bn": adapters.SeqBnConfig, "double_seq_bn": adapters.DoubleSeqBnConfig,
            "par_bn": adapters.ParBnConfig}[name](**fields)


def start_from_plan(model, path):
    """Sets the model's trainable tensors to the plan's start (PATH, keyed by
    the plan's names, which must be exactly AdapterHub's, shape for shape);
    returns them by name."""
    import torch
    from safetensors.torch import load_file
    start = load_file(path)
    trained = {n: t for n, t in model.named_parameters() if t.requires_grad}
    if set(start) != set(trained):
        sys.exit(f"tensors differ: the plan's {sorted(set(start) - set(trained))[:4]}, AdapterHub's "
                 f"{sorted(set(trained) - set(start))[:4]}")
    with torch.no_grad():
        for n, t in trained.items():
            if tuple(start[n].shape) != tuple(t.shape):
                sys.exit(f"{n}: the plan's shape {tuple(start[n].shape)}, AdapterHub's {tuple(t.shape)}")
            t.copy_(start[n])
    return trained


def classify(a):
    """MiniLM with test_classify's linear head: the adapter in its BertModel
    (AdapterHub's BERT layout: post-LN blocks), the head trained beside it,
    on test_classify's batches (--rows: a JSON list of [ids, label])."""
    import adapters
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    import test_classify

    torch.set_num_threads(2)
    model = test_classify.Classifier.build(7)
    adapters.init(model.bert)
    if a.load:
        model.bert.load_adapter(a.load, use_safetensors=True, set_active=True)
        head = load_file(os.path.join(a.load, "adapter.safetensors"))
        with torch.no_grad():
            model.classifier.weight.copy_(head["classifier.weight"])
            model.classifier.bias.copy_(head["classifier.bias"])
    else:
        model.bert.add_adapter("bottleneck", config=bottleneck_config(a.config))
        model.bert.train_adapter("bottleneck")
        trained = start_from_plan(model, a.start)
        model.eval()  # the plan has no dropout
        test_classify.STEPS = a.steps
        rows = [(r[0], r[1]) for r in json.load(open(a.rows))]
        opt = torch.optim.AdamW(list(trained.values()), lr=a.lr, eps=1e-8, weight_decay=0.0)
        losses = []
        for ids, mask, labels in test_classify.batches(rows):
            loss = F.cross_entropy(model(torch.tensor(ids), torch.tensor(mask)), torch.tensor(labels))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        json.dump({"losses": losses}, open(a.out + ".json", "w"))
        save_file({n: t.detach().contiguous() for n, t in trained.items()}, a.out + ".safetensors")
    model.eval()
    mask_path = os.path.join(os.path.dirname(a.ids), os.path.basename(a.ids).replace("ids", "mask"))
    ids, mask = np.load(a.ids), np.load(mask_path)
    with torch.no_grad():
        np.save(a.out + ".logits.npy", model(torch.tensor(ids), torch.tensor(mask)).numpy())


def main():
    p = argparse.ArgumentParser()
    for flag in ("--arch", "--base", "--config", "--start", "--rows", "--ids", "--out", "--non-linearity",
                 "--leave-out", "--save", "--load", "--autocast", "--scaling", "--use-gating", "--init"):
        p.add_argument(flag)
    p.add_argument("--classify", action="store_true")
    p.add_argument("--reduction-factor", type=float, default=None)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--lr", type=float)
    a = p.parse_args()
    if a.classify:
        return classify(a)

    import adapters
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    import export_hf
    from e2e_util import peft_steps

    torch.set_num_threads(2)
    model = export_hf.build(a.arch, 0)
    base = load_file(a.base)
    missing, unexpected = model.load_state_dict(base, strict=False)
    params = {n for n, _ in model.named_parameters()}
    if unexpected or params & set(missing):
        sys.exit(f"base weights do not fit: missing {sorted(params & set(missing))}, unexpected {unexpected}")
    adapters.init(model)
    ids = torch.tensor(np.load(a.ids))
    if a.load:
        name = model.load_adapter(a.load, use_safetensors=True, set_active=True)
        model.eval()
        with torch.no_grad():
            np.save(a.out + ".logits.npy", model(input_ids=ids).logits.numpy())
        print(name)
        return
    fields = {}
    if a.reduction_factor:
        fields["reduction_factor"] = a.reduction_factor
    if a.non_linearity:
        fields["non_linearity"] = a.non_linearity
    if a.leave_out:
        fields["leave_out"] = [int(i) for i in a.leave_out.split(",")]
    if a.scaling:  # AdapterHub takes a float, "learned" or "channel"
        fields["scaling"] = a.scaling if a.scaling in ("learned", "channel") else float(a.scaling)
    if a.use_gating:
        fields["use_gating"] = True
    if a.init:
        fields["init_weights"] = a.init
    model.add_adapter("bottleneck", config=bottleneck_config(a.config, **fields))
    model.train_adapter("bottleneck")
    model.eval()  # the test's models have no dropout of their own that the plan keeps
    trained = start_from_plan(model, a.start)
    rows = [json.loads(line)["input_ids"] for line in open(a.rows)]
    # --autocast bf16: forward and backward under CPU autocast, as the plan's
    # --precision bf16 computes (products in bf16, f32 weights and loss).
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16")
    with amp:
        losses = peft_steps(model, rows, a.steps, a.batch, a.lr)
    with torch.no_grad(), amp:
        logits = model(input_ids=ids).logits.float().numpy()
    np.save(a.out + ".logits.npy", logits)
    json.dump({"losses": losses}, open(a.out + ".json", "w"))
    save_file({n: t.detach().contiguous() for n, t in trained.items()}, a.out + ".safetensors")
    if a.save:
        import tempfile
        first = tempfile.mkdtemp()
        model.save_adapter(first, "bottleneck", use_safetensors=True)
        model.load_adapter(first, load_as="hub", use_safetensors=True)
        model.save_adapter(a.save, "hub", use_safetensors=True)


if __name__ == "__main__":
    main()
