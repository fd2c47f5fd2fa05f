//! `threads`: thousands of short-lived threads. 2,000 threads (scaled, at least 20) are
//! spawned in waves of up to 600, all of a wave alive at once (they meet at a barrier);
//! each allocates 300 small blocks (16–256 bytes, filled) and two of 64–256 KiB, then hands
//! 8 small blocks and one large one to a shared exchange, takes and frees up to as many
//! that other threads left there, and frees the rest before it exits. Main frees what is
//! left in the exchange at the end. What it measures: per-thread allocator state created and
//! torn down, and blocks outliving the thread that allocated them. The thread count argument
//! is ignored. Not from mimalloc-bench.

use super::{Rng, mix, read_touched, scaled, touched};
use std::mem::MaybeUninit;
use std::sync::{Barrier, Mutex};

const WAVE: usize = 600;
const SMALL: usize = 300;
const HANDED: usize = 8;

/// Blocks handed between threads.
#[derive(Default)]
struct Exchange {
    small: Mutex<Vec<Box<[u8]>>>,
    large: Mutex<Vec<Box<[MaybeUninit<u8>]>>>,
}

/// What a small block contributes to the checksum, whoever frees it.
fn value(b: &[u8]) -> u64 {
    u64::from(b[0]) * b.len() as u64
}

fn worker(id: usize, barrier: &Barrier, ex: &Exchange) -> u64 {
    let mut rng = Rng::new(id as u64 + 505);
    let mut small: Vec<Box<[u8]>> = (0..SMALL)
        .map(|_| {
            let n = rng.range(16, 256);
            vec![rng.next() as u8; n].into_boxed_slice()
        })
        .collect();
    let mut large: Vec<_> = (0..2)
        .map(|_| touched(rng.range(64 << 10, 256 << 10), rng.next() as u8))
        .collect();
    barrier.wait();
    let mut sum = 0u64;
    // Hand some over, take (and free) what others handed over.
    let give: Vec<Box<[u8]>> = small.drain(..HANDED).collect();
    let taken: Vec<Box<[u8]>> = {
        let mut g = ex.small.lock().unwrap();
        let at = g.len().saturating_sub(HANDED);
        let taken = g.split_off(at);
        g.extend(give);
        taken
    };
    let taken_large = {
        let mut g = ex.large.lock().unwrap();
        let taken = g.pop();
        g.push(large.pop().expect("two large blocks"));
        taken
    };
    for b in taken.iter().chain(&small) {
        sum = sum.wrapping_add(value(b));
    }
    for b in taken_large.iter().chain(&large) {
        sum = sum.wrapping_add(read_touched(b));
    }
    sum
}

pub(crate) fn run(_threads: usize, scale: f64) -> u64 {
    let total = scaled(2000, scale).max(20);
    let ex = Exchange::default();
    let mut sum = 0u64;
    let mut started = 0;
    while started < total {
        let wave = WAVE.min(total - started);
        let barrier = Barrier::new(wave);
        sum = sum.wrapping_add(std::thread::scope(|s| {
            let handles: Vec<_> = (started..started + wave)
                .map(|id| {
                    let (barrier, ex) = (&barrier, &ex);
                    std::thread::Builder::new()
                        .spawn_scoped(s, move || worker(id, barrier, ex))
                        .expect("cannot spawn a thread")
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .fold(0u64, u64::wrapping_add)
        }));
        started += wave;
    }
    for b in ex.small.into_inner().unwrap() {
        sum = sum.wrapping_add(value(&b));
    }
    for b in ex.large.into_inner().unwrap() {
        sum = sum.wrapping_add(read_touched(&b));
    }
    mix(total as u64, sum)
}
