#!/usr/bin/env bash
# Set up .venv from nothing: torch 2.13.0 first (the local CPU wheel here, the normal
# build elsewhere) so nothing pulls a second torch, then this package with its test and ray
# extras (the sweep executor's tests run on a local Ray instance).
# Re-running is cheap: it reinstalls only when pyproject.toml changed.
# Also installs Debian's chromium for the browser test (tests/test_browser.py) when it is
# missing, we are root and apt-get exists; set-up never fails over it (the test then skips).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[test,ray]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
    >/dev/null 2>&1 || echo "setup: could not install chromium; tests/test_browser.py will be skipped (failed where CI is set)" >&2
fi
