#!/bin/bash
# The GPU checks in one ~12-minute window, each bounded by its own timeout so that one failing or
# running long still leaves the other's figures: the calc demo trained on CUDA (a shorter RL budget
# than the CPU demo's 5 minutes, default 3), then the engine benchmark at 1, 64 and 256 concurrent
# requests (the 8-way level is left out: HF's 32 static batches of up to 512 tokens take minutes).
#
#   bash benchmarks/gpu/run_all.sh [LOG_DIR]       # logs: LOG_DIR/{env.txt,calc.log,engine.log,real_engine.log}
#
# Environment: PYTHON (default python3), CALC_MINUTES (3), CALC_TIMEOUT_S (330), ENGINE_TIMEOUT_S (210),
# ENGINE_CONCURRENCY ("1 64 256"), REAL_ENGINE_TIMEOUT_S (150).
set -u
cd "$(dirname "$0")/../.."
LOG_DIR=${1:-gpu-logs}
PYTHON=${PYTHON:-python3}
mkdir -p "$LOG_DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    echo "cpus: $(nproc)"
    "$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
} > "$LOG_DIR/env.txt" 2>&1
timeout "${CALC_TIMEOUT_S:-330}" "$PYTHON" benchmarks/gpu/train_calc_gpu.py --minutes "${CALC_MINUTES:-3}" \
    > "$LOG_DIR/calc.log" 2>&1
echo "calc exit code: $?" >> "$LOG_DIR/env.txt"
# shellcheck disable=SC2086  # the concurrency levels are meant to split into arguments
timeout "${ENGINE_TIMEOUT_S:-210}" "$PYTHON" benchmarks/gpu/engine_gpu_bench.py \
    --concurrency ${ENGINE_CONCURRENCY:-1 64 256} --c1-requests 4 > "$LOG_DIR/engine.log" 2>&1
echo "engine exit code: $?" >> "$LOG_DIR/env.txt"
# The real-model recipe (SmolLM2-135M-Instruct, bf16): needs the [models] extra; it converts the model
# into the cache on first use (~20 s).
timeout "${REAL_ENGINE_TIMEOUT_S:-150}" "$PYTHON" benchmarks/gpu/real_engine_gpu_bench.py \
    > "$LOG_DIR/real_engine.log" 2>&1
echo "real engine exit code: $?" >> "$LOG_DIR/env.txt"
cat "$LOG_DIR/env.txt"
grep -h "RESULT" "$LOG_DIR/calc.log" "$LOG_DIR/engine.log" "$LOG_DIR/real_engine.log"
