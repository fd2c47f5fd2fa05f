#!/usr/bin/env bash
# Build and install the C library (README, "C and C++"): librdma_pool.so and librdma_pool.a into
# PREFIX/lib, rdma_pool.h into PREFIX/include, rdma_pool.pc into PREFIX/lib/pkgconfig.
#   bash scripts/install-capi.sh [--debug] [PREFIX]      (PREFIX defaults to /usr/local)
# Then: cc app.c $(pkg-config --cflags --libs rdma_pool)   or   LD_PRELOAD=PREFIX/lib/librdma_pool.so app
# (for a PREFIX pkg-config does not search: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
if [ "${1:-}" = --debug ]; then
    profile=debug
    shift
fi
prefix=${1:-/usr/local}
bash scripts/deps.sh
# RDMA_POOL_CAPI_CARGO_FLAGS: more cargo flags (the test script passes its features, so that
# nothing is built twice).
flags=(-p rdma-pool-capi)
[ $profile = release ] && flags+=(--release)
# shellcheck disable=SC2206 # word splitting intended
flags+=(${RDMA_POOL_CAPI_CARGO_FLAGS:-})
cargo build "${flags[@]}"
target=${CARGO_TARGET_DIR:-target}/$profile
version=$(sed -n 's/^version = "\(.*\)"/\1/p' capi/Cargo.toml | head -n1)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 755 "$target/librdma_pool.so" "$prefix/lib/librdma_pool.so"
install -m 644 "$target/librdma_pool.a" "$prefix/lib/librdma_pool.a"
install -m 644 capi/rdma_pool.h "$prefix/include/rdma_pool.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" capi/rdma_pool.pc.in >"$prefix/lib/pkgconfig/rdma_pool.pc"
echo "installed librdma_pool $version ($profile) into $prefix"
