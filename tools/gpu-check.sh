#!/usr/bin/env bash
# make gpu-check without make: the GPU check of tools/gpu_check.py, run by python3 from PATH
# (on the GPU machine that is the python3 that holds torch), from the repository root.
#   bash tools/gpu-check.sh [--budget S] [--only wheels,pytest,cells,bench,notebooks]
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
exec python3 tools/gpu_check.py "$@"
