#!/usr/bin/env bash
# Set up (servers from Debian's packages) and run every test against real
# servers; extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec cargo test --workspace "$@"
