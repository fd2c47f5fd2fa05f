//! `medium-frag`: fragmentation in the medium range. Every thread keeps a window of 48 live
//! blocks of 64 KiB–1 MiB (each written at its first and last byte and four between, as a
//! partly filled buffer is) and replaces a random one 800,000 times, freeing the old block
//! before allocating the new one of another size; between replacements it allocates one to
//! three small blocks (16–512 bytes, filled) into a ring of 4096 that it replaces at random,
//! so long-lived small blocks sit between the medium ones. Not from mimalloc-bench: its
//! workloads stay below 64 KiB or go straight to huge sizes.

use super::{Rng, medium_size, mix, read_touched, scaled, touched};

/// Medium blocks live per thread.
const WINDOW: usize = 48;
/// Small blocks live per thread.
const SMALL: usize = 4096;

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let iters = scaled(800_000, scale);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 101);
                let mut window: Vec<_> = (0..WINDOW)
                    .map(|i| touched(medium_size(&mut rng), i as u8))
                    .collect();
                let mut small: Vec<Box<[u8]>> = Vec::with_capacity(SMALL);
                let mut sum = 0u64;
                for _ in 0..iters {
                    let slot = rng.range(0, WINDOW - 1);
                    // Free first: the new block of another size may land in the hole.
                    let old = std::mem::take(&mut window[slot]);
                    sum = sum.wrapping_add(read_touched(&old));
                    drop(old);
                    window[slot] = touched(medium_size(&mut rng), rng.next() as u8);
                    for _ in 0..rng.range(1, 3) {
                        let n = rng.range(16, 512);
                        let b = vec![n as u8; n].into_boxed_slice();
                        if small.len() < SMALL {
                            small.push(b);
                        } else {
                            let old = std::mem::replace(&mut small[rng.range(0, SMALL - 1)], b);
                            sum = sum.wrapping_add(u64::from(old[n / 2 % old.len()]));
                        }
                    }
                }
                for b in &window {
                    sum = sum.wrapping_add(read_touched(b));
                }
                mix(sum, small.iter().map(|b| b.len() as u64).sum())
            })
        })
        .collect();
    handles
        .into_iter()
        .fold(0, |s, h| mix(s, h.join().unwrap()))
}
