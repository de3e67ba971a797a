#!/usr/bin/env bash
# Installs cosy as a program, into PREFIX (default ~/.local):
#   PREFIX/bin/cosy                                   the binary
#   PREFIX/lib/cosy/libonnxruntime.so*                ONNX Runtime (and the GPU build's provider libraries), found beside the binary
#   PREFIX/share/cosy/models/tiny/                    the bundled tiny random-weight model (the default only while you have no model: noise)
#   PREFIX/share/bash-completion/completions/cosy, PREFIX/share/zsh/site-functions/_cosy,
#   PREFIX/share/fish/vendor_completions.d/cosy.fish  shell completions
#   PREFIX/share/man/man1/cosy.1                      the man page
#   PREFIX/share/systemd/user/cosy.service            a systemd user unit for `cosy serve` (not with --no-unit;
#                                                     systemd finds it for PREFIX ~/.local, /usr/local or /usr)
#   PREFIX/share/cosy/installed-files                 every file above, relative to PREFIX: the uninstall list
# With speech-dispatcher installed (not with --no-speechd), the `cosy` speech-dispatcher module in the
# user's folders (`cosy speech-dispatcher install`: ~/.config/speech-dispatcher/modules/cosy.conf and
# ~/.local/libexec/speech-dispatcher-modules/sd_cosy; docs/desktop.md), removed again by --uninstall.
# Models, voices and caches are the user's, not the install's: $XDG_DATA_HOME/cosy, $XDG_CACHE_HOME/cosy.
#
#   scripts/install.sh [PREFIX]                 from a checkout: builds the release binary (scripts/setup.sh) unless given one
#   scripts/install.sh --bin FILE [PREFIX]      install FILE (or COSY_BIN=FILE) instead of building
#   ./install.sh [PREFIX]                       from an unpacked dist/cosy-VERSION-x86_64-linux.tar.gz
#   scripts/install.sh --uninstall [PREFIX]     remove the files of PREFIX/share/cosy/installed-files
# The binary links ALSA (libasound.so.2): the host needs it (Debian/Ubuntu: libasound2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
prefix=""; bin="${COSY_BIN:-}"; unit=1; uninstall=0; speechd=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --bin=*) bin="${1#--bin=}"; shift ;;
    --no-unit) unit=0; shift ;;
    --no-speechd) speechd=0; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "install.sh: unknown option $1 (use --bin FILE, --no-unit, --no-speechd, --uninstall)" >&2; exit 2 ;;
    *) [ -z "$prefix" ] || { echo "install.sh: one PREFIX only" >&2; exit 2; }; prefix="$1"; shift ;;
  esac
done
prefix="${prefix:-$HOME/.local}"
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
list="share/cosy/installed-files"

if [ "$uninstall" = 1 ]; then
  if [ ! -f "$prefix/$list" ]; then echo "install.sh: $prefix/$list not found: nothing installed there" >&2; exit 1; fi
  [ -x "$prefix/bin/cosy" ] && "$prefix/bin/cosy" speech-dispatcher remove || true
  while IFS= read -r f; do
    [ -n "$f" ] && rm -f "$prefix/$f" && echo "removed $prefix/$f"
  done < "$prefix/$list"
  # Folders that held only cosy's files.
  for d in share/cosy/models/tiny share/cosy/models share/cosy lib/cosy; do
    find "$prefix/$d" -depth -type d -empty -delete 2>/dev/null || true
  done
  exit 0
fi

if [ -x "$here/bin/cosy" ] && [ -d "$here/lib/cosy" ]; then
  # An unpacked tarball (scripts/package.sh): install.sh sits at its top.
  bin="${bin:-$here/bin/cosy}"; libs="$here/lib/cosy"; model="$here/share/cosy/models/tiny"
else
  root="$(cd "$here/.." && pwd)"
  if [ -z "$bin" ]; then
    "$root/scripts/setup.sh"   # ALSA headers, ONNX Runtime in .ort/, cargo build --release
    bin="$root/target/release/cosy"
  fi
  [ -e "$root/.ort/libonnxruntime.so" ] || "$root/scripts/setup-ort.sh"
  libs="$root/.ort"; model="$root/tests/fixtures/tiny"
fi
[ -x "$bin" ] || { echo "install.sh: $bin is not an executable" >&2; exit 1; }

installed=()
# Every file is written as cosy writes its own (docs/reliability.md): to a temporary name beside
# it, synced, then renamed over the final name; on a full disk (or any failure) one line names the
# final path and the fix, the temporary file is removed and the previous version stays.
failed() { # failed DEST TEMP ERROR-TEXT: the one line, then exit
  rm -f "$2"
  local why="${3##*: }"
  case "$why" in
    *"No space left"*|*"quota"*) fix="free some space (or choose a PREFIX on another disk)" ;;
    *) fix="make $(dirname "$1") writable (or choose another PREFIX)" ;;
  esac
  echo "install.sh: cannot write $1: ${why:-failed}; $fix, then run install.sh again" >&2
  exit 1
}
# write DEST COMMAND...: COMMAND fills the temporary file "$tmp", which then replaces DEST.
write() {
  local dest="$1" err; shift
  mkdir -p "$(dirname "$dest")" 2>/dev/null || failed "$dest" "" "cannot create its folder"
  tmp="$(dirname "$dest")/.$(basename "$dest").cosy-tmp.$$"
  err="$( { "$@" && sync "$tmp" && mv -f "$tmp" "$dest"; } 2>&1 >/dev/null)" || failed "$dest" "$tmp" "$(printf '%s' "$err" | tail -1)"
}
copy_to_tmp() { install -m "$2" "$1" "$tmp"; }
output_to_tmp() { "$@" > "$tmp"; }
put() { # put SRC DEST-relative-to-prefix MODE
  write "$prefix/$2" copy_to_tmp "$1" "$3"
  installed+=("$2")
}
put "$bin" bin/cosy 755
for f in "$libs"/libonnxruntime*.so*; do
  name="$(basename "$f")"
  # The TensorRT for RTX plugin (scripts/setup-trt-rtx.sh) needs ~350 MB of libraries beside it; an
  # install goes without it (runtime.tensorrt_rtx_library can name a checkout's .ort/ copy: docs/gpu.md).
  [ "$name" = libonnxruntime_providers_nv_tensorrt_rtx.so ] && continue
  if [ -L "$f" ]; then
    mkdir -p "$prefix/lib/cosy"; ln -sfn "$(readlink "$f")" "$prefix/lib/cosy/$name"; installed+=("lib/cosy/$name")
  else
    put "$f" "lib/cosy/$name" 644
  fi
done
[ -e "$prefix/lib/cosy/libonnxruntime.so" ] || { echo "install.sh: no libonnxruntime.so in $libs" >&2; exit 1; }
while IFS= read -r f; do
  put "$model/$f" "share/cosy/models/tiny/$f" 644
done < <(cd "$model" && find . -type f ! -name '*.pyc' | sed 's|^\./||' | sort)

cosy="$prefix/bin/cosy"
gen() { # gen DEST COMMAND...: the installed binary writes a file
  local dest="$1"; shift
  write "$prefix/$dest" output_to_tmp "$@"
  installed+=("$dest")
}
gen share/bash-completion/completions/cosy "$cosy" completions bash
gen share/zsh/site-functions/_cosy "$cosy" completions zsh
gen share/fish/vendor_completions.d/cosy.fish "$cosy" completions fish
gen share/man/man1/cosy.1 "$cosy" manpage
if [ "$unit" = 1 ]; then
  gen share/systemd/user/cosy.service printf '%s\n' \
    "[Unit]" \
    "Description=cosy: CosyVoice3 text-to-speech server (OpenAI-compatible speech API)" \
    "Documentation=man:cosy(1)" \
    "After=network.target" \
    "" \
    "[Service]" \
    "ExecStart=$cosy serve" \
    "# A desktop server gives its memory back when idle: the model is dropped after 5 minutes" \
    "# without requests and loaded again by the next one (engine.idle_unload_s; 0 = keep it)." \
    "Environment=COSY_IDLE_UNLOAD_S=300" \
    "Restart=on-failure" \
    "# On SIGTERM cosy drains for server.shutdown_grace_s (30 s by default) before it exits." \
    "TimeoutStopSec=45" \
    "" \
    "[Install]" \
    "WantedBy=default.target"
fi
installed+=("$list")
write "$prefix/$list" output_to_tmp printf '%s\n' "${installed[@]}"

# speech-dispatcher (Orca, spd-say -o cosy): the module in the user's folders (docs/desktop.md).
if [ "$speechd" = 1 ] && command -v speech-dispatcher >/dev/null 2>&1; then
  "$prefix/bin/cosy" speech-dispatcher install || echo "note: the speech-dispatcher module was not installed (see above)"
fi

echo "installed cosy into $prefix:"
sed 's|^|  |' "$prefix/$list" | grep -v '/models/tiny/' || true
echo "  share/cosy/models/tiny/ ($(grep -c '/models/tiny/' "$prefix/$list") files)"
echo "uninstall: scripts/install.sh --uninstall $prefix (removes the files listed in $prefix/$list)"
case ":$PATH:" in *":$prefix/bin:"*) ;; *) echo "note: $prefix/bin is not on PATH" ;; esac
[ "$unit" = 1 ] && echo "server: systemctl --user daemon-reload && systemctl --user enable --now cosy"
exit 0
