#!/usr/bin/env bash
# Set up .venv from nothing: torch 2.13.0 first (the local CPU wheel here, the normal
# build elsewhere) so nothing pulls a second torch, then this package with its test, ray and
# kernels extras (the sweep executor's tests run on a local Ray instance; the fused attention
# core's tests run its Triton kernels in Triton's interpreter).
# Re-running is cheap: it reinstalls only when pyproject.toml changed.
# Also installs Debian's chromium for the browser test (tests/test_browser.py) when it is
# missing, we are root and apt-get exists; set-up never fails over it (the test then skips).
#
# bash scripts/setup.sh --offline DIR: no network. DIR holds the wheels of scripts/wheelhouse.sh;
# PYTHON (default python3) must already have torch (a GPU image, a cluster node). .venv then
# sees that Python's packages (torch and the rest), DIR's wheels and this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ "${1:-}" = "--offline" ]; then
  wheels=${2:-}
  fail() { echo "setup --offline: $1" >&2; exit 2; }
  [ -n "$wheels" ] && [ $# -eq 2 ] || fail "usage: bash scripts/setup.sh --offline DIR"
  compgen -G "$wheels/*.whl" >/dev/null || fail "no wheels in $wheels (scripts/wheelhouse.sh DIR makes them)"
  # asked without importing it (seconds of CPU); the import check below imports it
  "$python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null \
    || fail "$python cannot import torch; set PYTHON to a Python that has it"
  [ -x .venv/bin/python ] || "$python" -m venv --without-pip .venv
  site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # the Python's own packages, also where it is itself a virtual environment (whose packages
  # --system-site-packages would not show), and this checkout (as an editable install would)
  "$python" -c "import site; print('\n'.join(site.getsitepackages()))" > "$site/_base_python.pth"
  pwd > "$site/_factual_recall_checkout.pth"
  "$python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$site" --upgrade "$wheels"/*.whl
  version=$(.venv/bin/python -c "import torch, transformer_lens, circuitsvis, models, probe, analyses
print(torch.__version__)") || fail "the set-up is incomplete: an import failed (above)"
  echo "setup --offline: .venv ready (torch $version)"
  exit 0
fi
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[test,ray,kernels]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
    >/dev/null 2>&1 || echo "setup: could not install chromium; tests/test_browser.py will be skipped (failed where CI is set)" >&2
fi
