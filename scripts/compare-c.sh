#!/usr/bin/env bash
# The comparison suite's C programs (comparison/c: mimalloc-bench's benchmarks re-written as
# whole C programs) under LD_PRELOAD, in the same table as the Rust workloads: the runner
# (comparison/src/bin/compare.rs) runs them as rows `c/<name>` with `--c-dir`, once per
# allocator with its shared library preloaded, and checks that every allocator computes the
# same result. This script makes what they need and tells the runner where it is:
#   - the programs, compiled with `cc -O2 -pthread` into <target>/compare-c/bin;
#   - mimalloc v3's libmimalloc.so, built with cc from the source the Rust crate vendors
#     (libmimalloc-sys's c_src/mimalloc/v3, found with `cargo metadata`);
#   - jemalloc: Debian's libjemalloc2 (installed when missing);
#   - glibc: no preload;
#   - rdma-pool: librdma_pool.so (workspace crate capi/, `cargo build --release -p
#     rdma-pool-capi`) from $RDMA_POOL_SO, default <target>/release/librdma_pool.so. When it is
#     not there its cells say "not built" (the rest still runs).
# The table's header names the allocators' versions (the Rust rows' too).
#
#   scripts/compare-c.sh [RUNNER ARGS]  the C rows alone (release runner), the table on stdout;
#                                       runner arguments as for scripts/compare.sh (--scale F,
#                                       --repeats R, --threads N, --only a,b, --timeout SECS)
#   scripts/compare-c.sh --smoke        CI (scripts/test.sh): every program once per allocator
#                                       at scale 0.01 (debug runner), fails when they disagree
#                                       or one crashes; fails when RDMA_POOL_SO is set and the
#                                       file is missing
# scripts/compare.sh sources this file and calls c_prepare, which sets C_ARGS (the runner's
# arguments for the C rows), so that its one run writes one table with both kinds of rows.

c_die() {
    echo "compare-c: $*" >&2
    return 1
}

# The Debian package of jemalloc, installed like scripts/deps.sh installs (root or sudo).
c_jemalloc() {
    # (No `| grep -q`, `| head` under pipefail: the writer's SIGPIPE would fail the pipeline.)
    if [ "$(dpkg-query -W -f='${Status}' libjemalloc2 2>/dev/null)" != "install ok installed" ]; then
        echo "compare-c: installing libjemalloc2" >&2
        local sudo_=""
        [ "$(id -u)" -eq 0 ] || sudo_="sudo"
        export DEBIAN_FRONTEND=noninteractive
        { $sudo_ apt-get -o DPkg::Lock::Timeout=300 update -qq &&
            $sudo_ apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends \
                libjemalloc2 >/dev/null; } || echo "compare-c: could not install libjemalloc2" >&2
    fi
    C_JEMALLOC_SO=$(dpkg -L libjemalloc2 2>/dev/null | awk '/\/libjemalloc\.so\.2$/ { p = $0 } END { print p }')
    # Not installed: the runner says "not built".
    [ -n "$C_JEMALLOC_SO" ] || C_JEMALLOC_SO=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
    C_JEMALLOC_VERSION=$(dpkg-query -W -f='${Version}' libjemalloc2 2>/dev/null) || true
}

# "3.3.2" from MI_MALLOC_VERSION (30302) in a mimalloc source tree's include/mimalloc.h.
c_mimalloc_version() {
    local v
    v=$(sed -n 's/^#define MI_MALLOC_VERSION *\([0-9]*\).*/\1/p' "$1/include/mimalloc.h")
    echo "$((v / 10000)).$((v / 100 % 100)).$((v % 100))"
}

# Sets C_ARGS, the runner's arguments for the C rows (programs, libraries, versions), and
# C_TARGET, cargo's target directory.
c_prepare() {
    local meta out target mi_sys_dir mi_sys_v2 mi_sys_version mi_version je_version \
        je_sys_version pool_version capi_version
    meta=$(cargo metadata --format-version 1) || c_die "cargo metadata failed"
    # The target directory and the allocator crates' versions, as shell assignments.
    eval "$(python3 -c '
import json, os, shlex, sys
m = json.load(sys.stdin)
features = {n["id"]: n["features"] for n in m["resolve"]["nodes"]}
def pkg(name):
    return next((p for p in m["packages"] if p["name"] == name), None)
out = {"target": m["target_directory"]}
for var, name in [("mi_sys", "libmimalloc-sys"), ("mi", "mimalloc"),
                  ("je", "tikv-jemallocator"), ("je_sys", "tikv-jemalloc-sys"),
                  ("pool", "rdma-pool"), ("capi", "rdma-pool-capi")]:
    p = pkg(name)
    out[var + "_version"] = p["version"] if p else ""
    if p and var == "mi_sys":
        out["mi_sys_dir"] = os.path.dirname(p["manifest_path"])
        out["mi_sys_v2"] = "1" if "v2" in features.get(p["id"], []) else ""
for k, v in out.items():
    print(f"{k}={shlex.quote(v)}")
' <<<"$meta")"
    [ -n "$mi_sys_dir" ] || c_die "libmimalloc-sys is not in the dependency graph"
    C_TARGET="$target"
    out="$target/compare-c"
    mkdir -p "$out/bin"

    # The programs.
    local src name
    for src in comparison/c/*.c; do
        name=$(basename "$src" .c)
        if [ ! -x "$out/bin/$name" ] || [ "$src" -nt "$out/bin/$name" ] ||
            [ comparison/c/common.h -nt "$out/bin/$name" ]; then
            cc -O2 -pthread -Wall -o "$out/bin/$name" "$src"
        fi
    done

    # mimalloc v3 as a shared library overriding malloc: the definitions its CMake build gives
    # the shared target (MI_OVERRIDE is on by default), release mode as the crate builds it.
    local mi_src="$mi_sys_dir/c_src/mimalloc/v3" so_version mi_so
    [ -f "$mi_src/src/static.c" ] || c_die "no mimalloc v3 source in $mi_sys_dir"
    so_version=$(c_mimalloc_version "$mi_src")
    mi_so="$out/mimalloc-$so_version/libmimalloc.so"
    if [ ! -f "$mi_so" ] || [ scripts/compare-c.sh -nt "$mi_so" ]; then
        echo "compare-c: building mimalloc $so_version (libmimalloc-sys $mi_sys_version)" >&2
        mkdir -p "$(dirname "$mi_so")"
        cc -O2 -fPIC -shared -DNDEBUG -DMI_BUILD_RELEASE -DMI_MALLOC_OVERRIDE \
            -DMI_SHARED_LIB -DMI_SHARED_LIB_EXPORT -fvisibility=hidden -ftls-model=initial-exec \
            -fno-builtin-malloc -I "$mi_src/include" "$mi_src/src/static.c" -o "$mi_so.tmp" -lpthread
        mv "$mi_so.tmp" "$mi_so"
    fi
    nm -D --defined-only "$mi_so" | grep -w malloc >/dev/null || c_die "$mi_so does not define malloc"

    c_jemalloc
    local pool_so="${RDMA_POOL_SO:-$target/release/librdma_pool.so}" pool commit
    commit=$(git rev-parse --short HEAD 2>/dev/null) || commit="?"
    pool="librdma_pool.so (rdma-pool-capi ${capi_version:-?}, commit $commit)"
    [ -f "$pool_so" ] || pool="librdma_pool.so not built (no ${pool_so#"$PWD"/}: \`cargo build \
--release -p rdma-pool-capi\`, or set RDMA_POOL_SO)"
    local glibc_line glibc # "ldd (Debian GLIBC 2.36-9+deb12u14) 2.36"
    glibc_line=$(ldd --version | sed -n 1p)
    glibc="glibc ${glibc_line##* } ($(sed -n 's/^[^(]*(\(.*\)).*/\1/p' <<<"$glibc_line"))"
    local rust_mi=v3 # the Rust crate's mimalloc: v3 unless its feature v2 is on
    [ -z "$mi_sys_v2" ] || rust_mi=v2
    rust_mi=$(c_mimalloc_version "$mi_sys_dir/c_src/mimalloc/$rust_mi")
    local jemalloc="${je_sys_version#*+}" # 0.6.1+5.3.0-1-ge13ca993…
    jemalloc="${jemalloc%%-*}"

    C_ARGS=(--c-dir "$out/bin"
        --preload "rdma_pool=$pool_so"
        --preload "mimalloc=$mi_so"
        --preload "jemalloc=$C_JEMALLOC_SO"
        --note "Versions. Rust rows: rdma_pool = rdma-pool $pool_version's GlobalPool; \
mimalloc = mimalloc $rust_mi (crate mimalloc $mi_version, libmimalloc-sys $mi_sys_version); \
jemalloc = jemalloc $jemalloc (tikv-jemallocator $je_version); system = $glibc."
        --note "C rows: rdma_pool = $pool; mimalloc = libmimalloc.so $so_version built with cc \
from libmimalloc-sys $mi_sys_version's c_src/mimalloc/v3; jemalloc = Debian libjemalloc2 \
${C_JEMALLOC_VERSION:-not installed}; system = $glibc, no preload.")
}

c_main() {
    set -euo pipefail
    cd "$(dirname "$0")/.."
    if [ "${1:-}" = "--smoke" ]; then
        shift
        if [ -n "${RDMA_POOL_SO:-}" ] && [ ! -f "$RDMA_POOL_SO" ]; then
            echo "compare-c: RDMA_POOL_SO=$RDMA_POOL_SO does not exist" >&2
            exit 1
        fi
        c_prepare
        cargo build -p rdma-pool-comparison --bin compare
        "$C_TARGET/debug/compare" --c-only "${C_ARGS[@]}" --repeats 1 --scale 0.01 --timeout 60 \
            "$@" >/dev/null
    else
        c_prepare
        cargo build --release -p rdma-pool-comparison --bin compare
        exec "$C_TARGET/release/compare" --c-only "${C_ARGS[@]}" "$@"
    fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    c_main "$@"
fi
