#!/usr/bin/env bash
# Extraction and detector throughput on a GPU at the paper's sizes, in one short run.
#
#   benchmarks/gpu.sh                      # CUDA: ViT-B/16 224 px extraction (bf16 autocast), then the
#                                          # torch-backend detectors on 1.28M x 768 and 1.28M x 2048
#                                          # synthetic train features (50k ID test + 50k OOD, 1000 classes)
#   benchmarks/gpu.sh --device cpu --tiny  # the same steps at a tiny size on the CPU, in float32 (run by the tests)
#
# Prints img/s of the bare forward and of oodeval's extraction loop, and seconds per detector
# (fit + scoring both sets) beside its float32 floor measured on the same device.
# Environment: PYTHON (default: .venv/bin/python if present, else python).
set -euo pipefail

DEVICE=cuda
TINY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --tiny) TINY=1; shift ;;
    *) echo "usage: $0 [--device cuda|cpu|cuda:N] [--tiny]" >&2; exit 2 ;;
  esac
done

HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$HERE/../.venv/bin/python" ]; then PYTHON="$HERE/../.venv/bin/python"; else PYTHON=python; fi
fi
export HF_HUB_OFFLINE=1

if [ "$TINY" = 1 ]; then
  IMAGES=4; BATCH=2; WORKERS=0; TRAIN=1000; TEST=200; CLASSES=10; DIMS="32 48"
else
  IMAGES=4096; BATCH=256; WORKERS=8; TRAIN=1281167; TEST=50000; CLASSES=1000; DIMS="768 2048"
fi

# bf16 autocast on CUDA (what this script measures); the CPU smoke run stays in float32: torch's CPU
# bf16 attention picks its kernels from the CPU's features and fails inside torch where a lower
# ATEN_CPU_CAPABILITY is forced on an AMX CPU ("pack_vnni2 is only supported when avx512 is supported")
case "$DEVICE" in cuda*) BF16=--bf16; PRECISION="bf16 autocast" ;; *) BF16=; PRECISION=float32 ;; esac
echo "== extraction: vit_base_patch16_224, 224 px, $PRECISION, device $DEVICE"
"$PYTHON" "$HERE/extract.py" --model vit_base_patch16_224 --device "$DEVICE" $BF16 \
  --images "$IMAGES" --batch-size "$BATCH" --workers "$WORKERS" --repeats 1

DETS=kl_matching,dice,mahalanobis,relative_mahalanobis,mahalanobis_pp,relative_mahalanobis_pp,knn,cosine,mcm,fdbd,neco,vim,nnguide
for D in $DIMS; do
  echo "== detectors: $TRAIN x $D train, $TEST ID test + $TEST OOD, $CLASSES classes, device $DEVICE"
  "$PYTHON" "$HERE/detectors.py" --no-pood --device "$DEVICE" --train "$TRAIN" --test "$TEST" \
    --classes "$CLASSES" --dim "$D" --detectors "$DETS"
done
