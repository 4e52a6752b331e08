#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then run them.
# CPU machines get torch's CPU build (pinned, installed first, so pip never pulls a
# multi-GB CUDA build); Debian's chromium is installed for the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -e ".[test]"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: run 'sudo apt-get install chromium' for the browser tests" >&2
  fi
fi
exec python -m pytest -q "$@"
