#!/usr/bin/env bash
# Voice-agent frameworks against `cosy serve` with their default settings (issue 19): pipecat's
# OpenAITTSService and LiveKit's openai TTS plugin, pinned in bench/clients/requirements.txt and
# installed into their own venv (${COSY_CLIENTS_VENV:-~/.cache/cosy/clients-venv}, ~750 MB: kept
# out of CI). Starts the release server on a free loopback port with MODEL (default: the bundled
# tiny model) and a default voice "me" from the bundled prompt, runs bench/clients/compat.py
# against it, and prints one JSON line per client. Exit status: 0 when both got audio.
#
#   bench/clients/compat.sh [MODEL]
set -euo pipefail
cd "$(dirname "$0")/../.."
model="${1:-tests/fixtures/tiny}"
venv="${COSY_CLIENTS_VENV:-$HOME/.cache/cosy/clients-venv}"
scripts/python-venv.sh "$venv" bench/clients/requirements.txt
[ -n "${BENCH_PREBUILT:-}" ] || cargo build --release --quiet --bin cosy
work="$(mktemp -d)"; pid=""
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
key="sk-cosy-compat"
cosy=(target/release/cosy --model "$model" --set "voices.dir=$work/voices" --set "runtime.graph_cache=$work/gc")
"${cosy[@]}" -q voice add me --wav tests/fixtures/prompt_24k.wav --text "Hello there, this is a test." --default >/dev/null
"${cosy[@]}" --set "server.api_key=$key" serve --bind 127.0.0.1:0 2>"$work/server.log" &
pid=$!
for _ in $(seq 600); do grep -q "listening on" "$work/server.log" && break; sleep 0.1; done
url="$(grep -o 'http://[0-9.:]*' "$work/server.log" | head -1)"
for _ in $(seq 600); do curl -sf -m 5 "$url/ready" >/dev/null && break; sleep 0.2; done
rc=0
"$venv/bin/python" bench/clients/compat.py "$url/v1" "$key" || rc=$?
echo "--- server log (requests) ---"
grep -E "speech|voice|refused|WARN|ERROR" "$work/server.log" | tail -20 || true
exit $rc
