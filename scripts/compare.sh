#!/usr/bin/env bash
# Set up (servers from Debian's packages) and run the default comparison
# suite; extra arguments go to `lockbench compare` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
# Help needs no servers: without this, `--help` installed packages (and
# stopped Debian's own services) and built before printing anything.
for a in "$@"; do
  case "$a" in
    -h | --help) need_setup=no ;;
  esac
done
[[ ${need_setup:-yes} == no ]] || bash scripts/setup.sh
cargo build --release -q -p lockbench-cli
# Where cargo put it: with CARGO_TARGET_DIR set it built there, and an
# older ./target binary ran instead.
exec "${CARGO_TARGET_DIR:-target}/release/lockbench" compare "$@"
