#!/usr/bin/env bash
# The comparison suite (docs/benchmarks.md, "Comparison suite"): builds the workload binaries in
# release mode — one per allocator as #[global_allocator]: rdma-pool's GlobalPool on the soft NIC, mimalloc,
# jemalloc, glibc — and, through scripts/compare-c.sh, the C programs of comparison/c with each
# allocator's shared library in LD_PRELOAD (rows `c/…`; rdma-pool's librdma_pool.so from
# $RDMA_POOL_SO, "not built" when it is not there), runs every workload with every allocator back
# to back, repeated, and writes the markdown table (with the machine it ran on and the
# allocators' versions: time, peak and final memory per allocator) to comparison/RESULTS.md and
# into docs/benchmarks.md, and the resident memory over the `phases` workload to
# comparison/rss-phases.png. Full scale is for here only: CI runs the suite at scale 0.01 in a
# debug build (scripts/test.sh). A run that crashes, hangs past the timeout or computes another
# result than the other allocators is a failure of its allocator in the table (the rest still
# runs; the script then exits with status 1).
# Arguments go to the runner: --threads N (the …N workloads; default: the cores), --repeats R
# (default 3), --scale F (1 = the originals' parameters), --only a,b (labels or workload names),
# --timeout SECS (per run; default 300 × scale, at least 60), --settle MS (default here 1500: final
# memory read that long after the workload returned).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# Huge pages, as for the tests, where we may reserve them: rdma-pool prefers them.
if [ "$(id -u)" -eq 0 ] && [ -w /proc/sys/vm/nr_hugepages ]; then
    [ "$(cat /proc/sys/vm/nr_hugepages)" -ge 8 ] || echo 8 > /proc/sys/vm/nr_hugepages || true
fi
cargo build --release -p rdma-pool-comparison --bins
# librdma_pool.so, for the C rows' rdma-pool column (RDMA_POOL_SO, default its release build).
[ -n "${RDMA_POOL_SO:-}" ] || cargo build --release -p rdma-pool-capi
# The C programs, mimalloc v3's and jemalloc's libraries, the versions: sets C_ARGS and C_TARGET.
# shellcheck source=scripts/compare-c.sh
source scripts/compare-c.sh
c_prepare
# Final memory is read again 1.5 s after each workload returned (rdma-pool's purge delay is 1 s;
# jemalloc is configured alike by the runner): what each allocator gives back on time.
exec "$C_TARGET/release/compare" --out comparison/RESULTS.md --doc docs/benchmarks.md --settle 1500 "${C_ARGS[@]}" "$@"
