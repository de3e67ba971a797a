#!/usr/bin/env bash
# Makes dist/cosy-VERSION-x86_64-linux.tar.gz: a relocatable install (unpack anywhere, run bin/cosy),
# laid out as scripts/install.sh installs it (bin/cosy, lib/cosy/libonnxruntime.so*, the bundled
# tiny model, completions, man page; no systemd unit: its ExecStart needs the final path, so
# ./install.sh [PREFIX] from the unpacked folder installs one), plus install.sh and README.
# The host needs glibc 2.36 or newer and ALSA's libasound.so.2 (Debian/Ubuntu: libasound2).
#   scripts/package.sh                  builds the release binary (scripts/setup.sh) unless given one
#   scripts/package.sh --bin FILE       package FILE (or COSY_BIN=FILE)
#   COSY_DIST=DIR scripts/package.sh    write into DIR instead of dist/
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${COSY_BIN:-}"
case "${1:-}" in
  --bin) bin="$2" ;;
  --bin=*) bin="${1#--bin=}" ;;
  "") ;;
  *) echo "package.sh: unknown option $1 (use --bin FILE)" >&2; exit 2 ;;
esac
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
name="cosy-$version-x86_64-linux"
dist="${COSY_DIST:-$root/dist}"
mkdir -p "$dist"
stage="$(mktemp -d "$dist/.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
args=(--no-unit); [ -n "$bin" ] && args+=(--bin "$bin")
"$root/scripts/install.sh" "${args[@]}" "$stage/$name" >/dev/null
cp "$root/scripts/install.sh" "$stage/$name/install.sh"
cat > "$stage/$name/README" <<README
cosy $version for x86-64 Linux (CosyVoice3 text-to-speech over ONNX Runtime).

Run it from here: bin/cosy doctor; bin/cosy --help; man share/man/man1/cosy.1.
It finds ONNX Runtime in lib/cosy/ beside it, wherever this folder is. The host needs glibc 2.36
or newer and ALSA's libasound.so.2 (Debian/Ubuntu: apt-get install libasound2).
Install into a prefix (with a systemd user unit for cosy serve): ./install.sh [PREFIX] (default ~/.local).
Models and voices live in \$XDG_DATA_HOME/cosy (cosy model add NAME PATH), caches in \$XDG_CACHE_HOME/cosy.
share/cosy/models/tiny is a tiny model with random weights: it speaks noise, not speech, and is the
default only while you have no model of your own.
README
tar -C "$stage" -czf "$dist/$name.tar.gz.partial" "$name"
mv "$dist/$name.tar.gz.partial" "$dist/$name.tar.gz"
echo "$dist/$name.tar.gz"
