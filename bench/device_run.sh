#!/usr/bin/env bash
# The GPU and many-core figures of docs/bench-gpu.txt, as one run on a lent GPU machine that reaches
# no registry. Everything it needs travels in CARRY (prepared on the CPU machine by
# bench/device_carry.sh): the bundled model's weights in fp16 (cast back to fp32 here, so both
# pipelines read the same fp32 weights), the shared STS-B and StackFAQ files, and wheels the image
# lacks (faiss-cpu; the server's fastapi, starlette, uvicorn, pydantic).
#
#     OUT=/tmp/out bash bench/device_run.sh [part ...]
#
# Parts, in this order by default: machine inprocess tune serve cores whole. Each writes
# $OUT/<part>.txt and has its own time limit, so one that fails or overruns leaves the others.
set -u
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-/tmp/device-out}
WORK=${WORK:-/tmp/semsearch-device}
WHOLE=${WHOLE:-1000000}
DEVICE=${DEVICE:-cuda}  # cpu: the same run on a CPU machine, to try it before a lease
TUNE=${TUNE:-}  # more tune options (a try on the CPU: --max-minutes 0.2)
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
export PYTHONPATH="$WORK/site:$PWD"
export PY=${PY:-python3} MODEL=$WORK/minilm DATA=$WORK/data WORK DEVICE TUNE

setup() {
    $PY -c "import faiss, fastapi, uvicorn" 2>/dev/null || $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$WORK/site" "$CARRY"/*.whl || return 1
    [ -d "$DATA" ] || tar -xJf "$CARRY/data.tar.xz" -C "$WORK" || return 1
    [ -f "$MODEL/model.safetensors" ] && return 0
    tar -xJf "$CARRY/minilm16.tar.xz" -C "$WORK" && mv "$WORK/minilm16" "$MODEL" || return 1
    $PY - "$MODEL/model.safetensors" <<'EOF'
import sys
from safetensors.torch import load_file, save_file
path = sys.argv[1]
weights = load_file(path)
save_file({k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}, path, {"format": "pt"})
EOF
}

part() {  # part NAME SECONDS COMMAND...: the command's output in $OUT/NAME.txt, timed
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local started=$SECONDS
    local run=("$@")
    [ "$(type -t "$1")" = function ] && run=(bash -c "$(declare -f "$1"); $*")
    { echo "\$ $*"; timeout "$limit" "${run[@]}" 2>&1; echo "(exit $?, $((SECONDS - started)) s)"; } \
        | tee "$OUT/$name.txt" | tail -40
}

machine() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    echo "cores: $(nproc)"; lscpu | grep -E "Model name|Flags" | cut -c1-200
    $PY -c "import torch, transformers, sentence_transformers as st, onnxruntime as ort; \
print('torch', torch.__version__, 'transformers', transformers.__version__, \
'sentence-transformers', st.__version__, 'onnxruntime', ort.__version__)"
}

tune() {
    local started=$SECONDS
    $PY -m search.cli tune --pairs "$DATA/stsb/stsb-train.tsv" -o "$WORK/tuned" --model "$MODEL" \
        --device "$DEVICE" --epochs 4 $TUNE || return 1
    echo "tune on $DEVICE, 4 epochs: $((SECONDS - started)) s (the process, model load and export included)"
    for m in "$MODEL" "$WORK/tuned"; do
        echo "STS-B dev, $m:"
        $PY -m search.cli evaluate sts "$DATA/stsb/stsb-dev.tsv" --model "$m"
    done
}

setup || { echo "setup failed"; exit 1; }
for name in "${@:-machine inprocess tune serve cores whole}"; do
    for p in $name; do
        case $p in
        machine) part machine 60 machine ;;
        inprocess) part inprocess 150 $PY bench/devices.py --device "$DEVICE" --cores none \
            --model "$MODEL" --shared "$DATA" ;;
        tune) part tune 150 tune ;;
        whole) part whole 200 $PY bench/devices.py --device "$DEVICE" --no-in-process --cores none \
            --whole "$WHOLE" --model "$MODEL" --shared "$DATA" ;;
        serve) part serve 120 $PY bench/encode_serve.py --texts 3000 --devices "$DEVICE,cpu" \
            --model "$MODEL" --shared "$DATA" ;;
        cores) part cores 150 $PY bench/devices.py --device cpu --no-in-process --cores 2,4,8,16 \
            --limit 4000 --model "$MODEL" --shared "$DATA" ;;
        *) echo "unknown part $p" ;;
        esac
    done
done
