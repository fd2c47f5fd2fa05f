//! One pool on two devices (multi-rail): every live block has keys on both, RDMA through
//! either device moves the right bytes, a device attached late registers what is already
//! there, detaching one leaves the other's keys alone, grants name their device through the
//! peer's QP, purge and reuse keep both rails right. Runs on two soft NICs, and on
//! `rxe0`/`rxe1` in the QEMU guest (`RDMA_POOL_TEST_NIC=verbs`).

#[path = "../common/mod.rs"]
mod common;

mod degrade;
mod discard;

use allocator_api2::vec::Vec as AVec;
use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Error, Keys, RegMode};
use rdma_pool::nic::*;
use std::alloc::Layout;

/// A pool on `rail0`'s PD, `rail1`'s PD attached, and one connected QP pair per rail: the
/// pool's side (`q0` on rail 0, `q1` on rail 1) and a peer on the other device (`p0`, `p1`).
pub struct TwoRails {
    pub s0: Side,
    pub s1: Side,
    pub pool: Pool,
    pub q0: Qp,
    pub p0: Qp,
    pub q1: Qp,
    pub p1: Qp,
}

pub fn config() -> ArenaConfig {
    small_arena()
}

impl TwoRails {
    /// Both rails, the second attached at once (`attach`) or left for the test.
    pub fn new(cfg: ArenaConfig, attach: bool) -> TwoRails {
        let (n0, n1) = nics();
        TwoRails::on(n0, n1, cfg, attach)
    }

    pub fn on(n0: Nic, n1: Nic, cfg: ArenaConfig, attach: bool) -> TwoRails {
        let (s0, s1) = (Side::new(n0), Side::new(n1));
        let pool = Pool::with_config(&s0.pd, cfg).unwrap();
        if attach {
            assert_eq!(pool.attach(&s1.pd).unwrap(), 0);
        }
        let (q0, p0) = connect(&s0, &s1);
        let (q1, p1) = connect(&s1, &s0);
        TwoRails {
            s0,
            s1,
            pool,
            q0,
            p0,
            q1,
            p1,
        }
    }

    /// Rail `r`'s device, the pool's QP on it and the side whose CQ sees its completions.
    pub fn rail(&self, r: usize) -> (&Nic, &Qp, &Side) {
        match r {
            0 => (&self.s0.nic, &self.q0, &self.s0),
            _ => (&self.s1.nic, &self.q1, &self.s1),
        }
    }

    /// The side a peer of rail `r` lives on (the other device).
    pub fn peer(&self, r: usize) -> (&Qp, &Side) {
        match r {
            0 => (&self.p0, &self.s1),
            _ => (&self.p1, &self.s0),
        }
    }

    /// WRITE `block` from the pool through rail `r` into a fresh peer buffer, READ a new
    /// pattern back into `block`, and check both moved exactly the right bytes.
    pub fn round_trip(&self, r: usize, block: &mut [u8], seed: u8) {
        let (nic, qp, side) = self.rail(r);
        let (_, peer) = self.peer(r);
        let n = block.len();
        for (i, b) in block.iter_mut().enumerate() {
            *b = pattern(i, seed);
        }
        let (mut mem, mr) = peer.reg_buf(n.next_multiple_of(4096), 0, RW);
        let sge = self.pool.sge_of_on(block, nic).unwrap();
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe { qp.post_write(11, &[sge], mr.addr() as u64, mr.rkey()) }.unwrap();
        assert_eq!(side.wait().status, WcStatus::Success, "WRITE on rail {r}");
        let got = &mem.as_slice()[..n];
        assert!(
            got.iter().enumerate().all(|(i, &b)| b == pattern(i, seed)),
            "rail {r}: the peer got the wrong bytes"
        );
        for (i, b) in mem.as_mut_slice()[..n].iter_mut().enumerate() {
            *b = pattern(i, seed ^ 0x5a);
        }
        // SAFETY: the read's memory stays allocated and unread until its completion is polled.
        unsafe { qp.post_read(12, &[sge], mr.addr() as u64, mr.rkey()) }.unwrap();
        assert_eq!(side.wait().status, WcStatus::Success, "READ on rail {r}");
        assert!(
            block
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(i, seed ^ 0x5a)),
            "rail {r}: READ brought the wrong bytes"
        );
    }
}

pub fn pattern(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8
}

/// Sizes from every part of the allocator: small, medium, large, and larger than a chunk.
pub const SIZES: [usize; 6] = [64, 4096, 100_000, 1 << 20, 3 << 20, 20 << 20];

/// Keys of `p` on `nic` that cover `[p, p + len)`.
pub fn covered(pool: &Pool, p: *const u8, len: usize, nic: &Nic) -> Keys {
    let k = pool
        .keys_of_on(p, nic)
        .unwrap_or_else(|| panic!("no keys on {} for {p:?}", nic.caps().name));
    assert!(
        k.contains(p as usize, len),
        "{k:?} does not cover {len} bytes at {p:?}"
    );
    k
}

#[test]
fn every_block_has_keys_on_both_rails_and_rdma_through_either_moves_the_right_bytes() {
    let _s = serial();
    let t = TwoRails::new(config(), true);
    let mut blocks: Vec<AVec<u8, &Pool>> = SIZES
        .iter()
        .map(|&n| allocator_api2::vec![in &t.pool; 0u8; n])
        .collect();
    for b in &blocks {
        let k0 = covered(&t.pool, b.as_ptr(), b.len(), &t.s0.nic);
        let k1 = covered(&t.pool, b.as_ptr(), b.len(), &t.s1.nic);
        assert_eq!(Some(k0), t.pool.keys_of(b.as_ptr()), "keys_of is rail 0's");
        assert_eq!(Some(k0), rdma_pool::keys_of_on(b.as_ptr(), &t.s0.nic));
        assert_eq!(Some(k1), rdma_pool::keys_of_on(b.as_ptr(), &t.s1.nic));
    }
    for (i, b) in blocks.iter_mut().enumerate() {
        t.round_trip(0, b, i as u8);
        t.round_trip(1, b, 0x80 | i as u8);
    }
    let rails = t.pool.stats().rails;
    assert_eq!(rails.len(), 1);
    assert_eq!(rails[0].device, t.s1.nic.caps().name);
    assert_eq!(rails[0].unregistered_bytes, 0);
    assert_eq!(
        rails[0].registered_bytes,
        t.pool.stats().alloc.arena.registered_bytes,
        "rail 1 covers what rail 0 covers"
    );
    assert!(t.pool.validate());
}

#[test]
fn a_rail_attached_late_registers_what_is_there_and_detaching_changes_no_other_key() {
    let _s = serial();
    let t = TwoRails::new(config(), false);
    let mut before: Vec<AVec<u8, &Pool>> = SIZES
        .iter()
        .map(|&n| allocator_api2::vec![in &t.pool; 1u8; n])
        .collect();
    for b in &before {
        assert_eq!(t.pool.keys_of_on(b.as_ptr(), &t.s1.nic), None);
    }
    let keys0: Vec<Keys> = before
        .iter()
        .map(|b| covered(&t.pool, b.as_ptr(), b.len(), &t.s0.nic))
        .collect();
    t.pool.attach(&t.s1.pd).unwrap();
    assert!(matches!(
        t.pool.attach(&t.s1.pd),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        t.pool.attach(&t.s0.pd),
        Err(Error::InvalidArgument(_))
    ));
    let old1: Vec<Keys> = before
        .iter()
        .map(|b| covered(&t.pool, b.as_ptr(), b.len(), &t.s1.nic))
        .collect();
    for (i, b) in before.iter_mut().enumerate() {
        t.round_trip(1, b, i as u8);
    }
    // Memory committed after the attach too.
    let mut after = allocator_api2::vec![in &t.pool; 2u8; 5 << 20];
    covered(&t.pool, after.as_ptr(), after.len(), &t.s1.nic);
    t.round_trip(1, &mut after, 9);

    t.pool.detach(&t.s1.pd).unwrap();
    assert!(t.pool.stats().rails.is_empty());
    for (b, k0) in before.iter().zip(&keys0) {
        assert_eq!(t.pool.keys_of_on(b.as_ptr(), &t.s1.nic), None);
        assert_eq!(
            t.pool.keys_of(b.as_ptr()),
            Some(*k0),
            "rail 0's keys unchanged"
        );
    }
    // The old rail-1 key is dead: a WRITE with it fails locally (on a QP pair of its own,
    // which the error breaks).
    let (qs, _ps) = connect(&t.s1, &t.s0);
    let (_, peer) = t.peer(1);
    let (_mem, mr) = peer.reg_buf(4096, 0, RW);
    let stale = sge(before[1].as_ptr() as u64, 64, old1[1].lkey);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    if unsafe { qs.post_write(13, &[stale], mr.addr() as u64, mr.rkey()) }.is_ok() {
        assert_ne!(t.s1.wait().status, WcStatus::Success, "stale lkey");
    }
    // Rail 0 still moves bytes; attaching again gives rail 1 working keys.
    t.round_trip(0, &mut before[2], 3);
    t.pool.attach(&t.s1.pd).unwrap();
    let mut b = allocator_api2::vec![in &t.pool; 0u8; 4096];
    t.round_trip(1, &mut b, 4);
    drop(b);
    drop(before);
    drop(after);
    assert!(t.pool.validate());
}

#[test]
fn grants_name_their_device_through_the_peers_qp() {
    let _s = serial();
    let t = TwoRails::new(config(), true);
    let b0 = allocator_api2::vec![in &t.pool; 0u8; 4096];
    let b1 = allocator_api2::vec![in &t.pool; 0u8; 4096];
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g0 = unsafe {
        t.pool
            .grant_with(&b0, &t.q0, rw, rdma_pool::grant::GrantKind::Auto)
    }
    .unwrap();
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g1 = unsafe {
        t.pool
            .grant_with(&b1, &t.q1, rw, rdma_pool::grant::GrantKind::Auto)
    }
    .unwrap();
    g0.wait(&t.s0.cq, |wc| panic!("unexpected {wc:?}")).unwrap();
    g1.wait(&t.s1.cq, |wc| panic!("unexpected {wc:?}")).unwrap();
    // Each peer writes through its own rail with its own key.
    for (r, g, b, fill) in [(0, &g0, &b0, 0xA0u8), (1, &g1, &b1, 0xB1)] {
        let (pqp, peer) = t.peer(r);
        let (_m, src) = peer.reg_buf(64, fill, RW);
        let w = g.wire();
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe { pqp.post_write(1, &[src.sge(0, 64).unwrap()], w.addr, w.rkey) }.unwrap();
        assert_eq!(peer.wait().status, WcStatus::Success, "grant on rail {r}");
        assert!(b[..64].iter().all(|&x| x == fill) && b[64] == 0);
    }
    // A rail's key through the other rail's QP pair is refused, and moves nothing.
    let (pqp, peer) = t.peer(0);
    let (_m, src) = peer.reg_buf(64, 0xEE, RW);
    let w1 = g1.wire();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { pqp.post_write(2, &[src.sge(0, 64).unwrap()], w1.addr, w1.rkey) }.unwrap();
    assert_ne!(peer.wait().status, WcStatus::Success);
    assert!(b1[..64].iter().all(|&x| x == 0xB1));
    // A PD with an open grant is not detached.
    assert!(matches!(t.pool.detach(&t.s1.pd), Err(Error::Busy(_))));
    g0.revoke(&t.s0.cq, |_| {}).unwrap();
    g1.revoke(&t.s1.cq, |_| {}).unwrap();
    drop((g0, g1));
    // A QP of a PD the pool is not registered on is foreign.
    let other = Side::new(t.s1.nic.clone());
    let (qx, _px) = connect(&other, &t.s0);
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe {
            t.pool
                .grant_with(&b1, &qx, rw, rdma_pool::grant::GrantKind::Auto)
        },
        Err(rdma_pool::grant::GrantError::ForeignQp)
    ));
    t.pool.detach(&t.s1.pd).unwrap();
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe {
            t.pool
                .grant_with(&b1, &t.q1, rw, rdma_pool::grant::GrantKind::Auto)
        },
        Err(rdma_pool::grant::GrantError::ForeignQp)
    ));
    assert_eq!(t.pool.stats().grants.open, 0);
    assert!(t.pool.validate());
}

#[test]
fn purge_and_reuse_keep_both_rails_right() {
    let _s = serial();
    let t = TwoRails::new(config(), true);
    // Four slabs, less memory-checker mode's guard page (none without the feature).
    let size = (8 << 20) - rdma_pool::alloc::LARGE_GUARD;
    let layout = Layout::from_size_align(size, 4096).unwrap();
    let p = t.pool.alloc(layout);
    assert!(!p.is_null());
    covered(&t.pool, p, size, &t.s1.nic);
    let rail_before = t.pool.stats().rails[0].registered_bytes;
    // SAFETY: `p` came from this pool with `layout`.
    unsafe { t.pool.free_sized(p, layout) };
    assert_eq!(t.pool.purge(), 8 << 20);
    let rail = &t.pool.stats().rails[0];
    if rail.mode == RegMode::Pinned {
        assert_eq!(
            rail.registered_bytes,
            rail_before - (8 << 20),
            "rail 1 let go first"
        );
        assert_eq!(t.pool.keys_of_on(p, &t.s1.nic), None);
    }
    assert!(t.pool.validate());
    let q = t.pool.alloc(layout);
    assert_eq!(q, p, "the purged run is reused");
    // SAFETY: the block is ours, `layout.size()` bytes.
    let block = unsafe { std::slice::from_raw_parts_mut(q, layout.size()) };
    covered(&t.pool, q, block.len(), &t.s0.nic);
    covered(&t.pool, q, block.len(), &t.s1.nic);
    t.round_trip(0, block, 1);
    t.round_trip(1, block, 2);
    // SAFETY: as above.
    unsafe { t.pool.free_sized(q, layout) };
    assert!(t.pool.validate());
}

#[test]
fn attach_and_detach_race_allocating_threads_and_no_block_loses_its_keys() {
    let _s = serial();
    let t = TwoRails::new(config(), false);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        for k in 0..2 {
            let (pool, stop) = (&t.pool, &stop);
            sc.spawn(move || {
                let mut live: Vec<AVec<u8, &Pool>> = Vec::new();
                let mut i = 0usize;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let n = [48, 5000, 70_000, 2 << 20][i % 4];
                    live.push(allocator_api2::vec![in pool; k as u8; n]);
                    if live.len() > 64 {
                        live.swap_remove(i % 64);
                    }
                    i += 1;
                }
                live
            });
        }
        // Fewer in the rxe guest (`common::scaled`): each attach registers all that is there.
        for _ in 0..common::scaled(10).max(3) {
            t.pool.attach(&t.s1.pd).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
            t.pool.detach(&t.s1.pd).unwrap();
        }
        t.pool.attach(&t.s1.pd).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // Every block committed (live or freed) is covered on both rails.
    let mut check = allocator_api2::vec![in &t.pool; 0u8; 70_000];
    t.round_trip(1, &mut check, 7);
    let s = t.pool.stats().rails;
    // The rail covers every committed slab whole; the pool's own device registers a slab of
    // small pages a step at a time (`registered_bytes` counts the registered steps).
    let a = t.pool.stats().alloc.arena;
    assert!(s[0].registered_bytes >= a.registered_bytes, "{s:?} {a:?}");
    assert!(s[0].registered_bytes <= a.committed_bytes, "{s:?} {a:?}");
    assert!(t.pool.validate());
}
