#!/usr/bin/env bash
# The Python package's tests (python/tests), as a user gets the package: the wheel built by
# scripts/wheel.sh, installed with its dependencies (cosy-tts[cpu]: numpy, onnxruntime) and the
# tests' own (python/tests/requirements.txt: pytest, pipecat) into a fresh venv, nothing else.
# The tests compare with the `cosy` binary (target/debug/cosy, or $COSY_BIN): build it first.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/wheel.sh >/dev/null
wheel="$(ls dist/cosy_tts-*.whl | head -n1)"
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${wheel}[cpu]" -r python/tests/requirements.txt
# From the tests' folder, so that `import cosy` is the installed wheel, not python/cosy.
cd python/tests
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
