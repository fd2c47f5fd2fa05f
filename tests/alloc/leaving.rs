//! What a thread leaving its heap gives back in an ODP pool: the memory of its empty pages of
//! medium blocks (64 KiB and more) and the insides of its free medium blocks on pages that
//! stay in use, so that the next thread faults in what it touches, not what every earlier
//! occupant of those blocks touched; blocks still live elsewhere keep their contents. (Pages
//! that empty while the thread lives go back to the pool as they are: giving back memory at
//! every free of a medium block costs ~20 µs a block.)

use super::footprint::resident_pages;
use super::*;
use rdma_pool::arena::Registration;
use std::alloc::Layout;

#[test]
fn a_leaving_threads_empty_medium_pages_and_free_medium_blocks_go_back_and_live_ones_stay() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = odp_pool(&pd);
    let before = pool.stats().alloc.discarded_bytes;
    let fill = |p: *mut u8, size: usize, v: u8| {
        // SAFETY: a block of at least `size` bytes just allocated.
        unsafe { p.write_bytes(v, size) };
    };
    // A thread fills blocks whole and leaves: of 256 and 600 KiB one block each, freed (its
    // page, the class's current one, empty); of 64 and 100 KiB three: the first on a page of
    // its own (freed: that page goes back to the pool at once), the next two on the class's
    // next page, one freed and one left to us (the page stays in use).
    let (swept, kept) = std::thread::scope(|s| {
        s.spawn(|| {
            let (mut swept, mut kept) = (Vec::new(), Vec::new());
            for (k, &size) in [256usize << 10, 600 << 10].iter().enumerate() {
                let l = Layout::from_size_align(size, 8).unwrap();
                let p = pool.alloc(l);
                assert!(!p.is_null());
                fill(p, size, 0x40 + k as u8);
                // SAFETY: a block of `pool` with `l`, freed once.
                unsafe { pool.free_sized(p, l) };
                swept.push((p as usize, size));
            }
            for (k, &size) in [64usize << 10, 100 << 10].iter().enumerate() {
                let l = Layout::from_size_align(size, 8).unwrap();
                let blocks: Vec<*mut u8> = (0..3).map(|_| pool.alloc(l)).collect();
                assert!(blocks.iter().all(|p| !p.is_null()));
                blocks.iter().for_each(|&p| fill(p, size, 0x50 + k as u8));
                // SAFETY: blocks of `pool` with `l`, freed once.
                unsafe { pool.free_sized(blocks[0], l) };
                unsafe { pool.free_sized(blocks[1], l) };
                swept.push((blocks[1] as usize, size));
                kept.push((blocks[2] as usize, size, 0x50 + k as u8));
            }
            (swept, kept)
        })
        .join()
        .unwrap()
    });
    // The thread has left: those blocks are back but their first page (a free block's link);
    // the memory checker's builds keep freed blocks as they are (their fill is what it checks).
    let mut inside = 0;
    for &(b, size) in &swept {
        let (from, to) = ((b + 1).next_multiple_of(4096), (b + size) & !4095);
        let resident = resident_pages(from, to - from);
        if cfg!(feature = "memcheck") {
            assert_eq!(
                resident,
                (to - from) / 4096,
                "the memory checker keeps freed blocks"
            );
        } else {
            assert_eq!(
                resident, 0,
                "a freed block of {size} B at {b:#x} stayed resident"
            );
        }
        inside += to - from;
    }
    let given = pool.stats().alloc.discarded_bytes - before;
    if cfg!(feature = "memcheck") {
        assert_eq!(given, 0);
    } else {
        assert!(
            given >= inside as u64,
            "{given} B counted, {inside} B given back"
        );
    }
    // The blocks still live are whole and resident.
    for &(b, size, fill) in &kept {
        // SAFETY: a live block of `size` bytes, filled with `fill` by its allocator.
        let bytes = unsafe { std::slice::from_raw_parts(b as *const u8, size) };
        assert!(
            bytes.iter().all(|&x| x == fill),
            "a live block of {size} B changed"
        );
        assert_eq!(resident_pages(b & !4095, size), size.div_ceil(4096));
        let l = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: a block of `pool` with `l`, freed once (here, by another thread).
        unsafe { pool.free_sized(b as *mut u8, l) };
    }
    // A block of a swept page reads zero beyond its first page when handed out again.
    let l = Layout::from_size_align(600 << 10, 8).unwrap();
    let p = pool.alloc_zeroed(l);
    assert!(!p.is_null());
    // SAFETY: a zeroed block of `l.size()` bytes.
    assert!(
        unsafe { std::slice::from_raw_parts(p, l.size()) }
            .iter()
            .all(|&x| x == 0)
    );
    // SAFETY: as above.
    unsafe { pool.free_sized(p, l) };
    assert!(pool.validate());
}

/// Threads that claim the heap again sweep it again: the free blocks given back once are not
/// walked and given back again at every claim (a heap holding thousands of free medium blocks
/// made every later thread start and exit walk them all).
#[test]
fn a_heap_claimed_again_does_not_give_back_the_same_blocks_again() {
    if cfg!(feature = "memcheck") {
        return; // nothing is given back there (see above)
    }
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = odp_pool(&pd);
    let l = Layout::from_size_align(64 << 10, 8).unwrap();
    // The first blocks on pages of their own (given back to the pool as they empty), the last
    // ones on a page of several, which the last keeps in use: the others stay free on it when
    // the thread leaves, and its sweep gives their insides back.
    let kept = std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<*mut u8> = (0..6).map(|_| pool.alloc(l)).collect();
            assert!(blocks.iter().all(|p| !p.is_null()));
            for &p in &blocks[..5] {
                // SAFETY: a block of 64 KiB, allocated with `l`, filled and freed once.
                unsafe {
                    p.write_bytes(0x33, l.size());
                    pool.free_sized(p, l);
                }
            }
            blocks[5] as usize
        })
        .join()
        .unwrap()
    });
    let once = pool.stats().alloc.discarded_bytes;
    assert!(once >= 60 << 10, "{once} B given back");
    // Threads that come and go claim the heap (the first free one) and sweep it.
    let tiny = Layout::from_size_align(8, 8).unwrap();
    for _ in 0..5 {
        std::thread::scope(|s| {
            s.spawn(|| {
                let p = pool.alloc(tiny);
                assert!(!p.is_null());
                // SAFETY: just allocated with `tiny`.
                unsafe { pool.free_sized(p, tiny) };
            });
        });
    }
    assert_eq!(
        pool.stats().alloc.discarded_bytes,
        once,
        "the same blocks given back again"
    );
    // SAFETY: a block of `pool` with `l`, freed once.
    unsafe { pool.free_sized(kept as *mut u8, l) };
    assert!(pool.validate());
}

/// A heap with more free medium blocks than one sweep gives back (256 calls) gives them back
/// over its next sweeps — each block once: what is still resident and what was counted as
/// given back add up to the freed blocks' insides after every sweep.
#[test]
fn a_heap_of_many_free_medium_blocks_gives_them_back_over_sweeps_each_once() {
    if cfg!(feature = "memcheck") {
        return; // nothing is given back there
    }
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = odp_pool(&pd);
    let l = Layout::from_size_align(64 << 10, 8).unwrap();
    let base = pool.stats().alloc.discarded_bytes;
    // 600 blocks, every 8th kept live (so their pages stay with the heap), the rest freed.
    let (freed, kept) = std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<usize> = (0..600).map(|_| pool.alloc(l) as usize).collect();
            assert!(blocks.iter().all(|&p| p != 0));
            let (mut freed, mut kept) = (Vec::new(), Vec::new());
            for (i, &p) in blocks.iter().enumerate() {
                // SAFETY: a block of 64 KiB just allocated with `l`.
                unsafe { (p as *mut u8).write_bytes(i as u8, l.size()) };
                if i % 8 == 7 {
                    kept.push((p, i as u8));
                } else {
                    // SAFETY: freed once.
                    unsafe { pool.free_sized(p as *mut u8, l) };
                    freed.push(p);
                }
            }
            (freed, kept)
        })
        .join()
        .unwrap()
    });
    let inside = |b: usize| ((b + 1).next_multiple_of(4096), (b + l.size()) & !4095);
    let total: usize = freed.iter().map(|&b| inside(b).1 - inside(b).0).sum();
    let resident = || -> usize {
        freed
            .iter()
            .map(|&b| inside(b))
            .map(|(from, to)| resident_pages(from, to - from) * 4096)
            .sum()
    };
    let tiny = Layout::from_size_align(8, 8).unwrap();
    let mut history = Vec::new();
    for _ in 0..8 {
        let given = (pool.stats().alloc.discarded_bytes - base) as usize;
        let left = resident();
        history.push((given >> 10, left >> 10));
        assert!(
            left + given <= total,
            "{given} B counted and {left} B resident of {total} B freed: counted twice ({history:?})"
        );
        // The next sweep: a thread claims the heap, and leaves it.
        std::thread::scope(|s| {
            s.spawn(|| {
                let p = pool.alloc(tiny);
                // SAFETY: just allocated with `tiny`.
                unsafe { pool.free_sized(p, tiny) };
            });
        });
    }
    assert!(
        resident() < total / 10,
        "still resident after 8 sweeps: {history:?}"
    );
    for (p, v) in kept {
        // SAFETY: a live block of 64 KiB filled with `v`.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, l.size()) };
        assert!(bytes.iter().all(|&x| x == v), "a live block changed");
        // SAFETY: freed once.
        unsafe { pool.free_sized(p as *mut u8, l) };
    }
    assert!(pool.validate());
}

/// An ODP pool (memory faults in where touched) that purges only on request.
fn odp_pool(pd: &Pd) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 28,
            hugepages: Hugepages::Transparent,
            registration: Registration::Odp,
            purge_delay: None,
            // A thread's own pages are what these tests look at.
            shared_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap()
}
