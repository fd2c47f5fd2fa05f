//! Grants (`rdma_pool::grant`): a peer reaches exactly its own buffer, with exactly its
//! rights, until the grant is revoked; memory freed while a grant on it is revoking is not
//! reused before the key is dead; bad input is refused and nothing leaks. Runs on two soft
//! NICs, and on `rxe0`/`rxe1` in the QEMU guest (`RDMA_POOL_TEST_NIC=verbs`), where window
//! bounds are not enforced and every window gets a region of its own
//! (`Quirk::MwBoundsNotEnforced`).

#[path = "../common/mod.rs"]
mod common;

mod churn;
mod errors;
mod keys;
mod model;
mod peers;
mod quarantine;
mod regress52;
mod review52;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::grant::{Grant, GrantKind};
use rdma_pool::nic::quirks::{Quirk, applies};
use rdma_pool::nic::*;

/// The server's pool on `pd`: no remote rights of its own (peers get in through grants).
pub fn pool_on(pd: &Pd) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            ..Default::default()
        },
    )
    .unwrap()
}

/// A client's scratch buffer (registered `RW` on its side).
pub fn scratch(side: &Side, len: usize, fill: u8) -> (Buffer, Mr) {
    side.reg_buf(len, fill, RW)
}

/// A client's RDMA WRITE of `mr[off..off + len]` to `remote` with `rkey`: its status.
pub fn write(side: &Side, qp: &Qp, mr: &Mr, len: usize, remote: u64, rkey: Rkey) -> WcStatus {
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qp.post_write(1, &[mr.sge(0, len).unwrap()], remote, rkey) }.unwrap();
    side.wait().status
}

/// A client's RDMA READ of `len` bytes at `remote` into `mr`: its status.
pub fn read(side: &Side, qp: &Qp, mr: &Mr, len: usize, remote: u64, rkey: Rkey) -> WcStatus {
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { qp.post_read(2, &[mr.sge(0, len).unwrap()], remote, rkey) }.unwrap();
    side.wait().status
}

/// Wait for a grant's bind on the server's CQ; no other completion may come.
pub fn bound(g: &mut Grant<'_>, server: &Side) {
    g.wait(&server.cq, |wc| panic!("unexpected completion {wc:?}"))
        .unwrap();
}

/// Revoke, letting the application's own completions (flushes of a failed QP) pass.
pub fn revoke(g: &mut Grant<'_>, server: &Side) {
    g.revoke(&server.cq, |_| {}).unwrap();
}

/// Poll the server's CQ (which hands the pool its completions) until none of the pool's work
/// requests is in flight (rxe completes them asynchronously: an empty CQ is not yet the end),
/// or `WAIT` passed; returns how many of the pool's completions arrived. None of them comes
/// out of the poll.
pub fn drain(pool: &Pool, server: &Side) -> usize {
    let before = pool.stats().grants.wrs_in_flight;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        while let Some(wc) = server.cq.poll_one().unwrap() {
            assert!(!rdma_pool::nic::is_reserved_wr_id(wc.wr_id), "{wc:?}");
        }
        let left = pool.stats().grants.wrs_in_flight;
        if left == 0 || std::time::Instant::now() > deadline {
            return (before - left) as usize;
        }
        std::thread::yield_now();
    }
}

/// Whether windows over the pool's own region would leak its other bytes here.
pub fn bounds_broken(nic: &Nic) -> bool {
    applies(nic.caps(), Quirk::MwBoundsNotEnforced)
}

/// A remote access error, as either side of a refused access reports it.
pub fn refused(s: WcStatus) -> bool {
    matches!(
        s,
        WcStatus::RemAccessErr | WcStatus::RemInvReqErr | WcStatus::RemOpErr
    )
}

/// Everything a pool's grants held is back: no grant open, no dedicated region, no window lent.
pub fn nothing_leaked(pool: &Pool) {
    let s = pool.stats().grants;
    assert_eq!(
        (s.open, s.quarantined_blocks, s.dedicated_regions),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(pool.validate());
}

/// The kinds every device can run (windows only where the device has them).
pub fn kinds() -> [GrantKind; 3] {
    [GrantKind::Auto, GrantKind::Type1, GrantKind::Region]
}
