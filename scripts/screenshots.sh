#!/usr/bin/env bash
# Refreshes the web page's screenshots that the README shows (docs/images/web-desktop.png and
# web-phone.png): runs the page's test (tests/clients/python/test_web_page.py, headless Chromium
# against `cosy serve` with the bundled tiny model), which writes them under out/web/, then copies
# them here. Needs what the client tests need (scripts/setup.sh --python) and a built cosy.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ -x target/debug/cosy ] || [ -x target/release/cosy ] || cargo build --quiet
python="${COSY_CLIENTS_TEST_VENV:-$HOME/.cache/cosy/client-tests-venv}/bin/python"
rm -f out/web/web-desktop.png out/web/web-phone.png
"$python" -m pytest -q tests/clients/python/test_web_page.py -k phone_width
mkdir -p docs/images
for name in web-desktop web-phone; do
  [ -s "out/web/$name.png" ] || { echo "screenshots.sh: the test wrote no out/web/$name.png" >&2; exit 1; }
  cp "out/web/$name.png" "docs/images/$name.png"
done
ls -l docs/images/web-*.png
