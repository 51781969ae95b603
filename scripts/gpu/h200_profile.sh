#!/bin/sh
# The recorded H200 grid in data/profiles/ comes from this, run from the repo root on
# the GPU machine (python3 there has torch and triton; the kit needs no install):
#   INKLING_LAB_COMMIT=$(git rev-parse HEAD) sh scripts/gpu/h200_profile.sh
# It is `inkling-lab profile` with the grid's defaults (shapes A,B; R 16,64; S 1,4,8;
# T 1..8192; backends triton, torch, cublas_base).
set -e
export PYTHONUNBUFFERED=1 PYTHONPATH=.
python3 -m inkling_lab.profile --out data/profiles --name h200_grid.json --reps 30 "$@"
