#!/usr/bin/env bash
# vLLM 0.33's Hopper / Blackwell kernels on real vLLM CPU ranks
# (tests/vllm/kernels.py, docs/kernels.md), in build/vllm-venv: each case
# selects the kernels a GPU picks (patching only the selection), refits a
# vLLM rank twice from a BF16 HF rank through reshard.vllm.WorkerRefit, and
# compares every parameter and buffer with a fresh vLLM load, bit for bit:
#  - sm90-fp8-ep: CUTLASS block FP8 linears, FlashInfer CUTLASS experts
#    ([up; gate], made by vLLM's own post-processing after each refit);
#    DeepGEMM refused by name, an unlisted kernel refused naming docs/kernels.md;
#  - sm100-bf16: FlashInfer TRT-LLM BF16 experts (rows permuted in place);
#  - fp8-channel: compressed-tensors per-channel FP8: CUTLASS linears and
#    vLLM CUTLASS experts (TritonOrCutlassExperts), as loaded.
# vLLM's post-processing of the TRT-LLM experts calls FlashInfer's Python
# permutation helpers, and build/vllm-venv holds no FlashInfer (a GPU
# package): flashinfer-python and the two modules it imports are installed
# beside the venv (pip --target build/vllm-kernels-site, once) and put on
# PYTHONPATH for this stage only. Without the package registry that case is
# SKIPPED (said so) and the other runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/stage_venv.sh
start=$(date +%s)
VPY=$(stage_venv tools/vllm_venv.sh "vLLM") || stage_venv_exit $?
set -e
SITE=build/vllm-kernels-site
FLASHINFER="flashinfer-python==0.7.2.post1 nvidia-ml-py==13.615.71 tabulate==0.10.0"
if [ ! -f "$SITE/.complete" ]; then
  rm -rf "$SITE"
  # shellcheck disable=SC2086
  if "$VPY" -m pip install -q --no-deps --target "$SITE" $FLASHINFER; then
    # the CUDA sources FlashInfer compiles kernels from (360 MB); the CPU case imports its Python only
    rm -rf "$SITE/flashinfer/data"
    echo "$FLASHINFER" >"$SITE/.complete"
  else
    rm -rf "$SITE"
  fi
fi
echo "26-vllm-kernels: venv ready in $(( $(date +%s) - start )) s"
tools/python_install.sh "$VPY"
cases=(sm90-fp8-ep fp8-channel)
if [ -f "$SITE/.complete" ]; then
  cases+=(sm100-bf16)
else
  echo "SKIPPED tests/vllm/kernels.py sm100-bf16: $FLASHINFER could not be installed (package registry)" >&2
fi
t=$(date +%s)
PYTHONPATH="$PWD/$SITE${PYTHONPATH:+:$PYTHONPATH}" "$VPY" tests/vllm/kernels.py --build build "${cases[@]}"
echo "26-vllm-kernels: kernel refits in $(( $(date +%s) - t )) s"
