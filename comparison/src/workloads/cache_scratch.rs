//! False sharing, as mimalloc-bench measures it with `cache-scratch` (passive) and
//! `cache-thrash` (active), `… T 1000 1 2000000 T`: each of T threads runs 1000 iterations of
//! allocating a 1-byte object and writing it `2,000,000 / T` times, then freeing it. Passive:
//! main first allocates one object per thread (adjacent, likely on one cache line) and each
//! thread starts by freeing "its" object — an allocator that hands those bytes back to the
//! threads makes them write to one line. Active: no objects from main; only the threads' own
//! objects, allocated concurrently, can share a line.

use super::{mix, scaled};

const ITERATIONS: usize = 1000;

fn worker(given: Option<Box<u8>>, reps: usize) -> u64 {
    drop(given);
    let mut count = 0u64;
    for _ in 0..ITERATIONS {
        let mut o = Box::new(0u8);
        for _ in 0..reps {
            // SAFETY: `o` is a valid, exclusively owned byte.
            unsafe {
                std::ptr::write_volatile(&mut *o, 0);
                count += u64::from(std::ptr::read_volatile(&*o)) + 1;
            }
        }
        drop(o);
    }
    count
}

fn run_with(threads: usize, scale: f64, passive: bool) -> u64 {
    let reps = scaled(2_000_000, scale) / threads.max(1);
    let mut given: Vec<Option<Box<u8>>> = (0..threads)
        .map(|_| passive.then(|| Box::new(1u8)))
        .collect();
    let handles: Vec<_> = given
        .drain(..)
        .map(|g| std::thread::spawn(move || worker(g, reps)))
        .collect();
    handles
        .into_iter()
        .fold(0, |s, h| mix(s, h.join().unwrap()))
}

/// Passive false sharing (`cache-scratch`).
pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    run_with(threads, scale, true)
}

/// Active false sharing (`cache-thrash`).
pub(crate) fn run_thrash(threads: usize, scale: f64) -> u64 {
    run_with(threads, scale, false)
}
