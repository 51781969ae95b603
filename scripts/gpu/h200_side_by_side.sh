#!/bin/sh
# The side-by-side record (issue 15): the kit against sglang 0.5.23's paths taken from
# the wheel, on the GPU machine, from a copy of the tree (python3 there has torch and triton):
#   INKLING_LAB_COMMIT=<commit> sh scripts/gpu/h200_side_by_side.sh WHEEL OUTDIR [more profile args]
set -e
export PYTHONUNBUFFERED=1 PYTHONPATH=.
wheel=$1 out=$2
shift 2
python3 -m inkling_lab.profile --vs-upstream "$wheel" --out "$out" --reps 30 "$@"
