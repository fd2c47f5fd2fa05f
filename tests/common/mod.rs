//! Test bed shared by the integration tests: two peers on two devices, connected by RC QPs.
//!
//! `RDMA_POOL_TEST_NIC=verbs` runs on real devices (`RDMA_POOL_TEST_DEVS`, default
//! `rxe0,rxe1`: the Soft-RoCE pair of the QEMU test bed); anything else runs on two soft NICs.
#![allow(dead_code, unreachable_pub)]

use rdma_pool::nic::soft::{ReregMode, SoftConfig};
use rdma_pool::nic::*;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The small pool the pool-level tests use: 4 GiB reserved in 16 MiB chunks, ordinary pages,
/// no purge delay (purges happen when a test asks).
pub fn small_arena() -> rdma_pool::arena::ArenaConfig {
    rdma_pool::arena::ArenaConfig {
        reserve: 1 << 32,
        chunk: 1 << 24,
        hugepages: rdma_pool::arena::Hugepages::Off,
        purge_delay: None,
        ..Default::default()
    }
}

/// Completions on rxe arrive asynchronously; on the soft NIC at once.
pub const WAIT: Duration = Duration::from_secs(10);

/// Scenarios change process-wide state (RLIMIT_MEMLOCK) and share devices: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run the test `name` (its full path, e.g. `module::test`) alone in a child process of this
/// test binary with `marker` set in its environment, and assert that it passed: for a test
/// that measures or changes the whole process (resident memory, resource limits). The test
/// itself calls this when `marker` is not set, and does its work when it is.
pub fn run_alone(name: &str, marker: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(marker, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

pub fn on_verbs() -> bool {
    std::env::var("RDMA_POOL_TEST_NIC").is_ok_and(|v| v == "verbs")
}

/// The two devices of the bed.
pub fn nics() -> (Nic, Nic) {
    if on_verbs() {
        let devs = std::env::var("RDMA_POOL_TEST_DEVS").unwrap_or_else(|_| "rxe0,rxe1".into());
        let mut it = devs.split(',');
        let a = it.next().expect("RDMA_POOL_TEST_DEVS names two devices");
        let b = it.next().unwrap_or(a);
        (
            Nic::open(a).expect("open first test device"),
            Nic::open(b).expect("open second test device"),
        )
    } else {
        (Nic::soft(), Nic::soft())
    }
}

/// The NIC of a test binary's global pool (`GlobalConfig::open`): the first test device on
/// verbs, else a soft NIC.
pub fn open_pool_nic() -> Result<Nic> {
    Ok(if on_verbs() { nics().0 } else { Nic::soft() })
}

/// One side: a device, a PD, a CQ.
pub struct Side {
    pub nic: Nic,
    pub pd: Pd,
    pub cq: Cq,
}

impl Side {
    pub fn new(nic: Nic) -> Side {
        let pd = nic.alloc_pd().unwrap();
        let cq = nic.create_cq(256).unwrap();
        Side { nic, pd, cq }
    }

    pub fn qp(&self) -> Qp {
        self.qp_in(&self.pd)
    }

    /// A QP on this side's CQ in `pd` (another PD of this side's device).
    pub fn qp_in(&self, pd: &Pd) -> Qp {
        pd.create_qp(
            &self.cq,
            &self.cq,
            QpCaps {
                max_send_sge: 4,
                max_recv_sge: 4,
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// Register `buf` with `access`.
    pub fn reg(&self, buf: &mut Buffer, access: Access) -> Result<Mr> {
        reg_in(&self.pd, buf, access)
    }

    /// A fresh buffer of `len` bytes filled with `fill`, registered with `access`. Bind it as
    /// `let (buf, mr) = …`: the region is dropped before its buffer.
    pub fn reg_buf(&self, len: usize, fill: u8, access: Access) -> (Buffer, Mr) {
        let mut b = buf(len, fill);
        let mr = self.reg(&mut b, access).unwrap();
        (b, mr)
    }

    /// A buffer of `len` bytes filled with `fill`, registered `RW | MW_BIND`, and a window of
    /// type `ty` in this side's PD, not bound yet. Bind it as `let (mem, mr, mut mw) = …`.
    pub fn window_over(&self, len: usize, fill: u8, ty: MwType) -> (Buffer, Mr, Mw) {
        let (mem, mr) = self.reg_buf(len, fill, RW | Access::MW_BIND);
        let mw = self.pd.alloc_mw(ty).unwrap();
        (mem, mr, mw)
    }

    pub fn wait(&self) -> Completion {
        self.cq.wait_one(WAIT).expect("a completion")
    }

    /// An ODP region of `len` bytes over reserved, never-touched memory (nothing is pinned or
    /// faulted), registered with `access`. Bind it as `let (reserve, mr) = …`.
    pub fn reg_reserved(&self, len: usize, access: Access) -> (Reserve, Mr) {
        let reserve = Reserve::new(len);
        // SAFETY: the caller keeps `reserve` alive longer than the region.
        let mr = unsafe { self.pd.reg_mr(reserve.0, len, access) }.unwrap();
        (reserve, mr)
    }

    /// `advise_mr` the first `len` bytes of `mr`, which must succeed.
    pub fn prefetch(&self, advice: Advice, flags: AdviseFlags, mr: &Mr, len: usize) {
        self.pd
            .advise_mr(advice, flags, &[mr.sge(0, len).unwrap()])
            .unwrap();
    }

    /// The next `n` completions as `(wr_id, status)`, in the order they arrive.
    pub fn wait_n(&self, n: usize) -> Vec<(u64, WcStatus)> {
        (0..n)
            .map(|_| self.wait())
            .map(|c| (c.wr_id, c.status))
            .collect()
    }
}

/// Register `buf` with `access` in `pd` (any PD, not only a side's).
pub fn reg_in(pd: &Pd, buf: &mut Buffer, access: Access) -> Result<Mr> {
    // SAFETY: every test keeps its buffers alive longer than their regions.
    unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), access) }
}

/// Two sides and a connected QP pair: `a.qp` (requester) ↔ `b.qp` (responder).
pub struct Bed {
    pub a: Side,
    pub b: Side,
    pub qa: Qp,
    pub qb: Qp,
}

/// Connect `qa` and `qb` to each other.
pub fn link(qa: &Qp, qb: &Qp) {
    qa.connect(&qb.endpoint().unwrap()).unwrap();
    qb.connect(&qa.endpoint().unwrap()).unwrap();
}

pub fn connect(a: &Side, b: &Side) -> (Qp, Qp) {
    let (qa, qb) = (a.qp(), b.qp());
    link(&qa, &qb);
    (qa, qb)
}

/// A QP pair from `a` into a responder QP in `pd` (another PD of `b`'s device).
pub fn connect_into_pd(a: &Side, b: &Side, pd: &Pd) -> (Qp, Qp) {
    let (qa, qb) = (a.qp(), b.qp_in(pd));
    link(&qa, &qb);
    (qa, qb)
}

pub fn bed() -> Bed {
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let (qa, qb) = connect(&a, &b);
    Bed { a, b, qa, qb }
}

/// A bed on two soft NICs configured with `cfg`, whatever `RDMA_POOL_TEST_NIC` says.
pub fn soft_bed(cfg: SoftConfig) -> Bed {
    let (a, b) = (
        Side::new(Nic::soft_with(cfg.clone())),
        Side::new(Nic::soft_with(cfg)),
    );
    let (qa, qb) = connect(&a, &b);
    Bed { a, b, qa, qb }
}

pub fn default_bed() -> Bed {
    soft_bed(SoftConfig::default())
}

/// A soft bed whose NICs re-register in `mode`.
pub fn rereg_bed(mode: ReregMode) -> Bed {
    soft_bed(SoftConfig {
        rereg: mode,
        ..Default::default()
    })
}

/// Re-register `mr` with `access` only (`CHANGE_ACCESS`, no translation change).
pub fn rereg_access(mr: &mut Mr, access: Access) -> std::result::Result<(), ReregError> {
    // SAFETY: no translation change: no memory is named.
    unsafe {
        mr.rereg(
            ReregFlags::CHANGE_ACCESS,
            None,
            std::ptr::null_mut(),
            0,
            access,
        )
    }
}

/// One soft NIC configured with `cfg`, and a PD on it.
pub fn soft_pd(cfg: SoftConfig) -> (Nic, Pd) {
    let nic = Nic::soft_with(cfg);
    let pd = nic.alloc_pd().unwrap();
    (nic, pd)
}

pub const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// A scatter/gather entry.
pub fn sge(addr: u64, length: u32, lkey: Lkey) -> Sge {
    Sge { addr, length, lkey }
}

/// `mprotect` the bytes `[off, off + len)` of `buf` (page-aligned) with `prot`; returns its result.
pub fn protect(buf: &mut Buffer, off: usize, len: usize, prot: libc::c_int) -> libc::c_int {
    assert!(off + len <= buf.len());
    // SAFETY: the range lies inside the test's own mapping; a test restores it (`unprotect`)
    // before the buffer is unmapped.
    unsafe { libc::mprotect(buf.as_mut_ptr().add(off).cast(), len, prot) }
}

/// Make `[off, off + len)` of `buf` readable and writable again.
pub fn unprotect(buf: &mut Buffer, off: usize, len: usize) {
    protect(buf, off, len, libc::PROT_READ | libc::PROT_WRITE);
}

/// A page-aligned buffer filled with `fill`.
pub fn buf(len: usize, fill: u8) -> Buffer {
    let mut b = Buffer::new(len).unwrap();
    b.as_mut_slice().fill(fill);
    b
}

/// Post an RDMA WRITE of `len` bytes and return the requester's completion status.
pub fn write(bed: &Bed, src: &Mr, len: usize, raddr: u64, rkey: Rkey) -> WcStatus {
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_write(7, &[src.sge(0, len).unwrap()], raddr, rkey)
    }
    .unwrap();
    bed.a.wait().status
}

/// Post an RDMA READ of `len` bytes into `dst` and return the requester's completion status.
pub fn read(bed: &Bed, dst: &Mr, len: usize, raddr: u64, rkey: Rkey) -> WcStatus {
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe {
        bed.qa
            .post_read(8, &[dst.sge(0, len).unwrap()], raddr, rkey)
    }
    .unwrap();
    bed.a.wait().status
}

/// Anonymous memory mapped `MAP_NORESERVE`, never touched: address space only, so a range
/// larger than the machine's memory maps under the kernel's overcommit heuristic (the rxe
/// guest has 2 GiB).
pub struct Reserve(pub *mut u8, usize);

impl Reserve {
    pub fn new(len: usize) -> Reserve {
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        Reserve(p.cast(), len)
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

/// True when this process may pin memory beyond `RLIMIT_MEMLOCK` (`CAP_IPC_LOCK`, e.g. root):
/// the kernel then enforces no memlock limit, and tests assert that instead.
pub fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Pools that live for the test binary (owned requests take `'static` buffers), kept here so
/// that the leak checker of the ASan run (`scripts/memcheck.sh`) sees them reachable.
static KEPT_POOLS: Mutex<Vec<&'static rdma_pool::Pool>> = Mutex::new(Vec::new());

/// `pool`, for the rest of the test binary.
pub fn keep_pool(pool: rdma_pool::Pool) -> &'static rdma_pool::Pool {
    let pool: &'static rdma_pool::Pool = Box::leak(Box::new(pool));
    KEPT_POOLS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(pool);
    pool
}

/// `full` scaled by `RDMA_POOL_TEST_SCALE` (per cent, default 100; never below 1): the loop
/// counts of the heaviest stress tests. `scripts/test.sh` runs them at full size on the host and
/// smaller in the emulated rxe guest, where every verbs call and every page fault goes through a
/// TCG-emulated kernel (the same code, ~10-50x slower: the guest's share of the CI).
pub fn scaled(full: usize) -> usize {
    let pct = std::env::var("RDMA_POOL_TEST_SCALE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(100);
    (full.saturating_mul(pct) / 100).max(1)
}
