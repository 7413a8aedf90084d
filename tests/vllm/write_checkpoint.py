"""Writes a vLLM-loadable checkpoint (checkpoint.py) from a torch.save'd
{"config": HF config, "tensors": {HF name: logical tensor}}: quantized as the
config's quantization_config says, then a READY file.

    build/vllm-venv/bin/python tests/vllm/write_checkpoint.py IN.pt OUT_DIR
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

import torch  # noqa: E402

import checkpoint  # noqa: E402


def main():
    src, out = sys.argv[1], sys.argv[2]
    d = torch.load(src, weights_only=True)
    checkpoint.write(out, d["config"], checkpoint.checkpoint_tensors(d["config"], d["tensors"]))
    open(os.path.join(out, "READY"), "w").close()


if __name__ == "__main__":
    main()
