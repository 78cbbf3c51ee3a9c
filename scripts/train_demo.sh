#!/usr/bin/env bash
# Training demo, all on CPU with public-domain text from Debian:
#   1. export a small byte-level GPT (examples/export_models.py)
#   2. pre-train it from scratch with full fine-tuning on the King James Bible
#      (bible-kjv), merge the trained weights back into ONNX (sdc merge --weights)
#   3. LoRA-fine-tune the pre-trained model on fortune cookies (fortune-mod, one
#      example per fortune, packed several to a row: sdc compile --packing),
#      merge the adapter into ONNX and check it with ONNX Runtime
#   4. sample with sdrun generate before and after the LoRA fine-tuning
# STEPS / LORA_STEPS override the step counts.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SD_PYTHON:-.venv/bin/python} # the project venv (scripts/install-deps.sh)
BUILD_DIR=${BUILD_DIR:-build}
SDC="$BUILD_DIR/tools/sdc"
SDRUN="$BUILD_DIR/tools/sdrun"
OUT=${DEMO_DIR:-$BUILD_DIR/train_demo}
STEPS=${STEPS:-1500}
LORA_STEPS=${LORA_STEPS:-300}
THREADS=$(nproc)
mkdir -p "$OUT"

echo "== 1. export a byte-level GPT (d=128, 4 layers, context 128) with PyTorch"
"$PY" - "$OUT/gpt.onnx" <<'PY' 2>/dev/null
import sys
sys.path.insert(0, "examples")
import torch
from export_models import Gpt, export_gpt
torch.manual_seed(0)
export_gpt(Gpt(d=128, layers=4, heads=4, block=128), sys.argv[1], torch.zeros((8, 128), dtype=torch.long), 17)
PY

echo "== 2. data: the King James Bible (bible-kjv) in 128-byte chunks, fortune cookies (fortune-mod) one per example"
bible "Gen1:1-Rev22:21" | sed -E 's/^ *[0-9]+ //' |
  "$PY" examples/text_to_jsonl.py --chunk 128 --eval-every 100 --eval-out "$OUT/bible_eval.jsonl" \
  > "$OUT/bible.jsonl"
cat /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature /usr/share/games/fortunes/riddles |
  "$PY" examples/text_to_jsonl.py --chunk 128 --records % --eval-every 20 \
  --eval-out "$OUT/fortune_eval.jsonl" > "$OUT/fortune.jsonl"
wc -l "$OUT"/bible.jsonl "$OUT"/fortune.jsonl | sed 's/^/   /'

echo "== 3. pre-train: sdc compile --peft none, sdrun train ($STEPS steps, batch 8, $THREADS threads)"
"$SDC" compile "$OUT/gpt.onnx" --peft none --shapes input_ids=8x128 -o "$OUT/pretrain.sdp"
"$SDRUN" train "$OUT/pretrain.sdp" --data "$OUT/bible.jsonl" --eval-data "$OUT/bible_eval.jsonl" \
  --steps "$STEPS" --lr 3e-3 --lr-schedule cosine --warmup-steps 50 --weight-decay 0.1 --clip-norm 1 \
  --threads "$THREADS" --metrics "$OUT/pretrain_metrics.jsonl" --save-weights "$OUT/pretrained.safetensors"
"$SDC" merge "$OUT/gpt.onnx" --weights "$OUT/pretrained.safetensors" -o "$OUT/pretrained.onnx"
echo "   merged into $OUT/pretrained.onnx"

echo "== 4. LoRA: sdc compile pretrained.onnx --peft lora --target-modules qkv,proj,fc1,fc2 --dry-run"
LORA=(--peft lora --target-modules qkv,proj,fc1,fc2 --lora-r 16 --lora-alpha 32)
"$SDC" compile "$OUT/pretrained.onnx" "${LORA[@]}" --dry-run | sed 's/^/   /'
"$SDC" compile "$OUT/pretrained.onnx" "${LORA[@]}" --packing --shapes input_ids=8x128 -o "$OUT/lora.sdp"
PROMPT="The Lord said unto"
echo "   before LoRA (greedy): $("$SDRUN" generate "$OUT/lora.sdp" --prompt "$PROMPT" --max-new-tokens 80 \
  --temperature 0 | tr '\n' ' ')"
"$SDRUN" train "$OUT/lora.sdp" --data "$OUT/fortune.jsonl" --eval-data "$OUT/fortune_eval.jsonl" \
  --steps "$LORA_STEPS" --lr 2e-3 --lr-schedule cosine --warmup-steps 20 --threads "$THREADS" \
  --metrics "$OUT/lora_metrics.jsonl" --save-adapter "$OUT/adapter"
echo "   adapter (HF PEFT layout): $(ls "$OUT/adapter" | tr '\n' ' ')"
echo "   after LoRA (greedy):  $("$SDRUN" generate "$OUT/lora.sdp" --adapter "$OUT/adapter" --prompt "$PROMPT" \
  --max-new-tokens 80 --temperature 0 | tr '\n' ' ')"
echo "   after LoRA (sampled): $("$SDRUN" generate "$OUT/lora.sdp" --adapter "$OUT/adapter" --prompt "$PROMPT" \
  --max-new-tokens 80 --temperature 0.8 --top-k 20 --seed 1 | tr '\n' ' ')"

echo "== 5. sdc merge the adapter into ONNX; ONNX Runtime runs it"
"$SDC" merge "$OUT/pretrained.onnx" --adapter "$OUT/adapter" -o "$OUT/fortune.onnx"
"$PY" -c "import numpy as np; np.save('$OUT/prompt.npy', np.frombuffer(b'$PROMPT'.ljust(128), np.uint8).astype(np.int64)[None])"
"$SDC" compile "$OUT/fortune.onnx" --shapes input_ids=1x128 -o "$OUT/fortune.sdp"
"$SDRUN" infer "$OUT/fortune.sdp" --input "input_ids=$OUT/prompt.npy" --output-dir "$OUT/fortune.sd" --output-format npy
"$PY" bench/ort_run.py "$OUT/fortune.onnx" --input "input_ids=$OUT/prompt.npy" --output-dir "$OUT/fortune.ort"
"$PY" -c "
import numpy as np
a = np.load('$OUT/fortune.sd/output_0.npy'); b = np.load('$OUT/fortune.ort/logits.npy')
print(f'   merged model logits: max |sdrun - onnxruntime| = {np.abs(a - b).max():.2e}')"
echo
echo "training demo done: models, plans, adapter and metrics in $OUT"
