#!/usr/bin/env bash
# Golden parity: export the reference tiny model, run `cosy file --dump` for every golden case
# and check the dumps with the reference compare.py. Exit status is compare.py's.
#
#   scripts/golden.sh [DUMP_ROOT]
# Env: COSY_SHARED (default ../shared beside the repo), COSY_VENV (default ~/.cache/cosy/venv),
#      COSY_BIN (default: cargo build --release and target/release/cosy), COSY_KEEP=1 keeps the temp dir,
#      COSY_EXPORTED (the reference model already exported: no export, no torch needed; a GPU host),
#      COSY_PROVIDER (default cpu: the providers the cases run on, e.g. cuda).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
shared="${COSY_SHARED:-$repo/../shared}"
venv="${COSY_VENV:-$HOME/.cache/cosy/venv}"
ref="$shared/reference"
py="$venv/bin/python"
[[ -d "$ref/golden" ]] || { echo "golden.sh: no reference folder at $ref (set COSY_SHARED)" >&2; exit 2; }
[[ -n "${COSY_EXPORTED:-}" || -d "$ref/tiny-official" ]] || { echo "golden.sh: no $ref/tiny-official to export (or set COSY_EXPORTED)" >&2; exit 2; }
[[ -x "$py" ]] || { echo "golden.sh: no python at $py (set COSY_VENV)" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/cosy-golden.XXXXXX")"
[[ "${COSY_KEEP:-0}" == 1 ]] || trap 'rm -rf "$work"' EXIT
dump="${1:-$work/dump}"
mkdir -p "$dump"

if [[ -z "${COSY_BIN:-}" ]]; then
  (cd "$repo" && cargo build --release --quiet)
  COSY_BIN="${CARGO_TARGET_DIR:-$repo/target}/release/cosy"
fi

model="${COSY_EXPORTED:-$work/model}"
provider="${COSY_PROVIDER:-cpu}"
if [[ -z "${COSY_EXPORTED:-}" ]]; then
  echo "== export $ref/tiny-official"
  if ! (cd "$repo/onnx" && "$py" -m cosy_export export "$ref/tiny-official" "$work/model" --precisions fp32) >"$work/export.log" 2>&1; then
    tail -n 20 "$work/export.log" >&2; echo "golden.sh: export failed (log above)" >&2; exit 1
  fi
fi

for meta in "$ref"/golden/*/meta.json; do
  case_dir="$(dirname "$meta")"; name="$(basename "$case_dir")"
  mapfile -t -d '' fields < <("$py" - "$meta" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for v in (m["tts_text"], m["prompt_text"], m["prompt_wav"], "1" if m.get("stream") else "0",
          "1" if m.get("text_frontend", True) else "0"):
    sys.stdout.write(v + "\0")
PY
)
  args=(--prompt-wav "$ref/${fields[2]}" --prompt-text "${fields[1]}" --dump "$dump/$name" -o "$work/$name.wav")
  [[ "${fields[3]}" == 1 ]] && args+=(--stream)
  [[ "${fields[4]}" == 0 ]] && args+=(--no-text-frontend)
  echo "== $name"
  # cosy refuses COSY_* variables it does not know; the script's own ones are not for it.
  # Private caches in the temp dir: the first case optimises and saves the graphs, the others load them.
  env -u COSY_SHARED -u COSY_VENV -u COSY_BIN -u COSY_KEEP -u COSY_EXPORTED -u COSY_PROVIDER COSY_ENGINE_CACHE="$work/engines" \
    "$COSY_BIN" --model "$model" --provider "$provider" --precision fp32 file "${args[@]}" -- "${fields[0]}"
done

"$py" "$ref/compare.py" "$dump"
