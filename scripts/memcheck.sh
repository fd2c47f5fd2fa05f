#!/usr/bin/env bash
# Memory-checker runs (feature `memcheck`, src/alloc/memcheck.rs), part of scripts/test.sh:
#  1. the feature alone (stable): the memcheck tests check the 0xDF fill of freed blocks, the
#     write-after-free count and the guard page after large runs;
#  2. every test binary of the crate built for AddressSanitizer (RUSTC_BOOTSTRAP=1 for
#     -Zsanitizer=address; `--cfg rdma_pool_asan` makes the pool poison freed blocks and guard
#     pages and register its mappings with the leak checker). Any ASan or LeakSanitizer report
#     fails the run: the findings must be 0.
# The ASan build has its own target directory (target/asan), so it does not disturb target/debug.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== memcheck feature (stable): fill, write-after-free count, guard pages"
cargo clippy --features memcheck --lib --tests -- -D warnings
cargo test --features memcheck --test memcheck
# The doctests with every feature on (`cargo test --all-features` must pass; the lib and test
# binaries run below, under ASan).
cargo test --all-features --doc -p rdma-pool

echo "== memcheck under AddressSanitizer (RUSTC_BOOTSTRAP=1 -Zsanitizer=address): every test binary"
target=$(rustc -vV | sed -n 's/^host: //p')
# handle_segv=0: the fork test expects a DontFork child to die of SIGSEGV (ASan would turn it
# into an exit status); allocator_may_return_null=1: an absurd layout that reaches the system
# allocator (GlobalPool's degraded path) gets null, as GlobalAlloc's contract says, not an
# abort. Leak detection stays on, with one suppression (scripts/lsan.supp says why). The grant
# model and flood run at smoke size here (full size in the plain `cargo test`); the programs that
# must not compile are checked by the plain `cargo test` only (crate `compile-fail/`: compile
# errors do not depend on the sanitizer).
RUSTC_BOOTSTRAP=1 \
RUSTFLAGS="-Zsanitizer=address --cfg rdma_pool_asan" \
CARGO_TARGET_DIR=target/asan \
ASAN_OPTIONS="handle_segv=0:allocator_may_return_null=1:detect_leaks=1" \
LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0" \
RDMA_POOL_MODEL_STEPS=2000 RDMA_POOL_GRANT_FLOOD=8192 RDMA_POOL_REGION_GRANTS=600 \
    cargo test --target "$target" --features memcheck --lib --tests
