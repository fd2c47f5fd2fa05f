//! Test bed shared by the integration tests: two peers on two devices, connected by RC QPs.
//!
//! `RDMA_POOL_TEST_NIC=verbs` runs on real devices (`RDMA_POOL_TEST_DEVS`, default
//! `rxe0,rxe1`: the Soft-RoCE pair of the QEMU test bed); anything else runs on two soft NICs.
#![allow(dead_code, unreachable_pub)]

use rdma_pool::nic::*;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Completions on rxe arrive asynchronously; on the soft NIC at once.
pub const WAIT: Duration = Duration::from_secs(10);

/// Scenarios change process-wide state (RLIMIT_MEMLOCK) and share devices: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
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
        self.pd
            .create_qp(
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
        // SAFETY: every test keeps its buffers alive longer than their regions.
        unsafe { self.pd.reg_mr(buf.as_mut_ptr(), buf.len(), access) }
    }

    pub fn wait(&self) -> Completion {
        self.cq.wait_one(WAIT).expect("a completion")
    }
}

/// Two sides and a connected QP pair: `a.qp` (requester) ↔ `b.qp` (responder).
pub struct Bed {
    pub a: Side,
    pub b: Side,
    pub qa: Qp,
    pub qb: Qp,
}

pub fn connect(a: &Side, b: &Side) -> (Qp, Qp) {
    let (qa, qb) = (a.qp(), b.qp());
    qa.connect(&qb.endpoint().unwrap()).unwrap();
    qb.connect(&qa.endpoint().unwrap()).unwrap();
    (qa, qb)
}

pub fn bed() -> Bed {
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let (qa, qb) = connect(&a, &b);
    Bed { a, b, qa, qb }
}

pub const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// A page-aligned buffer filled with `fill`.
pub fn buf(len: usize, fill: u8) -> Buffer {
    let mut b = Buffer::new(len).unwrap();
    b.as_mut_slice().fill(fill);
    b
}

/// Post an RDMA WRITE of `len` bytes and return the requester's completion status.
pub fn write(bed: &Bed, src: &Mr, len: usize, raddr: u64, rkey: Rkey) -> WcStatus {
    bed.qa
        .post_write(7, &[src.sge(0, len).unwrap()], raddr, rkey)
        .unwrap();
    bed.a.wait().status
}

/// Post an RDMA READ of `len` bytes into `dst` and return the requester's completion status.
pub fn read(bed: &Bed, dst: &Mr, len: usize, raddr: u64, rkey: Rkey) -> WcStatus {
    bed.qa
        .post_read(8, &[dst.sge(0, len).unwrap()], raddr, rkey)
        .unwrap();
    bed.a.wait().status
}
