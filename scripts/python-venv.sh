#!/usr/bin/env bash
# Makes the venv VENV with the pinned REQUIREMENTS, or brings it up to date when the file changed
# since (its SHA-256 is kept in VENV/.cosy-requirements.sha256); does nothing when it is current.
# The one rule for the small client venvs (scripts/setup.sh --python, bench/soak.sh,
# bench/clients/compat.sh).
#
#   scripts/python-venv.sh VENV REQUIREMENTS
set -euo pipefail
if [ $# -ne 2 ]; then echo "usage: scripts/python-venv.sh VENV REQUIREMENTS" >&2; exit 2; fi
venv="$1"; requirements="$2"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.cosy-requirements.sha256" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-cache-dir -r "$requirements"
  echo "$want" > "$venv/.cosy-requirements.sha256"
fi
