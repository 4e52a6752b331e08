#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then run them: the fast tier by default,
# the end-to-end tier with `-m slow` (pytest.ini).
# CPU machines get torch's CPU build (pinned, installed first, so pip never pulls a
# multi-GB CUDA build); Debian's chromium is installed for the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -e ".[test,capture]"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: run 'sudo apt-get install chromium' for the browser tests" >&2
  fi
fi
# PlayCanvas's splat-transform (npm, pinned: 2.7.1 is the newest that runs on Node 18-20) reads and
# writes .spz/.sog in tests/test_splat_transform.py; installed into the git-ignored tests/.node/.
SPLAT_TRANSFORM_VERSION=2.7.1
if ! grep -qs "\"version\": \"$SPLAT_TRANSFORM_VERSION\"" tests/.node/node_modules/@playcanvas/splat-transform/package.json; then
  npm install --prefix tests/.node --no-audit --no-fund --loglevel=error "@playcanvas/splat-transform@$SPLAT_TRANSFORM_VERSION"
fi
export TURBOGS_REQUIRE_SPLAT_TRANSFORM=1
# One worker per core (pytest-xdist): the tests run torch on one thread each.
exec python -m pytest -q -n auto "$@"
