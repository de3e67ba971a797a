#!/usr/bin/env bash
# Export an official CosyVoice3 checkpoint folder into a cosy model folder.
#   scripts/export.sh SRC DST [--precisions fp32,fp16] [--noise-frames N]
#   scripts/export.sh SRC [options]     into the user's models folder:
#                                       ${XDG_DATA_HOME:-~/.local/share}/cosy/models/NAME (NAME: SRC's folder name)
# A model in the user's models folder is used when no config file, COSY_MODEL or --model names
# one: the default (`cosy model use NAME`), else the only one there (`cosy model list`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then echo "usage: scripts/export.sh SRC [DST] [exporter options]" >&2; exit 2; fi
src="$(realpath "$1")"; shift
name=""
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
  dst="$(realpath -m "$1")"; shift
else
  data="${XDG_DATA_HOME:-}"; case "$data" in /*) ;; *) data="$HOME/.local/share" ;; esac
  # A model name cosy accepts: letters, digits, '.', '_', '-' (not first).
  name="$(basename "$src" | tr -c 'A-Za-z0-9._\n-' '_' | sed 's/^[-.]*//')"
  name="${name:-model}"
  dst="$data/cosy/models/$name"
  echo "export: into the user's models folder as \"$name\": $dst"
fi
"$root/scripts/setup.sh" --python --no-build
venv="${COSY_VENV:-$HOME/.cache/cosy/venv}"
cd "$root/onnx"
"$venv/bin/python" -m cosy_export export "$src" "$dst" "$@"
if [ -n "$name" ]; then
  echo "export: done; \`cosy model list\` shows it, \`cosy model use $name\` makes it the default"
fi
