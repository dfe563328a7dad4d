#!/usr/bin/env bash
# Set up (servers from Debian's packages) and run the default comparison
# suite; extra arguments go to `lockbench compare` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -q -p lockbench-cli
exec ./target/release/lockbench compare "$@"
