"""The engine benchmark on a GPU: the same requests and comparison as `benchmarks/engine_bench.py`,
with a larger Llama (about 200M parameters: hidden 1024, 16 layers, 16 heads / 4 KV heads), bfloat16,
CUDA, and a 256-way concurrency level on top of 1, 8 and 64.

    python benchmarks/gpu/engine_gpu_bench.py                       # on a CUDA machine
    python benchmarks/gpu/engine_gpu_bench.py --device cpu --quick --hidden 64 --layers 2 --heads 4 \
        --kv-heads 2 --intermediate 128 --dtype float32 --concurrency 1 8   # a CPU smoke run (tests do this)

Every option of engine_bench.py can be overridden. Ends with the same RESULT line (when 64 is among
the concurrency levels).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from engine_bench import main

GPU_DEFAULTS = {
    "device": "cuda",
    "dtype": "bfloat16",
    "hidden": 1024,
    "layers": 16,
    "heads": 16,
    "kv_heads": 4,
    "intermediate": 4096,
    "vocab": 512,
    "requests": 256,
    "c1_requests": 8,
    "max_prompt_words": 400,
    "max_new": 512,
    "concurrency": [1, 8, 64, 256],
}


if __name__ == "__main__":
    argv = sys.argv[1:]
    wants_cuda = "--device" not in argv or argv[argv.index("--device") + 1].startswith("cuda")
    if wants_cuda and not torch.cuda.is_available():
        sys.exit("CUDA is not available to this torch build; pass --device cpu for a smoke run")
    main(argv, **GPU_DEFAULTS)
