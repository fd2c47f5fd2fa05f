#!/usr/bin/env bash
# The README's demo command: installs the build dependencies, then runs the global_allocator example
# on the embedded default NIC (a verbs device if one is present, else the soft NIC): a service whose
# global allocator is the pool posts its ordinary Strings and Vecs to a peer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
exec cargo run --example global_allocator
