#!/usr/bin/env bash
# Soak of `cosy serve` (issue 30; bench/soak.py says what it does and checks): one server on
# loopback under mixed load for --minutes (default 30), then NAME.{csv,json,md,png} in
# bench/results/ and exit 0 only when RSS and fds stayed flat, in-flight went back to 0 and no error
# was unexplained. Runs in the Python clients' venv (tests/clients/requirements.txt, as
# scripts/setup.sh --python makes it: ${COSY_CLIENTS_TEST_VENV:-~/.cache/cosy/client-tests-venv}),
# made here when missing or stale. Uses target/release/cosy (else target/debug/cosy); BENCH_BUILD=1
# builds the release binary first.
#
#   bench/soak.sh                                        # tiny model, 30 min
#   bench/soak.sh --minutes 10 --model ~/models/cosyvoice3 -- --provider cpu
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${COSY_CLIENTS_TEST_VENV:-$HOME/.cache/cosy/client-tests-venv}"
scripts/python-venv.sh "$venv" tests/clients/requirements.txt
[ -z "${BENCH_BUILD:-}" ] || cargo build --release --quiet --bin cosy
exec "$venv/bin/python" bench/soak.py "$@"
