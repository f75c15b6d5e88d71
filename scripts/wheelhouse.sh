#!/usr/bin/env bash
# Fill DIR with the wheels that a machine whose Python already has torch and the scientific
# stack (numpy, pandas, matplotlib, safetensors, tqdm, transformers, ...: a GPU image) lacks to
# run the toolkit, built for Python X.Y (default 3.12) on x86-64 Linux. Run it where the
# package index is reachable; then, on the machine without it:
#   PYTHON=/path/to/python-with-torch bash scripts/setup.sh --offline DIR
# The versions are the ones the CPU set-up installs (pyproject.toml, .venv): the same code runs
# in both places.
set -euo pipefail
usage() { echo "usage: bash scripts/wheelhouse.sh DIR [--python X.Y]" >&2; exit 2; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
dir=$1; shift
version=3.12
while [ $# -gt 0 ]; do
  case $1 in
    --python) [ $# -ge 2 ] || usage; version=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ $version =~ ^3\.[0-9]+$ ]] || { echo "wheelhouse: --python takes a version such as 3.12, got '$version'" >&2; exit 2; }
cd "$(dirname "$0")/.."
# TransformerLens and circuitsvis with the dependencies such an image lacks (imported by them;
# their optional ones, wandb among them, are never imported by the toolkit).
WHEELS=(transformer-lens==4.3.0 circuitsvis==1.43.3 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
        fancy-einsum==0.0.3 typeguard==4.6.0 beartype==0.23.1 importlib-metadata==8.7.0)
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$dir"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$dir" "${WHEELS[@]}"
ls -1 "$dir"
echo "wheelhouse: $(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir (Python $version)"
