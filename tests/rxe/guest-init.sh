#!/bin/sh
# /init of the rxe test guest (busybox ash; PID 1 in the initramfs).
#
# Built into the initramfs by tests/rxe/run.sh, together with /etc/rxe.conf, which sets:
#   RXE_MODE        "tests" or "smoke"
#   RXE_TESTS       names of the binaries in /tests, in the order to run them
#   RXE_TEST_ARGS   extra arguments for every test binary (split on blanks)
#   RXE_GUEST_ENV   extra VAR=value words for the test environment (split on blanks)
#
# Everything printed here goes to the serial console, which the host tees into serial.log and
# parses. Markers (one per line, always starting with "RXE-"):
#   RXE-BOOTED uptime=S             /init started (the host retries the boot once without it)
#   RXE-READY uptime=S              modules loaded, veth pair + rxe0/rxe1 ready
#   RXE-SETUP-FAILED: reason        setup failed (followed by RXE-RESULT: FAIL)
#   RXE-BIN-BEGIN name uptime=S     (name: the binary, then "name@root" for its run as root)
#   RXE-BIN-END name rc=N uptime=S
#   RXE-DONE uptime=S
#   RXE-RESULT: PASS | FAIL

export PATH=/usr/sbin:/usr/bin:/bb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
chmod 1777 /tmp

uptime_s() { cut -d' ' -f1 /proc/uptime; }
# Print a marker on a line of its own (the newline first ends any unterminated output line).
marker() { printf '\n%s\n' "$*"; }

marker "RXE-BOOTED uptime=$(uptime_s)"

finish() {
	marker "RXE-DONE uptime=$(uptime_s)"
	marker "RXE-RESULT: $1"
	sync
	poweroff -f
	sleep 60
}
fail_setup() {
	marker "RXE-SETUP-FAILED: $*"
	dmesg | tail -n 40
	finish FAIL
}

. /etc/rxe.conf

# The test user gets a memlock limit that fits the arena's tests (a few hundred MiB pinned),
# as a service's /etc/security/limits.conf ("rdma - memlock 1048576") would give it; the
# scenarios that need a low limit lower it themselves.
ulimit -l 1048576 || fail_setup "ulimit -l"
echo "== guest: kernel $(uname -r), $(nproc) cpus, RLIMIT_MEMLOCK $(ulimit -l) KiB"
echo "== guest package versions:"
cat /etc/rxe-versions

# --- network + Soft-RoCE setup -------------------------------------------------------------
# ib_uverbs gives /dev/infiniband/uverbsN, rdma_ucm /dev/infiniband/rdma_cm (on a normal
# system udev/rdma-core loads them).
for m in veth rdma_rxe ib_uverbs rdma_ucm; do
	modprobe "$m" || fail_setup "modprobe $m"
done

# Duplicate-address detection off BEFORE the links go up: while the IPv6 link-local address
# (the RoCEv2 GID at index 0) is "tentative", QP transitions and the first WR time out.
for c in all default; do echo 0 >/proc/sys/net/ipv6/conf/$c/accept_dad; done

ip link set lo up || fail_setup "lo up"
# /usr/bin/ip is iproute2's (busybox ip cannot create veth pairs).
/usr/bin/ip link add veth0 type veth peer name veth1 || fail_setup "veth pair"
for d in veth0 veth1; do
	echo 0 >/proc/sys/net/ipv6/conf/$d/accept_dad
	# rxe subtracts its headers from the link MTU: 9000 gives RDMA path MTU 4096.
	/usr/bin/ip link set "$d" mtu 9000 || fail_setup "mtu $d"
done
for d in veth0 veth1; do /usr/bin/ip link set "$d" up || fail_setup "up $d"; done
# IPv4 addresses for rdma_cm (tests/cm.rs, the cm examples): 10.77.0.1 on rxe0's netdev,
# 10.77.0.2 on rxe1's. The verbs tests use GID 0 (IPv6 link-local), unchanged by these.
/usr/bin/ip addr add 10.77.0.1/24 dev veth0 || fail_setup "addr veth0"
/usr/bin/ip addr add 10.77.0.2/24 dev veth1 || fail_setup "addr veth1"
/usr/bin/rdma link add rxe0 type rxe netdev veth0 || fail_setup "rdma link add rxe0"
/usr/bin/rdma link add rxe1 type rxe netdev veth1 || fail_setup "rdma link add rxe1"

# Wait (up to 30 s) for both uverbs devices, a non-zero GID 0 on both ports, and no tentative
# IPv6 address.
gid_ok() {
	g=$(cat /sys/class/infiniband/$1/ports/1/gids/0 2>/dev/null)
	[ -n "$g" ] && [ "$g" != "0000:0000:0000:0000:0000:0000:0000:0000" ]
}
i=0
while :; do
	if [ -e /dev/infiniband/uverbs0 ] && [ -e /dev/infiniband/uverbs1 ] &&
		gid_ok rxe0 && gid_ok rxe1 &&
		! /usr/bin/ip -6 addr show | grep -q tentative; then
		break
	fi
	i=$((i + 1))
	[ $i -ge 300 ] && fail_setup "rxe devices/GIDs not ready after 30 s"
	sleep 0.1
done
# The tests run as uid 1000: let them open the verbs devices whatever mode devtmpfs chose.
ls -l /dev/infiniband/
chmod 666 /dev/infiniband/*

echo "== rdma link:"
/usr/bin/rdma link
echo "== GID 0: rxe0 $(cat /sys/class/infiniband/rxe0/ports/1/gids/0)," \
	"rxe1 $(cat /sys/class/infiniband/rxe1/ports/1/gids/0)"
if [ -x /usr/bin/ibv_devinfo ]; then
	echo "== ibv_devinfo -v -d rxe0 (odp/mtu/max_mr/max_mw):"
	ibv_devinfo -v -d rxe0 | grep -i -E 'odp|mtu|max_mr|max_mw'
fi
# No automatic NUMA balancing: it migrates pages between the guest's two nodes, and the soft
# NIC (which cannot pin pages for real, as a device's long-term pin does) then sees a pinned
# region's pages replaced and refuses the access, a failure no device would have.
echo 0 >/proc/sys/kernel/numa_balancing 2>/dev/null || true
# Reserve a few 2 MiB huge pages so the hugetlb scenarios register real hugetlb memory.
echo 8 >/proc/sys/vm/nr_hugepages 2>/dev/null || true
echo "== huge pages reserved: $(cat /proc/sys/vm/nr_hugepages 2>/dev/null)"
marker "RXE-READY uptime=$(uptime_s)"

# --- run as the unprivileged user "rdma" (uid 1000), then as root ------------------------------
# Every binary runs twice: as a user under the memlock limit above, and as root, whose
# CAP_IPC_LOCK makes the kernel ignore that limit (the tests assert what the capabilities
# imply, not one of the two).
# as_user DIR PROG ARGS...: run PROG in DIR as uid/gid 1000 with the test environment.
# busybox su (run by root) asks for no password; -p keeps the environment set up by env;
# "--" stops su from taking the program's own options (-d, --test-threads) as its own.
as_user() {
	dir=$1
	shift
	env -i PATH=/usr/bin:/bb HOME=/tmp USER=rdma LOGNAME=rdma \
		RDMA_POOL_TEST_NIC=verbs RUST_BACKTRACE=1 $RXE_GUEST_ENV \
		su -p -s /bin/sh -c 'cd "$1" && shift && exec "$@"' -- rdma sh "$dir" "$@"
}
# as_root DIR PROG ARGS...: the same environment, as root.
as_root() {
	dir=$1
	shift
	(cd "$dir" && env -i PATH=/usr/bin:/bb HOME=/root USER=root LOGNAME=root \
		RDMA_POOL_TEST_NIC=verbs RUST_BACKTRACE=1 $RXE_GUEST_ENV "$@")
}

set -f # from here on RXE_TEST_ARGS / RXE_GUEST_ENV are split on blanks but never globbed
result=PASS
if [ "$RXE_MODE" = smoke ]; then
	name=ibv_rc_pingpong
	marker "RXE-BIN-BEGIN $name uptime=$(uptime_s)"
	# The pingpong exchanges QP numbers/GIDs over TCP (port 18515) on loopback, then runs RC
	# SEND traffic between rxe1 (client) and rxe0 (server) using GID index 0.
	as_user /tmp timeout 60 ibv_rc_pingpong -d rxe0 -g 0 &
	server=$!
	i=0
	until netstat -ltn 2>/dev/null | grep -q ':18515 '; do
		i=$((i + 1))
		[ $i -ge 100 ] && break
		sleep 0.1
	done
	as_user /tmp timeout 60 ibv_rc_pingpong -d rxe1 -g 0 127.0.0.1
	client_rc=$?
	wait $server
	server_rc=$?
	rc=0
	[ $client_rc -eq 0 ] && [ $server_rc -eq 0 ] || rc=1
	echo "== client rc=$client_rc server rc=$server_rc"
	marker "RXE-BIN-END $name rc=$rc uptime=$(uptime_s)"
	[ $rc -eq 0 ] || result=FAIL
else
	for name in $RXE_TESTS; do
		dir=/tmp/run/$name
		mkdir -p "$dir"
		chown 1000:1000 "$dir"
		marker "RXE-BIN-BEGIN $name uptime=$(uptime_s)"
		as_user "$dir" "/tests/$name" $RXE_BIN_ARGS $RXE_TEST_ARGS
		rc=$?
		marker "RXE-BIN-END $name rc=$rc uptime=$(uptime_s)"
		[ $rc -eq 0 ] || result=FAIL
		dir=/tmp/run/$name@root
		mkdir -p "$dir"
		marker "RXE-BIN-BEGIN $name@root uptime=$(uptime_s)"
		as_root "$dir" "/tests/$name" $RXE_BIN_ARGS $RXE_TEST_ARGS
		rc=$?
		marker "RXE-BIN-END $name@root rc=$rc uptime=$(uptime_s)"
		[ $rc -eq 0 ] || result=FAIL
	done
fi
finish $result
