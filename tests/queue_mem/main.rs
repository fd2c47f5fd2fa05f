//! DEVX queue memory (`rdma_pool::queue_mem`): carves from a few UMEMs that no region covers,
//! aligned, returned and reused, new UMEMs when one is full, page-size bitmaps from the slabs,
//! typed errors, several threads at once. On the soft NIC; in the rxe guest (no DEVX: rxe is
//! not an mlx5 device) every request is `Unsupported`.

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages, SLAB};
use rdma_pool::nic::quirks::{Quirk, applies};
use rdma_pool::nic::soft::SoftConfig;
use rdma_pool::nic::*;
use rdma_pool::queue_mem::{QueueBuf, QueueMemError, UMEM_BYTES};

fn pool_on(nic: &Nic, hugepages: Hugepages) -> Pool {
    let pd = nic.alloc_pd().unwrap();
    let cfg = ArenaConfig {
        reserve: 1 << 32,
        chunk: 1 << 26,
        hugepages,
        ..Default::default()
    };
    Pool::with_config(&pd, cfg).unwrap()
}

/// The device queue memory runs on: the first test device on verbs, else a soft NIC.
fn nic() -> Nic {
    nics().0
}

#[test]
fn carves_are_aligned_inside_one_umem_no_region_covers_and_come_back() {
    let _s = serial();
    let nic = nic();
    let pool = pool_on(&nic, Hugepages::Off);
    if on_verbs() {
        // The DEVX entry points come from `libmlx5.so.1` by dlopen; rdma-core ships it.
        assert_eq!(rdma_pool::nic::mlx5_load_error(), None);
    }
    if applies(nic.caps(), Quirk::NoDevx) || !nic.caps().devx {
        assert!(matches!(
            pool.queue_memory(64, 64),
            Err(QueueMemError::Unsupported)
        ));
        assert_eq!(pool.stats().queue.umems, 0);
        return;
    }
    let db = pool.queue_memory(8, 64).unwrap();
    let sq = pool.queue_memory(64 << 10, 4096).unwrap();
    let cq = pool.queue_memory(10_000, 4096).unwrap();
    assert_eq!(db.len(), 64, "rounded up to a doorbell record");
    assert_eq!((db.umem_id(), sq.umem_id()), (cq.umem_id(), cq.umem_id()));
    assert_eq!(db.offset() % 64, 0);
    assert!(sq.offset() % 4096 == 0 && cq.offset() % 4096 == 0);
    let base = sq.as_ptr() as usize - sq.offset() as usize;
    assert_eq!(
        cq.as_ptr() as usize - cq.offset() as usize,
        base,
        "one UMEM, one base"
    );
    assert_eq!(base % sq.page_size(), 0);
    assert_eq!(sq.page_size(), 4096, "4 KiB pages allow 4 KiB only");
    // No region covers queue memory (a UMEM over a pinned region would pin it twice).
    assert!(pool.keys_of(sq.as_ptr()).is_none() && pool.keys_of(db.as_ptr()).is_none());
    // SAFETY: the carve is ours, `len` bytes.
    unsafe { std::ptr::write_bytes(sq.as_ptr(), 0xAB, sq.len()) };
    let s = pool.stats().queue;
    assert_eq!((s.umems, s.carves), (1, 3), "{s:?}");
    assert_eq!(s.carved_bytes as usize, 64 + (64 << 10) + 10_048);
    let (off, umem) = (sq.offset(), sq.umem_id());
    drop(sq);
    let again = pool.queue_memory(64 << 10, 4096).unwrap();
    assert_eq!(
        (again.offset(), again.umem_id()),
        (off, umem),
        "the freed carve is reused"
    );
    drop((db, cq, again));
    let s = pool.stats().queue;
    assert_eq!(
        (s.umems, s.carves, s.carved_bytes),
        (1, 0, 0),
        "the last UMEM is kept"
    );
    assert!(pool.validate());
    assert_eq!(pool.stats().alloc.arena.queue_bytes as usize, UMEM_BYTES);
}

#[test]
fn a_full_umem_gets_a_neighbour_and_empty_ones_are_deregistered() {
    let _s = serial();
    let nic = nic();
    if !nic.caps().devx {
        return; // covered by the first test
    }
    let pool = pool_on(&nic, Hugepages::Off);
    let half = UMEM_BYTES / 2;
    let bufs: Vec<QueueBuf<'_>> = (0..3)
        .map(|_| pool.queue_memory(half, 4096).unwrap())
        .collect();
    assert_ne!(bufs[0].umem_id(), bufs[2].umem_id());
    assert_eq!(bufs[0].umem_id(), bufs[1].umem_id());
    // Larger than a UMEM: one of its own.
    let big = pool.queue_memory(UMEM_BYTES + 1, 4096).unwrap();
    assert!(big.len() > UMEM_BYTES);
    let s = pool.stats().queue;
    assert_eq!(s.umems, 3, "{s:?}");
    drop(bufs);
    drop(big);
    let s = pool.stats().queue;
    assert_eq!((s.umems, s.carves), (1, 0), "{s:?}");
    assert!(
        s.spare_bytes > 0,
        "deregistered UMEMs leave their slabs for the next"
    );
    // Spare slabs host the next UMEMs: no new slabs are committed.
    let committed = pool.stats().alloc.arena.queue_bytes;
    let b: Vec<_> = (0..3)
        .map(|_| pool.queue_memory(half, 4096).unwrap())
        .collect();
    assert_eq!(pool.stats().alloc.arena.queue_bytes, committed);
    drop(b);
    assert!(pool.validate());
}

#[test]
fn page_sizes_follow_the_slabs_and_a_bitmap_the_memory_cannot_back_is_a_typed_error() {
    let _s = serial();
    let nic = nic();
    if !nic.caps().devx {
        return;
    }
    let small = pool_on(&nic, Hugepages::Off);
    let e = small
        .queue_memory_with(4096, 4096, Some(SLAB as u64))
        .unwrap_err();
    assert!(
        matches!(e, QueueMemError::PageSize { bitmap } if bitmap == SLAB as u64),
        "{e}"
    );
    assert_eq!(small.stats().queue.umems, 0, "nothing kept");
    // The slabs of the refused UMEM serve the next one.
    let b = small.queue_memory(4096, 4096).unwrap();
    assert_eq!(small.stats().alloc.arena.queue_bytes as usize, UMEM_BYTES);
    drop(b);
    // Hugetlb slabs (where the machine has hugetlb pages) allow 2 MiB pages.
    let huge = pool_on(&nic, Hugepages::Prefer);
    let b = huge.queue_memory(1 << 20, 4096).unwrap();
    if huge.stats().alloc.arena.slabs_hugetlb > 0 {
        assert_eq!(b.page_size(), SLAB);
        assert_eq!(huge.stats().queue.umems_2m, 1);
    } else {
        assert_eq!(b.page_size(), 4096);
    }
    // Bad arguments.
    assert!(matches!(
        huge.queue_memory(0, 64),
        Err(QueueMemError::InvalidArgument(_))
    ));
    assert!(matches!(
        huge.queue_memory(64, 48),
        Err(QueueMemError::InvalidArgument(_))
    ));
    assert!(matches!(
        huge.queue_memory(64, 4 << 20),
        Err(QueueMemError::InvalidArgument(_))
    ));
}

#[test]
fn a_device_without_devx_says_unsupported() {
    let _s = serial();
    let nic = Nic::soft_with(SoftConfig {
        devx: false,
        ..Default::default()
    });
    let pool = pool_on(&nic, Hugepages::Off);
    assert!(matches!(
        pool.queue_memory(64, 64),
        Err(QueueMemError::Unsupported)
    ));
    assert_eq!(pool.stats().alloc.arena.queue_bytes, 0, "nothing committed");
}

#[test]
fn threads_carve_disjoint_memory() {
    let _s = serial();
    let nic = nic();
    if !nic.caps().devx {
        return;
    }
    let pool = pool_on(&nic, Hugepages::Off);
    let ranges = std::sync::Mutex::new(Vec::new());
    let all_live = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (pool, ranges, all_live) = (&pool, &ranges, &all_live);
            s.spawn(move || {
                let mut mine = Vec::new();
                for i in 0..200usize {
                    let (len, align) = if i % 3 == 0 {
                        (64, 64)
                    } else {
                        (4096 * (1 + i % 5), 4096)
                    };
                    let b = pool.queue_memory(len, align).unwrap();
                    assert_eq!(b.offset() as usize % align, 0);
                    // SAFETY: the carve is ours.
                    unsafe { std::ptr::write_bytes(b.as_ptr(), t, b.len()) };
                    mine.push(b);
                    if i % 4 == 3 {
                        drop(mine.swap_remove(i % mine.len()));
                    }
                }
                for b in &mine {
                    let at = b.as_ptr() as usize;
                    ranges.lock().unwrap().push((at, at + b.len()));
                }
                // Every thread's carves are live at once here: they must be disjoint.
                all_live.wait();
                for b in &mine {
                    // SAFETY: live carves, written by this thread only.
                    let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
                    assert!(bytes.iter().all(|&x| x == t), "a carve was shared");
                }
                all_live.wait();
                drop(mine);
            });
        }
    });
    let mut r = ranges.into_inner().unwrap();
    r.sort();
    assert!(r.windows(2).all(|w| w[0].1 <= w[1].0), "carves overlap");
    let s = pool.stats().queue;
    assert_eq!((s.carves, s.carved_bytes), (0, 0), "{s:?}");
    assert!(pool.validate());
}
