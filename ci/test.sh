#!/usr/bin/env bash
# Run every test of the repository in .venv (ci/setup.sh makes it). Extra arguments go to pytest.
# First the documentation site is built in strict mode (mkdocs.yml): a broken link, cross-reference
# or API page fails the run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
echo "== docs: mkdocs build --strict"
NO_MKDOCS_2_WARNING=1 "$ROOT/.venv/bin/mkdocs" build --strict --site-dir "$ROOT/build/site"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
