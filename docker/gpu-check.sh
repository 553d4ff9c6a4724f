#!/usr/bin/env bash
# GPU first contact, in one command, on a machine with an NVIDIA GPU, Docker and the NVIDIA container
# toolkit. From the repository root:
#
#     docker/gpu-check.sh [OUT]            # OUT defaults to gpu-check-<date>-<time>
#
# It builds the image, runs `pytest -m gpu` in it, runs the packaged GPU matrix (profiles/matrix-gpu.toml:
# the corpus' tiny models and bert-base, FP32/FP16/INT8, trt and ort-cuda), gathers the cells, and leaves
# one folder to read or attach to an issue: nvidia-smi.txt (nvidia-smi -q), logs/<step>.log, results/
# (cells/*.json, the builds), report.html, report.md and summary.txt (each step's exit code).
#
# Settings (environment): IMAGE (default trt-pipeline), MATRIX (default profiles/matrix-gpu.toml),
# BASE (docker build --build-arg BASE=..., a TensorRT NGC image). GPU_CHECK_HERE=1 runs every step with this
# machine's python instead of the image (no docker build): without a GPU, `pytest -m gpu` is then recorded
# skipped and the trt and ort-cuda cells skipped with their reason, which is how the tests run this script.
# In the image, no TensorRT or GPU is a failure of the check (exit 1).
set -u
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}
IMAGE=${IMAGE:-trt-pipeline}
MATRIX=${MATRIX:-profiles/matrix-gpu.toml}
mkdir -p "$OUT/logs"
: > "$OUT/summary.txt"
failed=0

step() {  # step NAME COMMAND...: run it, log to logs/NAME.log, record its exit code
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$OUT/logs/$name.log"
    "$@" >> "$OUT/logs/$name.log" 2>&1
    local code=$?
    echo "$name: exit $code" | tee -a "$OUT/summary.txt"
    [ "$code" -eq 0 ] || failed=1
}

in_image() {  # run `python ARGS` in the image (or here with GPU_CHECK_HERE=1), this folder mounted at its path
    if [ "${GPU_CHECK_HERE:-0}" = 1 ]; then
        python "$@"
    else
        docker run --rm --gpus all -v "$PWD:$PWD" -w "$PWD" -e IMAGE_DIGEST="$(docker image inspect --format '{{.Id}}' "$IMAGE")" \
            --entrypoint python "$IMAGE" "$@"
    fi
}

if command -v nvidia-smi > /dev/null; then
    nvidia-smi -q > "$OUT/nvidia-smi.txt" 2>&1
else
    echo "nvidia-smi not found: no NVIDIA driver on this machine" > "$OUT/nvidia-smi.txt"
fi
if [ "${GPU_CHECK_HERE:-0}" = 1 ]; then
    echo "docker-build: skipped (GPU_CHECK_HERE=1: the steps run with this machine's python)" | tee -a "$OUT/summary.txt"
else
    step docker-build docker build -t "$IMAGE" ${BASE:+--build-arg BASE="$BASE"} .
fi
missing=$(in_image -c "from trt.capability import tensorrt_missing; print(tensorrt_missing() or '')" 2>&1)
if [ -n "$missing" ]; then  # tests/test_gpu.py fails (by design) where there is no TensorRT or GPU
    echo "pytest-gpu: skipped ($missing)" | tee -a "$OUT/summary.txt"
    failed=$([ "${GPU_CHECK_HERE:-0}" = 1 ] && echo $failed || echo 1)
else
    step pytest-gpu in_image -m pytest -m gpu tests/test_gpu.py -q -rs -p no:cacheprovider
fi
step jobs-run in_image -m pipeline jobs run "$MATRIX" --out "$OUT/results"
step gather-html in_image -m pipeline jobs gather "$OUT/results" -o "$OUT/report.html"
step gather-md in_image -m pipeline jobs gather "$OUT/results" -o "$OUT/report.md"
echo "gpu-check: $( [ $failed = 0 ] && echo ok || echo 'a step failed (see summary.txt)' ); everything is in $OUT/"
exit $failed
