//! Many threads allocating and handing blocks to other threads that free them, with
//! checksums; every live block is registered, and posting it as the local source of an RDMA
//! WRITE lands its exact contents at a peer.

use super::*;
use std::alloc::Layout;
use std::sync::mpsc;

/// A block in flight between threads: address, length, seed of its pattern.
#[derive(Clone, Copy)]
struct Sent(usize, usize, u64);

fn checksum_ok(s: Sent) -> bool {
    // SAFETY: a live block of `s.1` bytes.
    (0..s.1).all(|i| unsafe { *(s.0 as *const u8).add(i) } == pattern(s.2, i))
}

/// `threads` producers each send `per` blocks round-robin to the consumers (the other
/// producers' threads); every consumer checks and frees what it receives. Returns the blocks
/// the main thread kept for RDMA.
fn exchange(pool: &Pool, threads: usize, per: usize) -> Vec<Sent> {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..threads).map(|_| mpsc::channel::<Sent>()).unzip();
    let (keep_tx, keep_rx) = mpsc::channel::<Sent>();
    let leftovers: Vec<mpsc::Receiver<Sent>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (t, rx) in rxs.into_iter().enumerate() {
            let txs = txs.clone();
            let keep = keep_tx.clone();
            handles.push(s.spawn(move || {
                for i in 0..per {
                    let len = [24, 64, 200, 1000, 4096, 30_000, 70_000][(i + t) % 7];
                    let p = pool.alloc(Layout::from_size_align(len, 8).unwrap());
                    assert!(!p.is_null());
                    let seed = (t * per + i) as u64;
                    for j in 0..len {
                        // SAFETY: a fresh block of `len` bytes.
                        unsafe { *p.add(j) = pattern(seed, j) };
                    }
                    let k = pool.keys_of(p).expect("a live block has keys");
                    assert!(k.contains(p as usize, len));
                    let sent = Sent(p as usize, len, seed);
                    if i % 97 == 0 {
                        keep.send(sent).unwrap();
                    } else {
                        txs[(t + 1 + i % (threads - 1)) % threads]
                            .send(sent)
                            .unwrap();
                    }
                    // Free what others sent us, as it arrives.
                    while let Ok(got) = rx.try_recv() {
                        assert!(checksum_ok(got), "a block changed in flight");
                        let layout = Layout::from_size_align(got.1, 8).unwrap();
                        // SAFETY: a live block of the pool with that layout, freed once; sized
                        // frees go through this thread's cache, then back to the owner.
                        unsafe {
                            if got.2 % 2 == 0 {
                                pool.free_sized(got.0 as *mut u8, layout)
                            } else {
                                pool.free(got.0 as *mut u8)
                            }
                        };
                    }
                }
                drop(txs);
                // Everything still addressed to us is freed by the caller.
                rx
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop((txs, keep_tx));
    drain(pool, leftovers);
    keep_rx.into_iter().collect()
}

fn drain(pool: &Pool, rxs: Vec<mpsc::Receiver<Sent>>) {
    for rx in rxs {
        for got in rx.try_iter() {
            assert!(checksum_ok(got));
            // SAFETY: as above.
            unsafe { pool.free(got.0 as *mut u8) };
        }
    }
}

#[test]
fn threads_free_each_others_blocks_and_rdma_sees_exact_bytes() {
    let _g = serial();
    let bed = bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let kept = exchange(&pool, 4, 3000);
    let (dst_mem, dst) = bed.b.reg_buf(70_000, 0, RW);
    for &s in &kept {
        let k = pool.keys_of(s.0 as *const u8).unwrap();
        let sge = sge(s.0 as u64, s.1 as u32, k.lkey);
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe { bed.qa.post_write(9, &[sge], dst.addr() as u64, dst.rkey()) }.unwrap();
        // On failure, what the soft NICs saw (a stale pinned page, a refused key).
        let seen = |n: &Nic| n.as_soft().map(|s| s.counters());
        assert_eq!(
            bed.a.wait().status,
            WcStatus::Success,
            "{:?} {:?}",
            seen(&bed.a.nic),
            seen(&bed.b.nic)
        );
        assert!(
            (0..s.1).all(|i| dst_mem.as_slice()[i] == pattern(s.2, i)),
            "the peer got other bytes than the block holds"
        );
    }
    // Default rights: a peer's READ with the pool's rkey is refused.
    let s = kept[0];
    let k = pool.keys_of(s.0 as *const u8).unwrap();
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe {
        bed.qb
            .post_read(10, &[dst.sge(0, 64).unwrap()], s.0 as u64, k.rkey)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::RemAccessErr);
    for s in kept {
        // SAFETY: blocks of the pool, freed once.
        unsafe { pool.free(s.0 as *mut u8) };
    }
    assert!(pool.validate());
    assert_eq!(pool.live_blocks(), 0, "{:?}", pool.stats().alloc.arena);
}

#[test]
fn with_remote_rights_a_peer_reads_the_same_bytes() {
    let _g = serial();
    let bed = bed();
    let pool = pool_on(&bed.a.pd, Access::REMOTE_READ);
    let kept = exchange(&pool, 3, 500);
    let (dst_mem, dst) = bed.b.reg_buf(70_000, 0, RW);
    for &s in &kept {
        let k = pool.keys_of(s.0 as *const u8).unwrap();
        // SAFETY: the read's memory stays allocated and unread until its completion is polled.
        unsafe {
            bed.qb
                .post_read(11, &[dst.sge(0, s.1).unwrap()], s.0 as u64, k.rkey)
        }
        .unwrap();
        assert_eq!(bed.b.wait().status, WcStatus::Success);
        assert!((0..s.1).all(|i| dst_mem.as_slice()[i] == pattern(s.2, i)));
        // SAFETY: a block of the pool, freed once.
        unsafe { pool.free(s.0 as *mut u8) };
    }
}

#[test]
fn steady_state_makes_no_nic_calls() {
    let _g = serial();
    let bed = default_bed();
    let soft = bed.a.nic.as_soft().unwrap();
    // The thread's own pages: a shared heap's pages emptied by the warm-up's first (young)
    // blocks go back when a purge pass collects that heap, which in the emulated guest falls
    // inside the measured churn (its steps' deregistrations: NIC calls once, not per round).
    let pool = own_pages_pool_on(&bed.a.pd, Access::empty());
    let sizes = [8usize, 64, 500, 4096, 50_000, 2 << 20];
    let churn = |rounds: usize| {
        for r in 0..rounds {
            let ps: Vec<*mut u8> = sizes
                .iter()
                .map(|&n| pool.alloc(Layout::from_size_align(n + r % 7, 8).unwrap()))
                .collect();
            for p in ps {
                // SAFETY: blocks of the pool, freed once.
                unsafe { pool.free(p) };
            }
        }
    };
    churn(100); // warm up: pages and a large run are carved and registered once
    let before = soft.counters();
    let arena_regs = pool.stats().alloc.arena.regs;
    churn(20_000);
    let after = soft.counters();
    if cfg!(feature = "memcheck") {
        // Without the thread cache (the memory checker sees every block go back to its
        // page), a class's pages retire as they empty and the heap goes back to its first
        // (smaller) pages: a slab may change page size once or twice, re-registered whole
        // or in steps. Still no NIC call per round: at most a few in 20,000.
        let calls = after.registrations - before.registrations
            + (after.deregistrations - before.deregistrations);
        assert!(calls <= 6, "{before:?} -> {after:?}");
        assert_eq!(after.reregs, before.reregs);
        return;
    }
    assert_eq!(
        after.registrations, before.registrations,
        "registrations in steady state"
    );
    assert_eq!(
        after.reregs, before.reregs,
        "re-registrations in steady state"
    );
    assert_eq!(after.deregistrations, before.deregistrations);
    assert_eq!(pool.stats().alloc.arena.regs, arena_regs);
}

#[test]
fn blocks_freed_by_another_thread_go_back_to_their_pages_and_are_reused() {
    let _g = serial();
    let (_nic, pd) = soft_pd(Default::default());
    // This thread's own pages from its first block (a young thread's first blocks come from
    // the shared heaps: round 0 would count their pages, later rounds not).
    let pool = own_pages_pool_on(&pd, Access::empty());
    let l = std::alloc::Layout::from_size_align(256, 8).unwrap();
    let c = rdma_pool::alloc::CLASSES;
    let pages_of = |pool: &Pool| -> u64 {
        pool.stats().alloc.classes[..c]
            .iter()
            .map(|k| k.pages)
            .sum()
    };
    let mut pages = 0;
    for round in 0..5 {
        // This thread allocates; another frees them, with their size: they go back to this
        // thread's pages (not into the other thread's cache) and are allocated again here.
        let blocks: Vec<usize> = (0..4000).map(|_| pool.alloc(l) as usize).collect();
        assert!(blocks.iter().all(|&p| p != 0));
        std::thread::scope(|s| {
            s.spawn(|| {
                // A thread with a heap of its own in the pool (it allocated once), so that
                // sized frees go through its cache.
                let own = pool.alloc(l);
                // SAFETY: a live block of `pool` with `l`.
                unsafe { pool.free_sized(own, l) };
                for &p in &blocks {
                    // SAFETY: live blocks of `pool` with `l`, freed once.
                    unsafe { pool.free_sized(p as *mut u8, l) };
                }
            })
            // Joined: the scope's own wait may return before the thread's exit hands its
            // heap (and the page of `own`) back; a join waits for the thread to be gone.
            .join()
            .unwrap();
        });
        assert_eq!(pool.live_blocks(), 0, "round {round}");
        assert!(pool.validate());
        // Every round reuses the first round's pages.
        if round == 0 {
            pages = pages_of(&pool);
        } else {
            assert_eq!(pages_of(&pool), pages, "round {round}");
        }
    }
}

#[test]
fn a_block_freed_by_another_thread_is_never_handed_to_that_thread() {
    // Passive false sharing (mimalloc-bench's cache-scratch): main allocates two adjacent
    // one-byte objects, a worker frees one with its size and allocates the same size. If the
    // freed block came back to the worker, two threads would write one cache line.
    let _g = serial();
    let (_nic, pd) = soft_pd(Default::default());
    // Main's own page (the shared heaps' blocks are whole lines: `shared.rs` tests them).
    let pool = own_pages_pool_on(&pd, Access::empty());
    let l = std::alloc::Layout::from_size_align(1, 1).unwrap();
    let (a, b) = (pool.alloc(l) as usize, pool.alloc(l) as usize);
    assert!(a.abs_diff(b) < 64, "adjacent blocks of one page");
    let pool = &pool;
    let got = std::thread::scope(|s| {
        s.spawn(move || {
            // The worker has a heap of its own (it allocated before).
            let warm = pool.alloc(l);
            // SAFETY: live blocks of `pool` with `l`, each freed once.
            unsafe {
                pool.free_sized(warm, l);
                pool.free_sized(a as *mut u8, l);
            }
            (0..64).map(|_| pool.alloc(l) as usize).collect::<Vec<_>>()
        })
        .join()
        .unwrap()
    });
    assert!(
        got.iter().all(|&p| p.abs_diff(b) >= 64),
        "a block next to main's came back"
    );
}
