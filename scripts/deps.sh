#!/usr/bin/env bash
# Install the Debian/Ubuntu packages rdma-pool needs to build (the verbs backend binds
# libibverbs through rdma-sys, which runs bindgen). Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(libibverbs-dev librdmacm-dev libclang-dev pkg-config)
if [ "${1:-}" = "--vm" ]; then
    # The Soft-RoCE test bed (tests/rxe/run.sh) boots a QEMU guest; the sideway interop
    # example (interop/) builds sideway's C shim with cmake.
    pkgs+=(qemu-system-x86 busybox-static cpio kmod cmake)
    # The C library's tests (capi/tests/c_programs.rs) compile C programs and run real ones
    # under LD_PRELOAD.
    pkgs+=(gcc g++ libc6-dev python3 sqlite3)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "rdma-pool: installing ${missing[*]}" >&2
sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo_ apt-get update -qq
$sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
