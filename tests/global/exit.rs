//! Thread exit: heaps are handed back (by a pthread key destructor), allocation and free keep
//! working inside other thread-locals' destructors, and blocks outlive their thread.

use crate::{A, assert_healthy};
use std::cell::RefCell;

struct AllocatesOnDrop(RefCell<Vec<u8>>);

impl Drop for AllocatesOnDrop {
    fn drop(&mut self) {
        // Free a pool block, allocate fresh ones and check them, during TLS destruction.
        let old = self.0.take();
        assert!(rdma_pool::keys_of(old.as_ptr()).is_some());
        drop(old);
        let fresh = vec![9u8; 10_000];
        let k = rdma_pool::keys_of(fresh.as_ptr()).expect("allocation works in TLS destructors");
        assert!(k.contains(fresh.as_ptr() as usize, fresh.len()));
        let s = format!("{:?}", k);
        assert!(!s.is_empty());
    }
}

thread_local! {
    static LATE: AllocatesOnDrop = const { AllocatesOnDrop(RefCell::new(Vec::new())) };
}

#[test]
fn thread_local_destructors_allocate_and_free_through_the_pool() {
    let survivors: Vec<Vec<u8>> = (0..32)
        .map(|i| {
            std::thread::spawn(move || {
                LATE.with(|l| *l.0.borrow_mut() = vec![i as u8; 5000]);
                vec![i as u8; 1000 + i * 100]
            })
            .join()
            .unwrap()
        })
        .collect();
    // Blocks of exited threads stay valid and registered.
    for (i, v) in survivors.iter().enumerate() {
        assert!(v.iter().all(|&b| b == i as u8));
        assert!(rdma_pool::keys_of(v.as_ptr()).is_some());
    }
    assert_healthy();
}

#[test]
fn heaps_of_exited_threads_are_handed_back() {
    // The pool has 1024 heaps: more threads than that, in turn, only work if exiting threads
    // give theirs back; otherwise their allocations would be degraded.
    let pool = A.pool().unwrap();
    let threads = if crate::common::on_verbs() {
        1100
    } else {
        3000
    };
    for round in 0..threads {
        std::thread::spawn(move || {
            let v = vec![round as u8; 64 + round % 512];
            assert!(rdma_pool::keys_of(v.as_ptr()).is_some(), "thread {round}");
        })
        .join()
        .unwrap();
    }
    assert_eq!(pool.stats().alloc.failed_allocations, 0);
    assert_healthy();
}
