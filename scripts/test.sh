#!/usr/bin/env bash
# The README's test command (and what .ci/run runs): installs what it needs, checks format and
# lints, runs the whole test suite on the soft NIC, builds and tests the nightly allocator-api crate, and
# runs the scenario suite on kernel Soft-RoCE in a QEMU guest (tests/rxe/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each stage prints the seconds since the start, so a slow stage shows in the CI log.
stage() { echo "== [+$(( $(date +%s) - start )) s] $*"; }
bash scripts/deps.sh --vm

# Huge pages for the hugetlb scenarios, where we may reserve them (root, not in a container that
# forbids it). Without them those scenarios check the refusal path instead.
if [ "$(id -u)" -eq 0 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
    [ "$(cat /proc/sys/vm/nr_hugepages)" -ge 8 ] || echo 8 > /proc/sys/vm/nr_hugepages || true
fi

stage "cargo fmt --check"
cargo fmt --all -- --check
# The nightly member crate (`allocator-api/`, `#![feature(allocator_api)]`) is built, linted and
# tested with RUSTC_BOOTSTRAP=1 only; the stable commands leave it out.
# The `tokio` feature (async completions) is on for the lints and the tests, so its code and
# tests/async_completions.rs are checked too; the default build has it off.
stage "cargo clippy"
cargo clippy --workspace --exclude rdma-pool-allocator-api --all-targets --features rdma-pool/tokio,rdma-pool/serde -- -D warnings
stage "cargo doc (rustdoc warnings denied)"
# The C library's crate has the same library name (rdma_pool) as the crate itself, so one
# `cargo doc` cannot document both: it is documented on its own.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --exclude rdma-pool-allocator-api --exclude rdma-pool-capi --features rdma-pool/tokio,rdma-pool/serde
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p rdma-pool-capi
stage "allocator-api (nightly std::alloc::Allocator, RUSTC_BOOTSTRAP=1): clippy and tests"
RUSTC_BOOTSTRAP=1 cargo clippy -p rdma-pool-allocator-api --all-targets -- -D warnings
RUSTC_BOOTSTRAP=1 cargo test -p rdma-pool-allocator-api
stage "cargo test (soft NIC)"
# The C library's tests (capi/tests/c_programs.rs) run the librdma_pool.so that cargo test does
# not build (a cdylib is no dependency of a test): built first, with the same features.
cargo build -p rdma-pool-capi --features pool/tokio,pool/serde
cargo test --workspace --exclude rdma-pool-allocator-api --features rdma-pool/tokio,rdma-pool/serde
stage "the README's program, as a user runs it (tests/readme.rs checks it is examples/readme.rs)"
cargo run --features tokio,serde --example readme
stage "cargo test --no-default-features (without the verbs backend)"
# The grant model, flood and region grants ran at full size above (20,000 steps, ~2.5 min on 2 cores): smoke
# size here, as in the ASan pass.
RDMA_POOL_MODEL_STEPS=2000 RDMA_POOL_GRANT_FLOOD=8192 RDMA_POOL_REGION_GRANTS=600 cargo test --no-default-features --lib --tests

# Memory-checker mode: the fill and counters on stable, then every test binary under
# AddressSanitizer with the pool poisoning its freed blocks (RUSTC_BOOTSTRAP=1).
bash scripts/memcheck.sh

stage "the C library installs, and a C program builds against it with pkg-config"
capi_prefix=$(mktemp -d)
RDMA_POOL_CAPI_CARGO_FLAGS="--features pool/tokio,pool/serde" bash scripts/install-capi.sh --debug "$capi_prefix"
PKG_CONFIG_PATH=$capi_prefix/lib/pkgconfig cc -O1 -Wall -Werror -pthread -o "$capi_prefix/malloc_family" \
    capi/tests/c/malloc_family.c $(PKG_CONFIG_PATH=$capi_prefix/lib/pkgconfig pkg-config --cflags --libs rdma_pool) \
    -Wl,-rpath,"$capi_prefix/lib"
"$capi_prefix/malloc_family"
# Statically, as the README says: a C++ program that never names malloc gets the pool's.
PKG_CONFIG_PATH=$capi_prefix/lib/pkgconfig g++ -O1 -pthread -o "$capi_prefix/cxx_new" capi/tests/c/cxx_new.cpp \
    -Wl,-Bstatic -lrdma_pool -Wl,-Bdynamic $(PKG_CONFIG_PATH=$capi_prefix/lib/pkgconfig pkg-config --cflags --static --libs rdma_pool)
"$capi_prefix/cxx_new"
rm -rf "$capi_prefix"

stage "comparison suite, smoke run (debug build, scale 0.01): every allocator computes the same results"
cargo build -p rdma-pool-comparison --bins
target/debug/compare --repeats 1 --scale 0.01 > /dev/null
stage "comparison suite, C programs under LD_PRELOAD, smoke run (scale 0.01): every allocator computes the same results"
# rdma-pool's column preloads $RDMA_POOL_SO: here the debug librdma_pool.so built above (set, it
# must exist).
RDMA_POOL_SO=$PWD/target/debug/librdma_pool.so bash scripts/compare-c.sh --smoke

stage "Soft-RoCE (rxe) scenario suite in a QEMU guest"
# cargo prints "Executable tests/scenarios.rs (target/debug/deps/scenarios-HASH)".
bins=$(cargo test --no-run --features tokio,serde --test async_completions --test scenarios --test pinning --test arena --test alloc --test global --test global_faults --test provisioning --test grant --test prefetch --test queue_mem --test rails --test numa --test hardening --test stress --test fork --test events --test spawn --test owned --test mlx5_model --test soft_rules --test send_queue --test foreign --test cm --test cm_hostile 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
[ -n "$bins" ] || { echo "could not find the scenario test binaries" >&2; exit 1; }
# The memory-checker tests (feature `memcheck`, without ASan): rxe DMA into live blocks, the fill
# of freed ones.
memcheck_bin=$(cargo test --no-run --features memcheck --test memcheck 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
[ -n "$memcheck_bin" ] || { echo "could not find the memcheck test binary" >&2; exit 1; }
bins="$bins $memcheck_bin"
# The grants, two_rails and README examples run there too (they ignore the test harness's arguments;
# two_rails on rxe0 and rxe1, RDMA_POOL_RAILS below).
# The rdma_cm tokio server runs as a server and two clients (three processes, on 10.77.0.2).
# Same features as the test binaries above: no second build of the crate.
cargo build --features tokio,serde --example grants --example two_rails --example cm_server --example readme
bins="$bins target/debug/examples/grants target/debug/examples/two_rails target/debug/examples/cm_server target/debug/examples/readme"
# The sideway interop example (interop/): sideway owns the device, QPs and connection, rdma-pool
# the memory and the grant; a server and a client process on rxe0 and rxe1.
cargo build -p rdma-pool-interop
bins="$bins target/debug/sideway_interop"
# The C library's programs (capi/tests/c/): its malloc family and threads/fork/exec on a verbs
# device (pinned registration), the RDMA program and the README's example; statically linked
# with librdma_pool.a, so the guest needs no library path; they ignore the harness's arguments.
for c in malloc_family threads_fork rdma_app readme; do
    cc -O1 -Wall -Werror -pthread -I capi -o "target/debug/c_$c" "capi/tests/c/$c.c" target/debug/librdma_pool.a \
        -libverbs -lrdmacm -lgcc_s -lutil -lrt -lpthread -lm -ldl
    bins="$bins target/debug/c_$c"
done
# The proptest models (the allocator's, and the whole pool's in tests/hardening) run on the
# soft NIC in either place: a few cases in the emulated guest, the full 100k operations each
# on the host above; the grant model, flood and region-grant loops (soft devices) likewise run
# at smoke size there (full size in the soft-NIC pass). The guest has 2 NUMA nodes
# (tests/rxe/run.sh), which the NUMA tests check they see.
# One boot runs every binary as the user and as root: about 42 minutes under TCG on 2 cores
# (2026-11-27), so the boot's limit is raised from run.sh's 2400 s; SPAWN_ROUNDS=10 (40 on the
# host) keeps the spawn test's threads-and-exec rounds to ~50 s a pass there.
RXE_TIMEOUT="${RXE_TIMEOUT:-3000}" \
RXE_GUEST_ENV="${RXE_GUEST_ENV:-} RDMA_POOL_TEST_SCALE=25 PROPTEST_CASES=4 RDMA_POOL_MODEL_STEPS=100 RDMA_POOL_GRANT_FLOOD=2048 RDMA_POOL_REGION_GRANTS=300 SPAWN_ROUNDS=10 RDMA_POOL_RAILS=rxe0,rxe1 RDMA_POOL_TEST_NUMA_NODES=2 STRESS_SECS=4" bash tests/rxe/run.sh $bins
echo "== all checks passed in $(( $(date +%s) - start )) s"
