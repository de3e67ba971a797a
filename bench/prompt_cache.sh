#!/usr/bin/env bash
# The DiT prompt-prefix cache, first-audio priority and the LLM/DiT thread settings on CPU
# (docs/benchmarks.md, "First audio on CPU"): `cosy profile --stream`, fp32 and int8 DiT, the
# bundled 3 s prompt and a 10 s one, one line per setting, the settings of one pair back to back:
#   before   = no cache, no priority (engine.prompt_cache=off, engine.first_audio_priority=off)
#   priority = no cache, the LLM held during the first chunk
#   cache    = the cache, no priority
#   both     = the cache and the priority (the defaults on a CPU)
# then (ONLY=disk) a fresh process per run, as `cosy say` is: first audio with the voice's cache
# neither in memory nor on disk (before: no cache at all; record: recorded in the run, disk off;
# write: recorded and written), then read from disk by the next process (read); then the LLM's
# decode ms/token offline and streaming under thread settings.
#
#   bench/prompt_cache.sh MODEL_DIR OUT_DIR [PROMPT_10S_WAV]
# Env: TOKENS (default 100), RUNS (1), ONLY=cache|disk|threads (one part), SETTINGS (a subset of
# before priority cache both; default all), DITS (fp32 int8), PROMPTS (short long),
# THREAD_SETTINGS (a subset of default spin-off dit-spin-off llm1-dit1). Needs target/release/cosy.
# The warm-up run records the voice's cache, so the measured runs are what a saved voice gets.
set -uo pipefail
cd "$(dirname "$0")/.."
model=$1; out=$2; long=${3:-}
mkdir -p "$out"
tokens=${TOKENS:-100}; runs=${RUNS:-1}
cosy=target/release/cosy
text="The old lighthouse blinked twice before the fog rolled in over the quiet harbour town."
short_prompt=(--prompt-wav tests/fixtures/prompt_24k.wav --prompt-text "This recording is the voice prompt.")
if [ -z "$long" ]; then # 10 s: the bundled prompt four times over, cut to 10 s
  long="$out/prompt_10s.wav"
  python3 - "$long" <<'PY'
import sys, wave
w = wave.open("tests/fixtures/prompt_24k.wav"); p = w.getparams(); a = w.readframes(p.nframes); w.close()
o = wave.open(sys.argv[1], "wb"); o.setparams(p); o.writeframes((a * 4)[: 10 * p.framerate * p.sampwidth]); o.close()
PY
fi
long_prompt=(--prompt-wav "$long" --prompt-text "This recording is the voice prompt. This recording is the voice prompt. This recording is the voice prompt.")
summary() { # JSON -> one line: ttfa, rtf, llm decode p50, dit calls, peak rss
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
st = r["stages"]
def p50(name):
    return f"{st[name]['p50_ms']:.1f}" if name in st else "n/a"
print(f"ttfa_ms={r['ttfb_ms']:.0f} rtf={r['rtf']:.3f} llm_decode_p50_ms={p50('llm.decode')} "
      f"dit_calls={st.get('flow.dit', {}).get('calls')} dit_p50_ms={p50('flow.dit')} rss_mib={r['memory'].get('peak_rss_mib')}"
      + (" prompt_cache hits/misses/disk_hits={hits}/{misses}/{disk_hits}".format(**r["prompt_cache"]) if r.get("prompt_cache") else ""))
PY
}
run() { # NAME ARGS...
  local name=$1; shift
  "$cosy" --model "$model" profile "$text" "$@" --min-tokens "$tokens" --runs "$runs" --warmup 1 \
    --json "$out/$name.json" >"$out/$name.txt" 2>&1 || { echo "$name: failed (see $out/$name.txt)"; return; }
  echo "$name: $(summary "$out/$name.json")"
}
if [ "${ONLY:-cache}" = cache ]; then
  for dit in ${DITS:-fp32 int8}; do
    for p in ${PROMPTS:-short long}; do
      if [ $p = short ]; then prompt=("${short_prompt[@]}"); else prompt=("${long_prompt[@]}"); fi
      for setting in ${SETTINGS:-before priority cache both}; do
        case $setting in
          before) sets=(--set engine.prompt_cache=off --set engine.first_audio_priority=off) ;;
          priority) sets=(--set engine.prompt_cache=off --set engine.first_audio_priority=on) ;;
          cache) sets=(--set engine.prompt_cache=on --set engine.first_audio_priority=off) ;;
          both) sets=(--set engine.prompt_cache=on --set engine.first_audio_priority=on) ;;
          *) echo "unknown setting $setting"; continue ;;
        esac
        run "stream-$dit-$p-$setting" "${prompt[@]}" --stream --set stages.dit.precision=$dit "${sets[@]}"
      done
    done
  done
fi
if [ "${ONLY:-disk}" = disk ]; then
  # No warm-up: each run is one process's first request, its own engine cache folder for the
  # prompt-prefix files (the optimised graphs are saved there too: load time, not first audio).
  for dit in ${DITS:-fp32 int8}; do
    for p in ${PROMPTS:-short long}; do
      if [ $p = short ]; then prompt=("${short_prompt[@]}"); else prompt=("${long_prompt[@]}"); fi
      cache="$out/engines-$dit-$p"; rm -rf "$cache"
      once() { # NAME SETTINGS...
        local name=$1; shift
        "$cosy" --model "$model" --set runtime.engine_cache="$cache" "$@" profile "$text" "${prompt[@]}" --stream \
          --set stages.dit.precision=$dit --min-tokens "$tokens" --runs 1 --warmup 0 --json "$out/$name.json" >"$out/$name.txt" 2>&1 \
          || { echo "$name: failed (see $out/$name.txt)"; return; }
        echo "$name: $(summary "$out/$name.json")"
      }
      once "disk-$dit-$p-before" --set engine.prompt_cache=off --set engine.first_audio_priority=off
      once "disk-$dit-$p-record" --set engine.prompt_cache_disk_bytes=0
      once "disk-$dit-$p-write"
      once "disk-$dit-$p-read"
      echo "disk-$dit-$p: $(du -sh "$cache/prompt-prefix" 2>/dev/null | cut -f1) on disk"
    done
  done
fi
if [ "${ONLY:-threads}" = threads ]; then
  # LLM decode ms/token offline (nothing beside it) and streaming (the DiT runs beside it), under
  # THREAD_SETTINGS (default: all of them).
  run "threads-default-offline" "${short_prompt[@]}" --no-stream
  for setting in ${THREAD_SETTINGS:-default spin-off dit-spin-off llm1-dit1}; do
    case $setting in
      default) sets=() ;;
      spin-off) sets=(--set stages.llm.spinning=false --set stages.dit.spinning=false) ;;
      dit-spin-off) sets=(--set stages.llm.spinning=true --set stages.dit.spinning=false) ;;
      llm1-dit1) sets=(--set stages.llm.threads=1 --set stages.dit.threads=1) ;;
      *) echo "unknown setting $setting"; continue ;;
    esac
    run "threads-$setting-stream" "${short_prompt[@]}" --stream --set engine.prompt_cache=off --set engine.first_audio_priority=off "${sets[@]}"
  done
fi
