#!/usr/bin/env bash
# tests/rxe/run.sh — run host-built test binaries in a QEMU guest with Soft-RoCE (rdma_rxe).
#
# Usage:
#   tests/rxe/run.sh BIN [BIN ...]   run each BIN (a libtest binary, e.g. from
#                                    `cargo test --no-run`) as uid 1000 in the guest with
#                                    --test-threads=1; exit 0 only if every BIN exits 0
#   tests/rxe/run.sh --smoke         run no binaries; check the guest's RDMA set-up with
#                                    ibv_rc_pingpong between rxe0 and rxe1
#
# Environment (all optional):
#   RXE_CACHE      download/unpack cache       (default: $HOME/.cache/rdma-pool-rxe)
#   RXE_WORK       initramfs + serial logs      (default: <repo root>/target/rxe)
#   RXE_TIMEOUT    seconds for one guest boot   (default: 1200)
#   RXE_TEST_ARGS  extra args for every test binary, split on blanks (e.g. "--nocapture mr_")
#   RXE_BIN_ARGS   the first args of every binary (default "--test-threads=1"; "--bench" runs a
#                  criterion bench binary from `cargo bench --no-run`)
#   RXE_GUEST_ENV  extra VAR=value words for the guest test environment (e.g. "RUST_LOG=debug")
#   RXE_MEM / RXE_SMP   guest memory / CPUs     (default: 2G / 2)
#   RXE_NUMA       NUMA nodes of the guest      (default: 2 when RXE_SMP >= 2: one CPU and an
#                                                equal share of memory each; 1: no NUMA)
#   RXE_ACCEL      QEMU accelerator             (default: tcg; "kvm" where KVM works)
#   RXE_MIRROR     Debian mirror URL            (default: the host's own apt mirror)
#   RXE_REFRESH=1  ignore the cached guest root and resolve/download again
#
# Exit status: 0 all passed; 1 a test (or the smoke test) failed; 2 usage or host set-up
# error; 3 the guest gave no result (timeout, crash, missing marker).
#
# What it does: installs the host packages it needs (qemu-system-x86 busybox-static cpio
# kmod), downloads Debian's kernel (trixie-backports) and rdma-core/iproute2/libc (sid) through
# a private apt configuration (the host's apt set-up is not touched), builds an initramfs with
# busybox + those files + the given binaries + tests/rxe/guest-init.sh as /init, boots it with
# qemu and parses the serial log. See tests/rxe/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(git -C "$HERE" rev-parse --show-toplevel 2>/dev/null || (cd "$HERE/../.." && pwd))
CACHE=${RXE_CACHE:-$HOME/.cache/rdma-pool-rxe}
WORK=${RXE_WORK:-$REPO_ROOT/target/rxe}
TIMEOUT=${RXE_TIMEOUT:-2400}
MEM=${RXE_MEM:-2G}
SMP=${RXE_SMP:-2}
ACCEL=${RXE_ACCEL:-tcg}
NUMA=${RXE_NUMA:-2}

# --- what goes into the guest --------------------------------------------------------------
# Pinned versions (measured to work, 2026-11). If a pin is gone from the mirror, the suite's
# current version is used and a loud warning printed; the versions used are always printed.
# Kernel: Debian's 7.3.4 from trixie-backports (kernel image and modules are split packages).
KERNEL_PKGS=(
	linux-binary-7.3.4+deb13-amd64=7.3.4-1~bpo13+1
	linux-modules-7.3.4+deb13-amd64=7.3.4-1~bpo13+1
)
# User space from sid. Explicit list: the shared-library closure of the tools used in the
# guest (iproute2's ip and rdma, ibverbs-utils) and of Rust test binaries (libc, libgcc_s,
# libibverbs + providers, librdmacm). The script checks the closure and fails if a library is
# missing (see check_libraries).
USER_PKGS=(
	libc6=2.43-7
	libgcc-s1=16.2.0-4
	libibverbs1=65.0-1.1
	ibverbs-providers=65.0-1.1
	librdmacm1t64=65.0-1.1
	ibverbs-utils=65.0-1.1
	libnl-3-200=3.12.0-2+b1
	libnl-route-3-200=3.12.0-2+b1
	iproute2=7.3.0-1
	libmnl0=1.0.5-3+b2         # ip, rdma
	libcap2=1:2.78-1+b1        # ip, rdma
	libbpf1=1:1.7.0-1          # ip
	libelf1t64=0.196-1         # ip, libbpf
	libselinux1=3.11-2.1+b1    # ip
	libpcre2-8-0=10.49-1       # libselinux
	zlib1g=1:1.3.dfsg+really1.3.2-4 # libelf, libbpf
	libzstd1=1.5.7+dfsg-4      # libelf
)
# Kernel modules loaded by /init (their dependencies are found through modules.dep).
MODULES=(veth rdma_rxe ib_uverbs rdma_ucm)
HOST_PKGS=(qemu-system-x86 busybox-static cpio kmod)
CACHE_FORMAT=1 # bump when the layout of the cached guest root changes

log() { printf '[rxe] %s\n' "$*" >&2; }
die() { printf '[rxe] ERROR: %s\n' "$*" >&2; exit 2; }
loud() {
	printf '[rxe] %s\n' '#####################################################################' >&2
	printf '[rxe] ##### %s\n' "$@" >&2
	printf '[rxe] %s\n' '#####################################################################' >&2
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

# --- arguments ------------------------------------------------------------------------------
MODE=tests
BINS=()
[ $# -gt 0 ] || usage
for a in "$@"; do
	case $a in
	--smoke) MODE=smoke ;;
	-h | --help) usage ;;
	-*) die "unknown option $a" ;;
	*)
		[ -f "$a" ] && [ -x "$a" ] || die "not an executable file: $a"
		BINS+=("$(cd "$(dirname "$a")" && pwd)/$(basename "$a")")
		;;
	esac
done
if [ $MODE = smoke ] && [ ${#BINS[@]} -gt 0 ]; then die "--smoke takes no binaries"; fi
declare -A SEEN=()
for b in "${BINS[@]}"; do
	n=$(basename "$b")
	[ -z "${SEEN[$n]:-}" ] || die "two binaries named $n"
	SEEN[$n]=1
done

T_START=$(now)
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

# --- host packages ----------------------------------------------------------------------------
pkg_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = 'install ok installed' ]; }
missing=()
for p in "${HOST_PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
	log "installing host packages: ${missing[*]}"
	$SUDO apt-get update -q
	$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
BUSYBOX=/bin/busybox # from busybox-static
QEMU=qemu-system-x86_64
command -v $QEMU >/dev/null || die "$QEMU not found"

# --- private apt configuration (the host's apt set-up is left alone) --------------------------
APT_DIR=$CACHE/apt
export APT_CONFIG=$APT_DIR/apt.conf

# The Debian mirror the host already uses: first URI ending in /debian in the host's sources.
host_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		case $f in
		*.sources) sed -n 's/^URIs:[[:space:]]*//p' "$f" | tr ' ' '\n' ;;
		*) sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]\+\).*/\2/p' "$f" ;;
		esac
	done | grep -E '^(https?|ftp)://[^ ]*/debian/?$' | grep -v snapshot | head -n1 | sed 's:/$::'
}

# write_apt_config KEYRING_OPTION: sources for trixie, trixie-backports and sid on $MIRROR.
write_apt_config() {
	local opt=$1
	mkdir -p "$APT_DIR"/{state/lists/partial,cache/archives/partial,etc/apt.conf.d,etc/preferences.d,etc/trusted.gpg.d,etc/sources.list.d}
	touch "$APT_DIR/state/status"
	cat >"$APT_DIR/etc/sources.list" <<-EOF
		deb [$opt] $MIRROR trixie main
		deb [$opt] $MIRROR trixie-backports main
		deb [$opt] $MIRROR sid main
	EOF
	cat >"$APT_CONFIG" <<-EOF
		Dir::State "$APT_DIR/state";
		Dir::State::status "$APT_DIR/state/status";
		Dir::Cache "$APT_DIR/cache";
		Dir::Etc "$APT_DIR/etc";
		Dir::Etc::SourceList "$APT_DIR/etc/sources.list";
		Dir::Etc::SourceParts "$APT_DIR/etc/sources.list.d";
		Dir::Etc::Parts "$APT_DIR/etc/apt.conf.d";
		Dir::Etc::Preferences "$APT_DIR/etc/preferences";
		Dir::Etc::PreferencesParts "$APT_DIR/etc/preferences.d";
		Dir::Etc::TrustedParts "$APT_DIR/etc/trusted.gpg.d";
		APT::Architecture "amd64";
		APT::Architectures { "amd64"; };
		APT::Sandbox::User "$(id -un)";
		Acquire::Languages "none";
		Acquire::Check-Valid-Until "false";
	EOF
}

# apt_update: 0 if the indexes were fetched and verified.
apt_update() {
	local out
	if out=$(apt-get update -q 2>&1) && ! grep -q -E 'NO_PUBKEY|EXPKEYSIG|KEYEXPIRED|not signed|GPG error' <<<"$out"; then
		return 0
	fi
	printf '%s\n' "$out" | tail -n 8 >&2
	return 1
}

setup_private_apt() {
	MIRROR=${RXE_MIRROR:-$(host_mirror)}
	[ -n "$MIRROR" ] || die "no Debian mirror found in the host's apt sources; set RXE_MIRROR"
	log "private apt: $MIRROR (trixie, trixie-backports, sid), config $APT_CONFIG"
	local own_keyring=$APT_DIR/keyring/usr/share/keyrings/debian-archive-keyring.gpg
	[ -e "$own_keyring" ] || own_keyring=${own_keyring%.gpg}.pgp
	if [ -r "$own_keyring" ]; then
		write_apt_config "signed-by=$own_keyring"
		apt_update && return 0
	fi
	write_apt_config "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg"
	apt_update && return 0
	# The host's keyring (Debian 12's) may not know the keys that sign trixie/sid today.
	# Bootstrap: fetch only the debian-archive-keyring package from sid WITHOUT signature
	# checks ([trusted=yes], from the same mirror the host trusts), take its keyring and verify
	# everything else with it.
	log "host keyring cannot verify trixie/sid; bootstrapping debian-archive-keyring from sid"
	write_apt_config "trusted=yes"
	apt-get update -q >/dev/null || die "apt-get update (bootstrap) failed"
	rm -rf "$APT_DIR/keyring" && mkdir -p "$APT_DIR/keyring"
	(cd "$APT_DIR/keyring" && apt-get download -q debian-archive-keyring/sid >/dev/null &&
		dpkg-deb -x debian-archive-keyring_*.deb .) || die "could not fetch debian-archive-keyring"
	own_keyring=$APT_DIR/keyring/usr/share/keyrings/debian-archive-keyring.gpg
	[ -e "$own_keyring" ] || own_keyring=${own_keyring%.gpg}.pgp
	write_apt_config "signed-by=$own_keyring"
	apt_update || die "apt-get update failed even with sid's debian-archive-keyring"
}

# on_mirror SPEC: is pkg=version in the indexes? (apt-cache show exits 0 even when it is not.)
on_mirror() { apt-cache show "$1" 2>/dev/null | grep '^Package:' >/dev/null; }

# resolve SPEC (pkg=version) -> prints pkg=version that exists on the mirror.
resolve() {
	local spec=$1 pkg=${1%%=*} cand
	if on_mirror "$spec"; then
		echo "$spec"
		return
	fi
	cand=$(apt-cache policy "$pkg" | awk '/Candidate:/ { print $2 }')
	[ -n "$cand" ] && [ "$cand" != "(none)" ] || die "package $pkg not found on $MIRROR"
	loud "PINNED $spec IS GONE FROM THE MIRROR" "USING THE CURRENT VERSION INSTEAD: $pkg=$cand"
	echo "$pkg=$cand"
}

# The pinned kernel is gone (backports keeps only the newest): take what trixie-backports'
# linux-image-amd64 points to now, split into linux-binary-* + linux-modules-* if it is.
resolve_kernel_fallback() {
	local meta_ver img img_ver deps
	meta_ver=$(apt-cache madison linux-image-amd64 | awk -F'|' '/trixie-backports/ && v == "" { gsub(/ /, "", $2); v = $2 } END { print v }')
	[ -n "$meta_ver" ] || die "no linux-image-amd64 in trixie-backports"
	img=$(apt-cache show "linux-image-amd64=$meta_ver" | sed -n 's/^Depends: //p' | tr ',' '\n' |
		grep -o 'linux-image-[^ ]*' | head -n1)
	img_ver=$(apt-cache madison "$img" | awk -F'|' 'v == "" { gsub(/ /, "", $2); v = $2 } END { print v }')
	deps=$(apt-cache show "$img=$img_ver" | sed -n 's/^Depends: //p' | tr ',' '\n' |
		grep -o -E 'linux-(binary|modules)-[^ ]*' | sort -u)
	loud "PINNED KERNEL ${KERNEL_PKGS[*]} IS GONE FROM THE MIRROR" \
		"USING trixie-backports' CURRENT KERNEL: $img $img_ver"
	if [ -n "$deps" ]; then
		for d in $deps; do echo "$d=$img_ver"; done
	else
		echo "$img=$img_ver" # old layout: one package with image and modules
	fi
}

# download SPEC... into $CACHE/debs (skipping files already there); adds the paths to DEBS.
DEBS=()
download() {
	local spec file arch
	mkdir -p "$CACHE/debs"
	for spec in "$@"; do
		# apt-get download's file name: PKG_VERSION_ARCH.deb with ":" (epoch) as "%3a".
		arch=$(apt-cache show "$spec" | sed -n 's/^Architecture: //p' | head -n1)
		file=$CACHE/debs/${spec%%=*}_${spec#*=}_$arch.deb
		file=${file//:/%3a}
		if [ ! -s "$file" ]; then
			(cd "$CACHE/debs" && apt-get download -q "$spec" >&2) || die "download of $spec failed"
		fi
		DEBS+=("$file")
	done
}

# --- the guest root (cached; rebuilt only when the package/module lists change) --------------
KEY=$(printf '%s\n' "$CACHE_FORMAT" "${KERNEL_PKGS[@]}" "${USER_PKGS[@]}" "${MODULES[@]}" | sha256sum | cut -c1-16)
GUEST=$CACHE/guest-$KEY

build_guest_root() {
	local tmp=$GUEST.tmp specs=() kspecs=() s out
	rm -rf "$tmp" && mkdir -p "$tmp/root" "$tmp/kernel"
	setup_private_apt
	if on_mirror "${KERNEL_PKGS[0]}" && on_mirror "${KERNEL_PKGS[1]}"; then
		kspecs=("${KERNEL_PKGS[@]}")
	else
		out=$(resolve_kernel_fallback) || exit 2
		mapfile -t kspecs <<<"$out"
	fi
	for s in "${USER_PKGS[@]}"; do
		out=$(resolve "$s") || exit 2
		specs+=("$out")
	done

	log "downloading (cached in $CACHE/debs) ..."
	download "${kspecs[@]}" "${specs[@]}"
	: >"$tmp/versions.txt"
	# Record where a pin could not be honoured (shown with the versions on every run).
	for s in "${KERNEL_PKGS[@]}" "${USER_PKGS[@]}"; do
		case " ${kspecs[*]} ${specs[*]} " in
		*" $s "*) ;;
		*) echo "NOTE: pinned $s was not on the mirror; a newer version was used" >>"$tmp/notes.txt" ;;
		esac
	done
	for d in "${DEBS[@]}"; do
		printf '%-36s %s\n' "$(dpkg-deb -f "$d" Package)" "$(dpkg-deb -f "$d" Version)" >>"$tmp/versions.txt"
		case $(basename "$d") in
		linux-*) dpkg-deb -x "$d" "$tmp/kernel" ;;
		*) dpkg-deb -x "$d" "$tmp/root" ;;
		esac
	done

	# Kernel: image + only the modules we load (and their dependencies), decompressed (busybox
	# modprobe cannot read .ko.xz), indexed with depmod for the guest's modprobe.
	local kdir kver vmlinuz mods d f
	kdir= vmlinuz=
	for d in "$tmp"/kernel/usr/lib/modules/* "$tmp"/kernel/lib/modules/*; do
		[ -d "$d" ] && kdir=$d && break
	done
	[ -n "$kdir" ] || die "no modules directory in the kernel packages"
	kver=$(basename "$kdir")
	for f in "$kdir/vmlinuz" "$tmp/kernel/boot/vmlinuz-$kver"; do
		[ -f "$f" ] && vmlinuz=$f && break
	done
	[ -n "$vmlinuz" ] || die "no vmlinuz in the kernel packages"
	cp "$vmlinuz" "$tmp/vmlinuz"
	echo "$kver" >"$tmp/kver"
	depmod -b "$(dirname "$(dirname "$(dirname "$kdir")")")" "$kver" 2>/dev/null
	mods=$(modprobe -d "$(dirname "$(dirname "$(dirname "$kdir")")")" -S "$kver" --show-depends -a "${MODULES[@]}" |
		awk '$1 == "insmod" { print $2 }' | sort -u)
	[ -n "$mods" ] || die "modprobe --show-depends found no modules"
	local m rel dst
	for m in $mods; do
		rel=${m#"$kdir"/}
		dst=$tmp/root/usr/lib/modules/$kver/${rel%.xz}
		dst=${dst%.zst}
		mkdir -p "$(dirname "$dst")"
		case $m in
		*.xz) $BUSYBOX unxz -c "$m" >"$dst" ;;
		*.zst) zstd -q -d -c "$m" >"$dst" ;;
		*) cp "$m" "$dst" ;;
		esac
	done
	depmod -b "$tmp/root/usr" "$kver" 2>/dev/null
	rm -rf "$tmp/kernel"

	# Merged-/usr layout; the ELF interpreter is /lib64/ld-linux-x86-64.so.2.
	local r=$tmp/root
	rm -rf "$r"/usr/share/{doc,man,info,locale,lintian,bug} "$r"/usr/include
	mkdir -p "$r/usr/bin" "$r/usr/sbin" "$r/usr/lib64"
	ln -sfn usr/bin "$r/bin"
	ln -sfn usr/sbin "$r/sbin"
	ln -sfn usr/lib "$r/lib"
	ln -sfn usr/lib64 "$r/lib64"
	ln -sfn ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$r/usr/lib64/ld-linux-x86-64.so.2"
	rm -rf "$GUEST" && mv "$tmp" "$GUEST"
	touch "$GUEST/.complete"
}

if [ "${RXE_REFRESH:-0}" = 1 ] || [ ! -e "$GUEST/.complete" ]; then
	log "preparing guest root $GUEST (first run: downloads ~125 MB)"
	build_guest_root
else
	log "using cached guest root $GUEST (RXE_REFRESH=1 to rebuild)"
fi
KVER=$(cat "$GUEST/kver")
log "guest versions (kernel $KVER):"
sed 's/^/[rxe]   /' "$GUEST/versions.txt" >&2
if [ -s "$GUEST/notes.txt" ]; then
	mapfile -t notes <"$GUEST/notes.txt"
	loud "${notes[@]}"
fi
T_PREP=$(now)

# --- initramfs (rebuilt every run) ------------------------------------------------------------
mkdir -p "$WORK"
STAGE=$WORK/initramfs-root
rm -rf "$STAGE"
cp -a "$GUEST/root" "$STAGE"
chmod 755 "$STAGE"
mkdir -p "$STAGE"/{proc,sys,dev,tmp,run,root,etc,tests,bb}
cp "$BUSYBOX" "$STAGE/usr/bin/busybox"
# busybox applets live in /bb (behind /usr/bin in PATH, so iproute2's ip/rdma win); /bin/sh
# must exist for scripts and su.
for a in $($BUSYBOX --list); do ln -s ../usr/bin/busybox "$STAGE/bb/$a"; done
ln -sf busybox "$STAGE/usr/bin/sh"
printf 'root:x:0:0:root:/root:/bin/sh\nrdma:x:1000:1000:rdma:/tmp:/bin/sh\n' >"$STAGE/etc/passwd"
printf 'root:x:0:\nrdma:x:1000:\n' >"$STAGE/etc/group"
cat "$GUEST/versions.txt" "$GUEST/notes.txt" >"$STAGE/etc/rxe-versions" 2>/dev/null || true
install -m 755 "$HERE/guest-init.sh" "$STAGE/init"
names=()
for b in "${BINS[@]}"; do
	install -m 755 "$b" "$STAGE/tests/" # uid 1000 must be able to execute it
	# Without debug info (symbols kept: backtraces still name functions): the initramfs is
	# unpacked into the guest's RAM, and 30 debug binaries alone came to 830 MB.
	if command -v strip >/dev/null; then
		strip --strip-debug "$STAGE/tests/$(basename "$b")" || true
	fi
	names+=("$(basename "$b")")
done
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # single-quote for sh
{
	echo "RXE_MODE=$(sq "$MODE")"
	echo "RXE_TESTS=$(sq "${names[*]:-}")"
	echo "RXE_TEST_ARGS=$(sq "${RXE_TEST_ARGS:-}")"
	echo "RXE_BIN_ARGS=$(sq "${RXE_BIN_ARGS---test-threads=1}")"
	echo "RXE_GUEST_ENV=$(sq "${RXE_GUEST_ENV:-}")"
} >"$STAGE/etc/rxe.conf"

# Every binary's shared libraries must be in the guest: ask the guest's own dynamic loader
# (needs chroot: root, or an unprivileged user namespace).
check_libraries() {
	local runner=() f out bad=0
	if [ "$(id -u)" -eq 0 ]; then
		runner=(chroot "$STAGE")
	elif unshare -r true 2>/dev/null; then
		runner=(unshare -r chroot "$STAGE")
	else
		log "cannot chroot: skipping the shared-library check"
		return 0
	fi
	local provider=("$STAGE"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
	for f in /usr/bin/ip /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong \
		"${provider[@]#"$STAGE"}" "${names[@]/#//tests/}"; do
		[ -e "$STAGE$f" ] || die "missing in the guest: $f"
		[ "$(head -c 4 "$STAGE$f")" = $'\x7fELF' ] || continue # e.g. a script
		out=$("${runner[@]}" /lib64/ld-linux-x86-64.so.2 --list "$f" 2>&1) || true
		if grep -q -E 'not found|error while loading' <<<"$out"; then
			log "MISSING in the guest for $f:"
			grep -E 'not found|error while loading' <<<"$out" >&2
			bad=1
		fi
	done
	[ $bad -eq 0 ] || die "add the packages providing the missing libraries to USER_PKGS in $0"
}
check_libraries

INITRD=$WORK/initramfs.cpio
# Uncompressed: under TCG the guest would spend longer decompressing than reading.
(cd "$STAGE" && find . -print0 | LC_ALL=C sort -z | cpio --quiet --null -o -H newc -R 0:0) >"$INITRD"
log "initramfs: $INITRD ($(du -h "$INITRD" | cut -f1)), mode $MODE, ${#names[@]} binaries"

# --- boot ------------------------------------------------------------------------------------
SERIAL=$WORK/serial.log
# NUMA nodes, so that the pool's NUMA placement is checked against a kernel with several
# nodes: node n gets CPU n and an equal share of the memory.
numa_args=()
if [ "$NUMA" -ge 2 ] && [ "$SMP" -ge "$NUMA" ]; then
	case $MEM in
	*G) mem_mb=$((${MEM%G} * 1024)) ;;
	*M) mem_mb=${MEM%M} ;;
	*) mem_mb=$MEM ;;
	esac
	for ((n = 0; n < NUMA; n++)); do
		numa_args+=(-object "memory-backend-ram,id=m$n,size=$((mem_mb / NUMA))M"
			-numa "node,nodeid=$n,cpus=$n,memdev=m$n")
	done
	log "guest NUMA: $NUMA nodes of $((mem_mb / NUMA)) MiB"
fi
boot() {
	local logf=$1 rc=0
	local cpu=max
	[ "$ACCEL" = kvm ] && cpu=host
	timeout --kill-after=10 "$TIMEOUT" $QEMU -accel "$ACCEL" -cpu $cpu -m "$MEM" -smp "$SMP" \
		"${numa_args[@]}" -nographic -nic none -no-reboot \
		-kernel "$GUEST/vmlinuz" -initrd "$INITRD" \
		-append "console=ttyS0 panic=-1 quiet" </dev/null 2>&1 | tee "$logf" || rc=${PIPESTATUS[0]}
	return "$rc"
}
# marker_in FILE REGEX: the last match in the serial log (empty if none).
marker_in() { tr -d '\r' <"$1" | grep -a -o -E "$2" | tail -n1 || true; }

T_BOOT=$(now)
qemu_rc=0
rm -f "$WORK/serial.attempt1.log"
log "booting (accel $ACCEL, timeout ${TIMEOUT}s); serial log: $SERIAL"
boot "$SERIAL" || qemu_rc=$?
if [ -z "$(marker_in "$SERIAL" 'RXE-BOOTED')" ] && [ $qemu_rc -ne 124 ]; then
	# A rare early-boot panic was seen (~1 in 50): boot once more.
	cp "$SERIAL" "$WORK/serial.attempt1.log"
	loud "NO RXE-BOOTED MARKER (qemu rc=$qemu_rc): RETRYING THE BOOT ONCE" \
		"first attempt kept in $WORK/serial.attempt1.log"
	T_BOOT=$(now)
	qemu_rc=0
	boot "$SERIAL" || qemu_rc=$?
fi
T_END=$(now)

# --- summary ---------------------------------------------------------------------------------
up() { marker_in "$SERIAL" "$1 uptime=[0-9.]+" | sed 's/.*uptime=//'; }
booted=$(up RXE-BOOTED)
ready=$(up RXE-READY)
done_=$(up RXE-DONE)
result=$(marker_in "$SERIAL" 'RXE-RESULT: [A-Z]+' | sed 's/RXE-RESULT: //')
echo
echo "================ rxe summary ================"
echo "guest kernel $KVER; log $SERIAL"
echo "host prep (downloads, initramfs): $(elapsed "$T_START" "$T_PREP") s + $(elapsed "$T_PREP" "$T_BOOT") s"
echo "qemu wall time:                   $(elapsed "$T_BOOT" "$T_END") s (rc $qemu_rc)"
[ -z "$booted" ] || echo "guest /init started at uptime     ${booted} s"
[ -z "$ready" ] || echo "rxe set-up done at uptime         ${ready} s"
[ -z "$ready" ] || [ -z "$done_" ] || echo "run time:                         $(elapsed "$ready" "$done_") s"
fail=0
setup_failed=$(marker_in "$SERIAL" 'RXE-SETUP-FAILED: .*')
[ -z "$setup_failed" ] || echo "$setup_failed"
expected=()
for n in "${names[@]}"; do expected+=("$n" "$n@root"); done
[ $MODE = smoke ] && expected=(ibv_rc_pingpong)
for n in "${expected[@]}"; do
	end=$(marker_in "$SERIAL" "RXE-BIN-END $n rc=[0-9]+ uptime=[0-9.]+")
	begin=$(marker_in "$SERIAL" "RXE-BIN-BEGIN $n uptime=[0-9.]+")
	if [ -n "$end" ]; then
		rc=$(sed 's/.* rc=\([0-9]*\).*/\1/' <<<"$end")
		secs=$(elapsed "${begin##*=}" "${end##*=}")
		printf '  %-40s rc=%-4s %8s s\n' "$n" "$rc" "$secs"
		[ "$rc" = 0 ] || fail=1
	elif [ -n "$begin" ]; then
		printf '  %-40s DID NOT FINISH\n' "$n"
		fail=1
	else
		printf '  %-40s NOT RUN\n' "$n"
		fail=1
	fi
done
if [ $qemu_rc -eq 124 ] || [ $qemu_rc -eq 137 ]; then
	echo "RESULT: TIMEOUT after ${TIMEOUT}s"
	exit 3
fi
case $result in
PASS)
	if [ $fail -eq 0 ]; then
		echo "RESULT: PASS"
		exit 0
	fi
	echo "RESULT: FAIL (guest said PASS, but the per-binary markers disagree)"
	exit 1
	;;
FAIL)
	echo "RESULT: FAIL"
	exit 1
	;;
*)
	echo "RESULT: NO RESULT (no RXE-RESULT marker; qemu rc $qemu_rc)"
	exit 3
	;;
esac
