#!/usr/bin/env bash
# The README's demo command: installs the build dependencies, then runs the quick-start example
# on the embedded default NIC (a verbs device if one is present, else the soft NIC).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
exec cargo run --example quickstart
