//! Concurrency stress, bounded in time: threads allocate, free each other's blocks, grant,
//! revoke, purge and run remote READ/WRITE through their grants all at once, every block
//! carrying a checksum pattern. Checked throughout: no block is handed out twice or overlaps
//! a live one (a shared ledger), every block's bytes are its own when it is freed, a remote
//! access through a live grant moves exactly the granted bytes, a revoked key is refused, and
//! memory freed while its grant was revoking is handed out again only once that grant's key
//! is dead. Runs for `STRESS_SECS` (default 3 s) on the soft NIC, and on `rxe0`/`rxe1` in the
//! QEMU guest (`RDMA_POOL_TEST_NIC=verbs`, where `scripts/test.sh` gives it 4 s).

#[path = "../common/mod.rs"]
mod common;

use common::*;
use crossbeam::channel::{Receiver, Sender, unbounded};
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::nic::*;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const THREADS: usize = 4;

/// A block in flight between threads: its address, length and pattern seed.
#[derive(Clone, Copy)]
struct Blk {
    p: usize,
    len: usize,
    seed: u64,
}

// SAFETY: an address and a length; the block is owned by whoever holds the `Blk`.
unsafe impl Send for Blk {}

fn pat(seed: u64, i: usize) -> u8 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i as u8).wrapping_mul(13)
}

/// Ends and a stride: checking megabytes byte by byte would measure the checker.
fn offsets(len: usize) -> impl Iterator<Item = usize> {
    (0..len.min(512))
        .chain((512..len).step_by(997))
        .chain(len.saturating_sub(512).max(512.min(len))..len)
}

fn fill(b: Blk) {
    for i in offsets(b.len) {
        // SAFETY: a live block of `len` bytes owned by the caller.
        unsafe { *(b.p as *mut u8).add(i) = pat(b.seed, i) };
    }
}

fn verify(b: Blk) {
    for i in offsets(b.len) {
        // SAFETY: as above.
        let x = unsafe { *(b.p as *const u8).add(i) };
        assert_eq!(
            x,
            pat(b.seed, i),
            "block {:#x}+{} changed at byte {i}",
            b.p,
            b.len
        );
    }
}

/// Live blocks (no overlap) and blocks parked under a revoking grant, with that grant's key.
#[derive(Default)]
struct Ledger {
    live: BTreeMap<usize, usize>,
    parked: Vec<(usize, usize, u64, Rkey)>,
}

impl Ledger {
    fn insert(&mut self, p: usize, len: usize) -> Vec<(u64, Rkey)> {
        if let Some((&q, &l)) = self.live.range(..=p).next_back() {
            assert!(
                q + l.max(1) <= p,
                "{p:#x} overlaps the live block {q:#x}+{l}"
            );
        }
        if let Some((&q, _)) = self.live.range(p + 1..).next() {
            assert!(p + len <= q, "{p:#x}+{len} overlaps the live block {q:#x}");
        }
        self.live.insert(p, len);
        // Parked memory handed out again: the keys of the grants that parked it must be dead.
        let mut keys = Vec::new();
        self.parked.retain(|&(q, l, addr, rkey)| {
            let overlap = q < p + len.max(1) && p < q + l;
            if overlap {
                keys.push((addr, rkey));
            }
            !overlap
        });
        keys
    }

    fn remove(&mut self, p: usize) {
        assert!(self.live.remove(&p).is_some(), "{p:#x} freed but not live");
    }
}

#[derive(Default)]
struct Counts {
    allocs: AtomicU64,
    remote_frees: AtomicU64,
    grants: AtomicU64,
    remote_ok: AtomicU64,
    stale_refused: AtomicU64,
    parked_reuse_checked: AtomicU64,
    purged_bytes: AtomicU64,
}

/// One thread's connection: a QP in the pool's PD and a client QP, each with its own CQ.
struct Conn {
    cq: Cq,
    qp: Qp,
    ccq: Cq,
    cqp: Qp,
    scratch: Mr,
    scratch_mem: Buffer,
}

const SCRATCH: usize = 64 << 10;

fn conn(pool: &Pool, client: &Side) -> Conn {
    let cq = pool.nic().create_cq(256).unwrap();
    let qp = pool.pd().create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let ccq = client.nic.create_cq(256).unwrap();
    let cqp = client.pd.create_qp(&ccq, &ccq, QpCaps::default()).unwrap();
    link(&qp, &cqp);
    let (scratch_mem, scratch) = client.reg_buf(SCRATCH, 0, RW);
    Conn {
        cq,
        qp,
        ccq,
        cqp,
        scratch,
        scratch_mem,
    }
}

impl Conn {
    fn access(&mut self, write: bool, addr: u64, len: usize, rkey: Rkey) -> WcStatus {
        let sge = self.scratch.sge(0, len).unwrap();
        if write {
            // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
            unsafe { self.cqp.post_write(1, &[sge], addr, rkey) }.unwrap();
        } else {
            // SAFETY: the read's memory stays allocated and unread until its completion is polled.
            unsafe { self.cqp.post_read(2, &[sge], addr, rkey) }.unwrap();
        }
        self.ccq.wait_one(WAIT).expect("a completion").status
    }
}

/// A key that must be dead: an access with it is refused (and kills the pair: connect anew;
/// the old pair is kept in `old`, whose CQ may still get the pool's completions).
fn assert_dead(
    c: &mut Conn,
    old: &mut Vec<Conn>,
    pool: &Pool,
    client: &Side,
    addr: u64,
    rkey: Rkey,
) {
    let st = c.access(true, addr, 1, rkey);
    assert_ne!(st, WcStatus::Success, "a dead key worked");
    old.push(std::mem::replace(c, conn(pool, client)));
}

#[allow(clippy::too_many_arguments)]
fn worker(
    k: usize,
    pool: &Pool,
    client: &Side,
    ledger: &Mutex<Ledger>,
    counts: &Counts,
    stop: &AtomicBool,
    tx: &Sender<Blk>,
    rx: &Receiver<Blk>,
) -> Vec<Conn> {
    let mut c = conn(pool, client);
    let mut old = Vec::new();
    let mut mine: Vec<Blk> = Vec::new();
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (k as u64) << 32;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let lock = || ledger.lock().unwrap_or_else(|e| e.into_inner());
    let free = |b: Blk, remote: bool| {
        verify(b);
        lock().remove(b.p);
        // SAFETY: a live block of the pool, no longer used.
        unsafe { pool.free(b.p as *mut u8) };
        if remote {
            counts.remote_frees.fetch_add(1, Relaxed);
        }
    };
    while !stop.load(Relaxed) {
        let r = rnd();
        match r % 16 {
            0..=5 => {
                let len = match r >> 8 & 15 {
                    0 => 100_000 + (r >> 16) as usize % 400_000,
                    1 => (1 << 20) + (r >> 16) as usize % (2 << 20),
                    _ => 1 + (r >> 16) as usize % 8192,
                };
                let p = pool.alloc(Layout::from_size_align(len, 8).unwrap());
                assert!(!p.is_null());
                assert!(
                    pool.keys_of(p)
                        .is_some_and(|kk| kk.contains(p as usize, len))
                );
                let b = Blk {
                    p: p as usize,
                    len,
                    seed: rnd(),
                };
                let dead = lock().insert(b.p, len);
                for (addr, rkey) in dead {
                    counts.parked_reuse_checked.fetch_add(1, Relaxed);
                    assert_dead(&mut c, &mut old, pool, client, addr, rkey);
                }
                fill(b);
                counts.allocs.fetch_add(1, Relaxed);
                mine.push(b);
            }
            6..=7 if !mine.is_empty() => {
                let b = mine.swap_remove(r as usize % mine.len());
                free(b, false);
            }
            8 if !mine.is_empty() => {
                // Hand a block to another thread, which frees it.
                let b = mine.swap_remove(r as usize % mine.len());
                tx.send(b).unwrap();
            }
            9..=13 if !mine.is_empty() => {
                // Grant a block, write and read it through the grant, revoke, check the key
                // is dead; or drop the grant and free the block at once (parked).
                let i = r as usize % mine.len();
                let b = mine[i];
                let len = b.len.min(SCRATCH);
                // SAFETY: a live block of ours.
                let s = unsafe { std::slice::from_raw_parts(b.p as *const u8, len) };
                let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
                // A grant freed under revocation is type 1, so that any thread's QP can check
                // its key is dead when the memory comes back (a type 2 key works through its
                // own QP only, and would be refused elsewhere anyway).
                let park = r >> 40 & 1 == 1;
                let kind = if park {
                    rdma_pool::grant::GrantKind::Type1
                } else {
                    rdma_pool::grant::GrantKind::Auto
                };
                // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
                let mut g = unsafe { pool.grant_with(s, &c.qp, rw, kind) }.unwrap();
                g.wait(&c.cq, |_| {}).unwrap();
                counts.grants.fetch_add(1, Relaxed);
                let w = g.wire();
                let byte = (r >> 24) as u8;
                c.scratch_mem.as_mut_slice()[..len].fill(byte);
                assert_eq!(c.access(true, w.addr, len, w.rkey), WcStatus::Success);
                // SAFETY: the block is ours; the peer's WRITE has completed.
                let got = unsafe { std::slice::from_raw_parts(b.p as *const u8, len) };
                assert!(got.iter().all(|&v| v == byte), "a WRITE through a grant");
                assert_eq!(c.access(false, w.addr, len, w.rkey), WcStatus::Success);
                assert!(c.scratch_mem.as_slice()[..len].iter().all(|&v| v == byte));
                counts.remote_ok.fetch_add(2, Relaxed);
                // The block's pattern again, for its checksum.
                fill(b);
                if !park {
                    g.revoke(&c.cq, |_| {}).unwrap();
                    drop(g);
                    assert_dead(&mut c, &mut old, pool, client, w.addr, w.rkey);
                    counts.stale_refused.fetch_add(1, Relaxed);
                } else {
                    // Drop the grant (its revocation starts) and free the block now: parked.
                    drop(g);
                    mine.swap_remove(i);
                    verify(b);
                    let mut l = lock();
                    l.remove(b.p);
                    l.parked.push((b.p, b.len, w.addr, w.rkey));
                    drop(l);
                    // SAFETY: a live block of the pool, given up; its grant is revoking.
                    unsafe { pool.free(b.p as *mut u8) };
                    // Let the pool see the invalidation's completion.
                    while let Some(wc) = c.cq.poll_one().unwrap() {
                        assert!(!rdma_pool::nic::is_reserved_wr_id(wc.wr_id), "{wc:?}");
                    }
                }
            }
            14 if k == 0 => {
                let n = pool.purge();
                counts.purged_bytes.fetch_add(n as u64, Relaxed);
            }
            _ => {}
        }
        // Free what other threads handed over.
        while let Ok(b) = rx.try_recv() {
            free(b, true);
        }
        if mine.len() > 48 {
            let b = mine.swap_remove(0);
            free(b, false);
        }
    }
    for b in mine {
        free(b, false);
    }
    old.push(c);
    old
}

fn secs() -> u64 {
    std::env::var("STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

#[test]
fn threads_allocating_freeing_granting_purging_and_moving_bytes_at_once() {
    let _g = serial();
    let (n0, n1) = nics();
    let pd = n0.alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 33,
            chunk: 1 << 24,
            hugepages: Hugepages::Off,
            purge_delay: Some(Duration::from_millis(5)),
            ..Default::default()
        },
    )
    .unwrap();
    let client = Side::new(n1);
    let ledger = Mutex::new(Ledger::default());
    let counts = Counts::default();
    let stop = AtomicBool::new(false);
    let chans: Vec<(Sender<Blk>, Receiver<Blk>)> = (0..THREADS).map(|_| unbounded()).collect();
    let start = Instant::now();
    let conns: Vec<Conn> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for k in 0..THREADS {
            let (pool, client, ledger, counts, stop) = (&pool, &client, &ledger, &counts, &stop);
            // Thread k sends to thread k + 1 and receives its own channel.
            let tx = chans[(k + 1) % THREADS].0.clone();
            let rx = chans[k].1.clone();
            handles.push(s.spawn(move || worker(k, pool, client, ledger, counts, stop, &tx, &rx)));
        }
        std::thread::sleep(Duration::from_secs(secs()));
        stop.store(true, Relaxed);
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    // Revocations still in flight (rxe completes them asynchronously): hand their completions
    // to the pool until every grant is dead and every parked block freed.
    let deadline = Instant::now() + WAIT;
    loop {
        for c in &conns {
            while let Some(wc) = c.cq.poll_one().unwrap() {
                assert!(!rdma_pool::nic::is_reserved_wr_id(wc.wr_id), "{wc:?}");
            }
        }
        let g = pool.stats().grants;
        if (g.open, g.quarantined_blocks) == (0, 0) || Instant::now() > deadline {
            break;
        }
        std::thread::yield_now();
    }
    // Blocks still in the channels.
    for (_, rx) in &chans {
        while let Ok(b) = rx.try_recv() {
            verify(b);
            ledger.lock().unwrap().remove(b.p);
            // SAFETY: a live block of the pool.
            unsafe { pool.free(b.p as *mut u8) };
        }
    }
    let elapsed = start.elapsed();
    assert!(ledger.lock().unwrap().live.is_empty());
    assert_eq!(pool.live_blocks(), 0);
    let g = pool.stats().grants;
    assert_eq!((g.open, g.quarantined_blocks), (0, 0), "{g:?}");
    assert!(pool.validate());
    let n = |a: &AtomicU64| a.load(Relaxed);
    eprintln!(
        "stress: {:.1} s, {THREADS} threads: {} allocations, {} cross-thread frees, {} grants, \
         {} remote accesses, {} revoked keys refused, {} reuses of parked memory checked, \
         {} MiB purged",
        elapsed.as_secs_f64(),
        n(&counts.allocs),
        n(&counts.remote_frees),
        n(&counts.grants),
        n(&counts.remote_ok),
        n(&counts.stale_refused),
        n(&counts.parked_reuse_checked),
        n(&counts.purged_bytes) >> 20
    );
    assert!(n(&counts.allocs) > 0 && n(&counts.grants) > 0 && n(&counts.remote_frees) > 0);
}
