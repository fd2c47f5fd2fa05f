//! `keys_of` and `sge_of`: foreign pointers, registration boundaries, runs larger than a
//! chunk, and lookups racing with growth.

use super::*;
use rdma_pool::arena::Error;
use rdma_pool::nic::soft::SoftConfig;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

#[test]
fn foreign_and_uncommitted_pointers_have_no_keys() {
    let _g = serial();
    let bed = bed();
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    let run = arena.alloc_run(SLAB, SLAB).unwrap();
    let on_stack = 0u64;
    let on_heap = vec![0u8; 64];
    assert_eq!(arena.keys_of(&on_stack as *const u64 as *const u8), None);
    assert_eq!(arena.keys_of(on_heap.as_ptr()), None);
    assert_eq!(arena.keys_of(std::ptr::null()), None);
    assert_eq!(arena.keys_of(run.as_ptr().wrapping_sub(1)), None);
    // Inside the reservation but never handed out.
    let later = run.as_ptr().wrapping_add(5 * SLAB);
    assert!(arena.contains(later));
    assert_eq!(arena.keys_of(later), None);
    assert!(matches!(arena.sge_of(&on_heap), Err(Error::NotRegistered)));
    assert_eq!(arena.chunk_of(run.as_ptr()), Some(0));
    assert_eq!(arena.chunk_of(later), Some(1));
    assert_eq!(arena.chunk_of(on_heap.as_ptr()), None);
    assert!(arena.keys_of(run.as_ptr().wrapping_add(SLAB - 1)).is_some());
}

#[test]
fn a_slice_across_two_registrations_is_refused() {
    let _g = serial();
    let bed = bed();
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    let a = arena.alloc_run(SLAB, 64).unwrap();
    let ka = arena.keys_of(a.as_ptr()).unwrap(); // handed out: the next run gets its own MR
    let b = arena.alloc_run(SLAB, 64).unwrap();
    let kb = arena.keys_of(b.as_ptr()).unwrap();
    assert_eq!(
        b.as_ptr(),
        a.as_ptr().wrapping_add(SLAB),
        "runs are adjacent"
    );
    assert_ne!(ka.lkey, kb.lkey);
    // SAFETY: both runs are committed arena memory.
    let across = unsafe { std::slice::from_raw_parts(a.as_ptr().add(SLAB - 8), 16) };
    assert!(matches!(arena.sge_of(across), Err(Error::NotRegistered)));
    let inside = unsafe { std::slice::from_raw_parts(a.as_ptr().add(8), 16) };
    assert_eq!(arena.sge_of(inside).unwrap().lkey, ka.lkey);
    assert_eq!(arena.stats().fallbacks_to_new_mr, 1);
}

#[test]
fn a_run_larger_than_a_chunk_is_one_sge() {
    let _g = serial();
    let bed = bed();
    let arena = arena(&bed, 4 << 20, Hugepages::Prefer, Access::empty());
    let small = arena.alloc_run(4096, 64).unwrap();
    let len = 10 << 20;
    let run = arena.alloc_run(len, 4096).unwrap();
    assert_eq!(run.len(), 10 << 20);
    assert_eq!(
        run.as_ptr() as usize % (4 << 20),
        0,
        "dedicated runs start a chunk"
    );
    assert_ne!(arena.chunk_of(run.as_ptr()), arena.chunk_of(small.as_ptr()));
    for i in 0..len / 4096 {
        // SAFETY: committed arena memory.
        unsafe { *run.as_ptr().add(i * 4096) = (i % 251) as u8 };
    }
    // SAFETY: as above.
    let whole = unsafe { std::slice::from_raw_parts(run.as_ptr(), len) };
    let sge = arena.sge_of(whole).unwrap();
    assert_eq!(sge.length as usize, len);
    let keys = arena.keys_of(run.as_ptr().wrapping_add(len - 1)).unwrap();
    assert_eq!(keys.lkey, sge.lkey);
    let (dst_mem, dst) = bed.b.reg_buf(len, 0, RW);
    assert_eq!(
        write_out(&bed, keys, run.as_ptr() as usize, len, &dst),
        WcStatus::Success
    );
    assert_eq!(dst_mem.as_slice(), whole);
    // A small run after it still works and lies in a chunk of its own.
    let after = arena.alloc_run(4096, 64).unwrap();
    assert!(arena.keys_of(after.as_ptr()).is_some());
    assert!(arena.validate());
}

#[test]
fn runs_are_limited_by_max_mr_size_and_chunks_clamped_to_it() {
    let _g = serial();
    let bed = soft_bed(SoftConfig {
        max_mr_size: 16 << 20,
        ..Default::default()
    });
    let arena = arena(&bed, 1 << 30, Hugepages::Off, Access::empty());
    assert_eq!(arena.chunk_size(), 16 << 20);
    let e = arena.alloc_run(32 << 20, 64).unwrap_err();
    assert!(
        matches!(e, Error::TooLarge { max, .. } if max == 16 << 20),
        "{e}"
    );
    assert_eq!(
        arena.stats().committed_bytes,
        0,
        "nothing committed for a refused run"
    );
    let run = arena.alloc_run(16 << 20, 64).unwrap();
    assert_eq!(arena.keys_of(run.as_ptr()).unwrap().len, 16 << 20);
}

#[test]
fn keys_of_races_with_growth() {
    let _g = serial();
    let bed = bed();
    let arena = Arc::new(arena(&bed, 8 << 20, Hugepages::Off, Access::empty()));
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|t| {
            let (arena, runs, done) = (arena.clone(), runs.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen: HashMap<usize, Keys> = HashMap::new();
                let mut i = t;
                while !done.load(Ordering::Acquire) {
                    let snapshot: Vec<Run> = runs.lock().unwrap().clone();
                    for run in snapshot {
                        i += 1;
                        let p = run.as_ptr().wrapping_add((i * 4093) % run.len());
                        let k = arena.keys_of(p).expect("a handed-out run has keys");
                        assert!(k.contains(run.as_ptr() as usize, run.len()), "{k:?}");
                        let first = *seen.entry(run.as_ptr() as usize).or_insert(k);
                        assert_eq!(first, k, "keys changed after they were handed out");
                    }
                }
                seen
            })
        })
        .collect();
    for i in 0..20 {
        let run = arena.alloc_run(SLAB * (1 + i % 2), 64).unwrap();
        fill(run, 4096, i as u8 + 1);
        runs.lock().unwrap().push(run);
        std::thread::yield_now();
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    done.store(true, Ordering::Release);
    let (dst_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    for r in readers {
        for (addr, keys) in r.join().unwrap() {
            assert_eq!(arena.keys_of(addr as *const u8), Some(keys));
            assert_eq!(write_out(&bed, keys, addr, 4096, &dst), WcStatus::Success);
            assert_eq!(dst_mem.as_slice()[0], bytes_at(addr));
        }
    }
    assert!(arena.validate());
}

fn bytes_at(addr: usize) -> u8 {
    // SAFETY: a committed arena address.
    unsafe { *(addr as *const u8) }
}
