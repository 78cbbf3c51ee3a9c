#!/usr/bin/env bash
# The LLM demo, all on CPU with public-domain text from Debian (bible-kjv):
#   1. a byte-level BPE tokenizer trained on the King James Bible with the
#      tokenizers library, ChatML chat template (examples/chat_demo.py)
#   2. a small Llama-architecture model (RMSNorm, rotary, SwiGLU, grouped-query
#      attention) from a transformers config, exported with torch.onnx.export
#   3. pre-training on the KJV, one verse per example, packed several to a row
#      (sdc compile --packing; sdrun train --tokenizer)
#   4. LoRA on chat conversations ("What does Proverbs 3:5 say?" -> the verse),
#      loss on the assistant turns only, and sdrun generate --chat before and
#      after, decoding through the plan's KV cache (sdc compile --kv-cache)
#   5. sdc merge of the adapter; the merged model generates the same reply
#      through its own cached plan, and ONNX Runtime runs it
# STEPS / LORA_STEPS override the step counts.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SD_PYTHON:-.venv/bin/python}
BUILD_DIR=${BUILD_DIR:-build}
SDC="$BUILD_DIR/tools/sdc"
SDRUN="$BUILD_DIR/tools/sdrun"
OUT=${DEMO_DIR:-$BUILD_DIR/llm_demo}
STEPS=${STEPS:-600}
LORA_STEPS=${LORA_STEPS:-300}
THREADS=$(nproc)
mkdir -p "$OUT"

echo "== 1. tokenizer and data"
"$PY" examples/chat_demo.py tokenizer "$OUT/tokenizer"
"$PY" examples/chat_demo.py data "$OUT"
echo "   $(wc -l < "$OUT/kjv.jsonl") verses for pre-training, $(wc -l < "$OUT/chat.jsonl") conversations for LoRA"
echo "   $(head -c 160 "$OUT/chat.jsonl")..."
echo "   sdrun tokenize: $(echo 'In the beginning God created the heaven and the earth.' |
  "$SDRUN" tokenize --tokenizer "$OUT/tokenizer")"

echo "== 2. export a small Llama with PyTorch (TorchScript, opset 17)"
"$PY" examples/chat_demo.py model "$OUT/tokenizer" "$OUT/llama.onnx" 2>/dev/null

echo "== 3. pre-train: sdc compile --peft none --packing, sdrun train --tokenizer ($STEPS steps, 8 x 128 tokens)"
"$SDC" compile "$OUT/llama.onnx" --peft none --packing --shapes input_ids=8x128 -o "$OUT/pretrain.sdp"
"$SDRUN" train "$OUT/pretrain.sdp" --data "$OUT/kjv.jsonl" --tokenizer "$OUT/tokenizer" --truncate \
  --steps "$STEPS" --lr 3e-3 --lr-schedule cosine --warmup-steps 30 --weight-decay 0.1 --clip-norm 1 \
  --threads "$THREADS" --metrics "$OUT/pretrain_metrics.jsonl" --save-weights "$OUT/pretrained.safetensors"
"$SDC" merge "$OUT/llama.onnx" --weights "$OUT/pretrained.safetensors" -o "$OUT/pretrained.onnx"

echo "== 4. LoRA on chat data (q/k/v/o, gate/up/down projections), loss on assistant turns"
LORA=(--peft lora --target-modules q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --lora-r 16 --lora-alpha 32)
"$SDC" compile "$OUT/pretrained.onnx" "${LORA[@]}" --dry-run | sed 's/^/   /' | head -4
"$SDC" compile "$OUT/pretrained.onnx" "${LORA[@]}" --shapes input_ids=8x64 --kv-cache 256 --prefill-chunk 64 \
  -o "$OUT/lora.sdp"   # training entries plus prefill/decode with a 256-token KV cache
QUESTION="What does Proverbs 3:5 say?"
echo "   user: $QUESTION"
echo "   before LoRA: $("$SDRUN" generate "$OUT/lora.sdp" --tokenizer "$OUT/tokenizer" --chat --prompt "$QUESTION" \
  --max-new-tokens 40 --temperature 0 --threads "$THREADS" | tr '\n' ' ')"
"$SDRUN" train "$OUT/lora.sdp" --data "$OUT/chat.jsonl" --tokenizer "$OUT/tokenizer" --truncate \
  --steps "$LORA_STEPS" --lr 2e-3 --lr-schedule cosine --warmup-steps 20 --threads "$THREADS" \
  --metrics "$OUT/lora_metrics.jsonl" --save-adapter "$OUT/adapter"
echo "   after LoRA:  $("$SDRUN" generate "$OUT/lora.sdp" --adapter "$OUT/adapter" --tokenizer "$OUT/tokenizer" \
  --chat --prompt "$QUESTION" --max-new-tokens 40 --temperature 0 --threads "$THREADS" | tr '\n' ' ')"
echo "   (the KJV: Trust in the LORD with all thine heart; and lean not unto thine own understanding.)"

echo "== 5. sdc merge the adapter into ONNX; the merged model generates, and ONNX Runtime runs it"
"$SDC" merge "$OUT/pretrained.onnx" --adapter "$OUT/adapter" -o "$OUT/chat.onnx"
"$SDC" compile "$OUT/chat.onnx" --kv-cache 256 -o "$OUT/chat.sdp"
echo "   merged:      $("$SDRUN" generate "$OUT/chat.sdp" --tokenizer "$OUT/tokenizer" --chat --prompt "$QUESTION" \
  --max-new-tokens 40 --temperature 0 --threads "$THREADS" | tr '\n' ' ')"
"$PY" - "$OUT" <<'PY'
import sys
import numpy as np
import onnxruntime as ort
out = sys.argv[1]
ids = np.zeros((8, 128), np.int64)
logits = ort.InferenceSession(f"{out}/chat.onnx", providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
print(f"   ONNX Runtime ran the merged model: logits {logits.shape}, finite: {bool(np.isfinite(logits).all())}")
PY
echo
echo "LLM demo done: tokenizer, models, plans, adapter and metrics in $OUT"
