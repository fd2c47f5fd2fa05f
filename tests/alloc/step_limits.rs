//! Pinned steps at their bounds: a full step budget, a refused step registration (ODP
//! fallback, unregistered service, a typed failure), a refused step deregistration (what a
//! window bound to the step does), and a pool dropped while its clock gives steps back.

use super::steps::{BLOCK, cool, pinned_pool, step, stepped_pool, warm};
use super::*;
use rdma_pool::arena::RegistrationPolicy;
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use std::alloc::Layout;
use std::collections::BTreeSet;

const SLAB: usize = 2 << 20;

fn slab(p: *const u8) -> usize {
    p as usize / SLAB
}

/// Run `f` on a thread of its own (the harness's thread then holds nothing of the pool).
fn on_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

/// A soft NIC of 4,096 regions: a quarter for steps, 128 stepped slabs of 8 steps.
fn small_nic() -> Nic {
    Nic::soft_with(SoftConfig {
        max_mr: 4096,
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    })
}

#[test]
fn past_the_step_budget_slabs_are_registered_whole_and_the_budget_comes_back() {
    let nic = small_nic();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = pinned_pool(&pd);
    // 32 KiB blocks: 256 KiB pages (a step each), 64 blocks a slab; 131 slabs' worth.
    let l = Layout::from_size_align(32 << 10, 8).unwrap();
    on_thread(|| {
        let blocks: Vec<*mut u8> = (0..131 * 64).map(|_| pool.alloc(l)).collect();
        let mut stepped = BTreeSet::new();
        let mut whole = BTreeSet::new();
        for &p in &blocks {
            assert!(!p.is_null());
            let k = pool.keys_of(p).expect("every block is registered");
            assert!(k.contains(p as usize, l.size()), "a block in one region");
            if k.len == STEP_BYTES {
                stepped.insert(slab(p));
            } else {
                assert!(k.len >= SLAB, "a slab registered whole: {k:?}");
                whole.insert(slab(p));
            }
        }
        let arena = pool.stats().alloc.arena;
        assert_eq!(stepped.len(), 128, "the budget is used: {arena:?}");
        assert!(!whole.is_empty(), "then slabs are registered whole");
        assert!(stepped.is_disjoint(&whole));
        assert!(arena.step_regions <= 1024, "{arena:?}");
        let used: BTreeSet<usize> = blocks
            .iter()
            .filter(|&&p| stepped.contains(&slab(p)))
            .map(|&p| step(p))
            .collect();
        assert_eq!(
            arena.step_regions,
            used.len() as u64,
            "the steps in use: {arena:?}"
        );
        let c = soft.counters();
        assert!(c.registrations - c.deregistrations <= 4096 / 2, "{c:?}");
        for &p in &blocks {
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(p, l) };
        }
    });
    pool.purge();
    assert_eq!(pool.live_blocks(), 0);
    if cfg!(feature = "memcheck") {
        return; // which keeps freed memory as it is: nothing goes back
    }
    // Every step went back, and the stepped slabs with them; the slabs registered whole too
    // (one region grown over them, whose keys were handed out: purged together, it goes).
    let arena = pool.stats().alloc.arena;
    assert_eq!(arena.step_regions, 0, "{arena:?}");
    assert_eq!(soft.pinned_bytes(), 0, "{arena:?}");
    assert_eq!(arena.registered_bytes, 0, "{arena:?}");
    // The purged slabs hold no place among the stepped ones: a new slab is stepped again.
    on_thread(|| {
        let p = pool.alloc(l);
        assert_eq!(pool.keys_of(p).unwrap().len, STEP_BYTES);
        assert_eq!(soft.pinned_bytes(), STEP_BYTES as u64);
        // SAFETY: a block of `pool`, freed once.
        unsafe { pool.free_sized(p, l) };
    });
    assert!(pool.validate());
}

#[test]
fn pools_on_one_device_share_its_step_budget_and_a_dropped_pool_gives_its_share_back() {
    // 128 stepped slabs for the device, whatever the number of pools on it.
    let nic = small_nic();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let l = Layout::from_size_align(32 << 10, 8).unwrap();
    // 32 KiB blocks: 64 a slab. `n` slabs' worth in `pool`: (stepped slabs, slabs whole).
    let fill = |pool: &Pool, n: usize| {
        let blocks: Vec<*mut u8> = (0..n * 64).map(|_| pool.alloc(l)).collect();
        let (mut stepped, mut whole) = (BTreeSet::new(), BTreeSet::new());
        for &p in &blocks {
            let k = pool.keys_of(p).expect("every block is registered");
            assert!(k.contains(p as usize, l.size()));
            if k.len == STEP_BYTES {
                stepped.insert(slab(p));
            } else {
                whole.insert(slab(p));
            }
        }
        (blocks, stepped.len(), whole.len())
    };
    let a = pinned_pool(&pd);
    let b = pinned_pool(&pd);
    let stepped_b = on_thread(|| {
        let (held_a, stepped_a, _) = fill(&a, 100);
        assert!((100..=104).contains(&stepped_a), "{stepped_a}");
        assert_eq!(
            a.stats().alloc.arena.device_step_slabs,
            (stepped_a as u64, 128)
        );
        // The second pool gets what is left of the device's share, then registers whole.
        let (held_b, stepped_b, whole_b) = fill(&b, 60);
        assert_eq!(stepped_b, 128 - stepped_a, "{:?}", b.stats().alloc.arena);
        assert!(whole_b >= 60 - stepped_b);
        assert_eq!(b.stats().alloc.arena.device_step_slabs, (128, 128));
        let regions = a.stats().alloc.arena.step_regions + b.stats().alloc.arena.step_regions;
        assert!(regions <= 1024, "step regions on the device: {regions}");
        // The application keeps regions of its own.
        let c = soft.counters();
        assert!(c.registrations - c.deregistrations <= 4096 / 2, "{c:?}");
        let mut own = vec![0u8; 4096];
        // SAFETY: `own` outlives the region (dropped below).
        let mr = unsafe { pd.reg_mr(own.as_mut_ptr(), own.len(), Access::LOCAL_WRITE) };
        assert!(mr.is_ok(), "{:?}", mr.err());
        drop(mr);
        for &p in &held_a {
            // SAFETY: a block of `a`, freed once.
            unsafe { a.free_sized(p, l) };
        }
        for &p in &held_b {
            // SAFETY: a block of `b`, freed once.
            unsafe { b.free_sized(p, l) };
        }
        stepped_b
    });
    drop(a);
    // Pool `a`'s slabs (never purged: its drop took them) are stepped no more on the device.
    let device = b.stats().alloc.arena.device_step_slabs;
    assert_eq!(device, (stepped_b as u64, 128));
    if cfg!(feature = "memcheck") {
        return; // which keeps freed memory as it is: nothing goes back
    }
    b.purge();
    assert_eq!(b.stats().alloc.arena.device_step_slabs, (0, 128));
    on_thread(|| {
        let (held, stepped, _) = fill(&b, 129);
        assert_eq!(stepped, 128, "the whole share: {:?}", b.stats().alloc.arena);
        for &p in &held {
            // SAFETY: a block of `b`, freed once.
            unsafe { b.free_sized(p, l) };
        }
    });
    assert!(b.validate());
}

#[test]
fn a_refused_step_registration_falls_back_to_the_chunks_odp_region() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = stepped_pool(&pd, None, RegistrationPolicy::Required);
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    on_thread(|| {
        let w = warm(&pool);
        let before = pool.stats().alloc.arena;
        soft.fail_next(Verb::RegMr, 1, libc::ENOMEM);
        let p = pool.alloc(l);
        assert!(!p.is_null());
        let k = pool.keys_of(p).expect("the chunk's ODP region stands in");
        assert!(k.contains(p as usize, BLOCK) && k.len > STEP_BYTES, "{k:?}");
        let arena = pool.stats().alloc.arena;
        assert_eq!(arena.odp_fallbacks, before.odp_fallbacks + 1, "{arena:?}");
        assert_eq!(arena.degradations, before.degradations + 1);
        assert_eq!(arena.step_regions, before.step_regions, "no step region");
        // SAFETY: a block of `pool`, freed once.
        unsafe { pool.free_sized(p, l) };
        cool(&pool, w);
    });
    pool.purge();
    if !cfg!(feature = "memcheck") {
        assert_eq!(soft.pinned_bytes(), 0);
        assert_eq!(pool.stats().alloc.arena.step_regions, 0);
    }
    assert!(pool.validate());
}

#[test]
fn a_refused_step_registration_without_odp_serves_unregistered_then_registers_again() {
    let nic = Nic::soft_with(SoftConfig {
        odp: false,
        implicit_odp: false,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    let pool = stepped_pool(&pd, None, RegistrationPolicy::Degrade);
    let soft = nic.as_soft().unwrap();
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    on_thread(|| {
        let w = warm(&pool);
        let before = pool.stats().alloc.arena;
        soft.fail_next(Verb::RegMr, 1, libc::ENOMEM);
        let p = pool.alloc(l);
        assert!(!p.is_null(), "Degrade serves the block");
        assert_eq!(
            pool.keys_of(p),
            None,
            "unregistered: no keys to post it with"
        );
        let arena = pool.stats().alloc.arena;
        assert_eq!(arena.degradations, before.degradations + 1, "{arena:?}");
        assert_eq!(arena.odp_fallbacks, before.odp_fallbacks);
        // The step is counted unregistered, once.
        let unregistered = before.unregistered_bytes + STEP_BYTES as u64;
        assert_eq!(arena.unregistered_bytes, unregistered, "{arena:?}");
        assert_eq!(arena.unregistered_runs, before.unregistered_runs + 1);
        // A page taken later in the same step (64 KiB pages of 32 blocks, four a step; pages
        // come off the free list in any order) tries again: the step is registered, and the
        // first block with it. Pages of other steps are registered as usual.
        let mut more = Vec::new();
        let again = loop {
            let q = pool.alloc(l);
            assert!(!q.is_null());
            more.push(q);
            if step(q) == step(p) && q as usize / (64 << 10) != p as usize / (64 << 10) {
                break q;
            }
            if step(q) != step(p) {
                assert!(pool.keys_of(q).is_some_and(|k| k.len == STEP_BYTES));
            }
            assert!(
                more.len() < 1024,
                "the slab's other pages of the step were used"
            );
        };
        let k = pool
            .keys_of(again)
            .expect("registered at the next page in the step");
        assert_eq!(k.len, STEP_BYTES);
        assert_eq!(pool.keys_of(p), Some(k));
        // Registered now: counted unregistered no more.
        let arena = pool.stats().alloc.arena;
        assert_eq!(
            arena.unregistered_bytes, before.unregistered_bytes,
            "{arena:?}"
        );
        assert_eq!(arena.unregistered_runs, before.unregistered_runs + 1);
        // SAFETY: blocks of `pool`, freed once.
        unsafe {
            for &q in more.iter().chain([&p]) {
                pool.free_sized(q, l);
            }
        }
        cool(&pool, w);
    });
    pool.purge();
    if !cfg!(feature = "memcheck") {
        assert_eq!(soft.pinned_bytes(), 0);
    }
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_step_served_unregistered_is_counted_until_it_goes_back() {
    let nic = Nic::soft_with(SoftConfig {
        odp: false,
        implicit_odp: false,
        ..Default::default()
    });
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = pinned_pool(&pd);
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    let w = on_thread(|| {
        let w = warm(&pool);
        let before = pool.stats().alloc.arena;
        soft.fail_next(Verb::RegMr, 1, libc::ENOMEM);
        let p = pool.alloc(l);
        assert!(!p.is_null() && pool.keys_of(p).is_none());
        // SAFETY: `p` is a live block of `BLOCK` bytes.
        unsafe { p.write_bytes(0xa5, BLOCK) };
        let arena = pool.stats().alloc.arena;
        assert_eq!(
            arena.unregistered_bytes,
            before.unregistered_bytes + STEP_BYTES as u64,
            "{arena:?}"
        );
        // SAFETY: a block of `pool`, freed once.
        unsafe { pool.free_sized(p, l) };
        (w, before)
    });
    let (w, before) = w;
    pool.purge();
    if cfg!(feature = "memcheck") {
        return; // which keeps freed memory as it is: nothing goes back
    }
    // The step went back with its memory, and with it what was counted unregistered.
    let arena = pool.stats().alloc.arena;
    assert_eq!(
        arena.unregistered_bytes, before.unregistered_bytes,
        "{arena:?}"
    );
    on_thread(|| {
        // Served again, the step is registered anew.
        let blocks: Vec<*mut u8> = (0..32).map(|_| pool.alloc(l)).collect();
        for &p in &blocks {
            assert!(pool.keys_of(p).is_some_and(|k| k.len == STEP_BYTES));
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(p, l) };
        }
    });
    cool(&pool, w);
    pool.purge();
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn past_memlock_a_required_pool_fails_the_allocation_and_loses_nothing() {
    // Room for three steps: the warm-up blocks' (one or two) and one or two of `BLOCK`-sized
    // blocks (4 pages of 32 each).
    let nic = Nic::soft_with(SoftConfig {
        odp: false,
        implicit_odp: false,
        memlock: MemlockLimit::Bytes(3 * STEP_BYTES as u64),
        ..Default::default()
    });
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = stepped_pool(&pd, None, RegistrationPolicy::Required);
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    let per_step = STEP_BYTES / BLOCK;
    on_thread(|| {
        let w = warm(&pool);
        // Blocks until the next page needs a fourth step (pages come off the free list in any
        // order: at least the carved page's 32 blocks, at most two steps' 256).
        let mut held = Vec::new();
        loop {
            let p = pool.alloc(l);
            if p.is_null() {
                break;
            }
            assert!(
                pool.keys_of(p)
                    .is_some_and(|k| k.contains(p as usize, BLOCK))
            );
            // SAFETY: a fresh block of BLOCK bytes.
            unsafe { p.write_bytes(held.len() as u8, BLOCK) };
            held.push(p);
            assert!(held.len() <= 2 * per_step, "a fourth step was pinned");
        }
        assert!(held.len() >= 32, "{}", held.len());
        let steps: BTreeSet<usize> = held.iter().map(|&p| step(p)).collect();
        assert!(steps.is_disjoint(&w.steps()));
        assert_eq!(steps.len() + w.steps().len(), 3, "the budget is used");
        assert_eq!(soft.pinned_bytes(), 3 * STEP_BYTES as u64);
        let failed = pool.stats().alloc.failed_allocations;
        // Memlock keeps refusing the third step; Required fails every such call.
        for _ in 0..3 {
            assert!(
                pool.alloc(l).is_null(),
                "no unregistered memory under Required"
            );
        }
        let stats = pool.stats().alloc;
        assert_eq!(stats.failed_allocations, failed + 3, "{stats:?}");
        assert_eq!(stats.arena.step_regions, 3, "{:?}", stats.arena);
        assert_eq!(
            pool.live_blocks(),
            held.len() as u64 + 9,
            "and the 9 warm-up blocks"
        );
        // Nothing held changed; freeing one step's worth lets the next call through.
        for (i, &p) in held.iter().enumerate() {
            // SAFETY: the block written above.
            let b = unsafe { std::slice::from_raw_parts(p, BLOCK) };
            assert!(b.iter().all(|&x| x == i as u8));
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(p, l) };
        }
        if !cfg!(feature = "memcheck") {
            pool.purge();
            let p = pool.alloc(l);
            assert!(!p.is_null() && pool.keys_of(p).is_some());
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(p, l) };
        }
        cool(&pool, w);
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_step_whose_deregistration_is_refused_stays_registered_with_its_keys() {
    if cfg!(feature = "memcheck") {
        return; // which gives no step back while its slab is in use
    }
    // EBUSY: a window bound in the step (what mlx5 says); rxe says EINVAL.
    for errno in [libc::EBUSY, libc::EINVAL] {
        let nic = Nic::soft();
        let soft = nic.as_soft().unwrap();
        let pd = nic.alloc_pd().unwrap();
        let pool = pinned_pool(&pd);
        let l = Layout::from_size_align(BLOCK, 8).unwrap();
        on_thread(|| {
            let w = warm(&pool);
            let blocks: Vec<*mut u8> = (0..512).map(|_| pool.alloc(l)).collect();
            let steps: BTreeSet<usize> = blocks.iter().map(|&p| step(p)).collect();
            assert!(steps.len() >= 3, "blocks over several steps");
            let keys: Vec<_> = blocks.iter().map(|&p| pool.keys_of(p).unwrap()).collect();
            let keep = blocks[0];
            for &p in &blocks[1..] {
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(p, l) };
            }
            let refused = pool.stats().alloc.arena.purges_refused;
            soft.fail_next(Verb::DeregMr, 1, errno);
            pool.purge();
            let arena = pool.stats().alloc.arena;
            assert_eq!(arena.purges_refused, refused + 1, "{arena:?}");
            let warm = w.steps().len();
            assert_eq!(
                arena.step_regions,
                2 + warm as u64,
                "the kept block's, the refused one and the warm-up's"
            );
            assert_eq!(soft.pinned_bytes(), ((2 + warm) * STEP_BYTES) as u64);
            // The refused step keeps its region and keys, over memory that stays.
            let kept: Vec<usize> = (1..blocks.len())
                .filter(|&i| step(blocks[i]) != step(keep) && pool.keys_of(blocks[i]).is_some())
                .collect();
            assert!(!kept.is_empty());
            let refused_step = step(blocks[kept[0]]);
            for (i, &p) in blocks.iter().enumerate().skip(1) {
                if step(p) == refused_step {
                    assert_eq!(pool.keys_of(p), Some(keys[i]), "block {i}");
                } else if step(p) != step(keep) {
                    assert_eq!(pool.keys_of(p), None, "block {i}: its step went back");
                }
            }
            // The next pass gives it back.
            pool.purge();
            assert_eq!(pool.stats().alloc.arena.step_regions, 1 + warm as u64);
            assert_eq!(pool.keys_of(blocks[kept[0]]), None);
            assert_eq!(pool.keys_of(keep), Some(keys[0]));
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(keep, l) };
            cool(&pool, w);
        });
        pool.purge();
        assert_eq!(soft.pinned_bytes(), 0, "errno {errno}");
        assert!(pool.validate());
    }
}

#[test]
fn a_pool_dropped_while_its_clock_gives_steps_back_leaves_nothing_registered() {
    for round in 0..20u64 {
        let nic = Nic::soft();
        let soft = nic.as_soft().unwrap();
        let pd = nic.alloc_pd().unwrap();
        let delay = Some(std::time::Duration::from_millis(round % 3));
        let pool = stepped_pool(&pd, delay, RegistrationPolicy::Degrade);
        let l = Layout::from_size_align(BLOCK, 8).unwrap();
        on_thread(|| {
            let blocks: Vec<*mut u8> = (0..256).map(|_| pool.alloc(l)).collect();
            assert!(blocks.iter().all(|p| !p.is_null()));
            for &p in &blocks[1..] {
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(p, l) };
            }
            // Let the clock start on the free steps (or not: the drop races it either way).
            std::thread::sleep(std::time::Duration::from_micros(200 * (round % 5)));
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(blocks[0], l) };
        });
        drop(pool);
        assert_eq!(soft.pinned_bytes(), 0, "round {round}");
        soft.validate().unwrap();
        let c = soft.counters();
        assert_eq!(c.registrations, c.deregistrations, "round {round}: {c:?}");
    }
}

#[test]
fn a_stepped_slab_reused_whole_and_served_unregistered_is_counted_until_it_goes_back() {
    let nic = Nic::soft_with(SoftConfig {
        odp: false,
        implicit_odp: false,
        ..Default::default()
    });
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = pinned_pool(&pd);
    let l = Layout::from_size_align(32 << 10, 8).unwrap();
    let big = Layout::from_size_align(1536 << 10, 8).unwrap();
    on_thread(|| {
        // A slab of 256 KiB pages (stepped), all freed: the large block reuses it whole.
        let blocks: Vec<*mut u8> = (0..64).map(|_| pool.alloc(l)).collect();
        for &p in &blocks {
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(p, l) };
        }
        let before = pool.stats().alloc.arena;
        soft.fail_next(Verb::RegMr, 10, libc::ENOMEM);
        let b = pool.alloc(big);
        soft.fail_next(Verb::RegMr, 0, 0);
        assert!(
            !b.is_null() && pool.keys_of(b).is_none(),
            "served unregistered"
        );
        if !blocks.iter().any(|&p| slab(p) == slab(b)) {
            return; // another slab was taken: nothing of the stepped one to check
        }
        let arena = pool.stats().alloc.arena;
        assert_eq!(
            arena.unregistered_bytes,
            before.unregistered_bytes + SLAB as u64,
            "{arena:?}"
        );
        // SAFETY: `b` is a live block of `big.size()` bytes.
        unsafe { b.write_bytes(7, big.size()) };
        // SAFETY: a block of `pool`, freed once.
        unsafe { pool.free_sized(b, big) };
    });
    pool.purge();
    if cfg!(feature = "memcheck") {
        return; // which keeps freed memory as it is: nothing goes back
    }
    let arena = pool.stats().alloc.arena;
    assert_eq!(arena.unregistered_bytes, 0, "gone with the slab: {arena:?}");
    assert_eq!(arena.committed_bytes, 0, "{arena:?}");
    assert!(pool.validate());
}
