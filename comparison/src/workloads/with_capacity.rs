//! `with-capacity`: a huge capacity of which little is used. Eight times: a
//! `Vec::<u8>::with_capacity(3 GiB)` (scaled, at least 64 MiB) gets 4 KiB pushed, read back,
//! and is dropped. An allocator that maps lazily keeps the resident memory near zero and the
//! time near that of one `mmap`/`munmap`; one that commits, zeroes, pins or registers the
//! whole capacity up front pays for all of it. Not from mimalloc-bench.

use super::{mix, scaled};

const ROUNDS: usize = 8;
const USED: usize = 4096;

pub(crate) fn run(_threads: usize, scale: f64) -> u64 {
    let capacity = scaled(3 << 30, scale).max(64 << 20);
    let mut sum = 0u64;
    for round in 0..ROUNDS {
        let mut v = Vec::<u8>::with_capacity(capacity);
        for i in 0..USED {
            v.push((i + round) as u8);
        }
        let read: u64 = v.iter().map(|&b| u64::from(b)).sum();
        sum = mix(mix(sum, read), (v.capacity() >= capacity) as u64);
    }
    mix(sum, capacity as u64)
}
