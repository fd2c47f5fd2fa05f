//! `overaligned`: blocks aligned far beyond their size. Twenty rounds (scaled, at least one)
//! of, all live at once: 1000 blocks of 64 B aligned to 128 KiB, 1000 of 64 B–4 KiB aligned
//! to 4 KiB, 500 of 64 B–64 KiB aligned to 64 KiB, 100 of 64 B–1 MiB aligned to 1 MiB and 50
//! of 2 MiB aligned to 2 MiB (counts scaled, at least one), each written at its first and
//! last byte, then freed in a shuffled order. What it measures: the cost of alignment
//! (padding, splitting, address space) through `std::alloc::alloc` with a `Layout`, as
//! DMA buffers, page-aligned I/O and huge-page-aligned regions ask for it. A misaligned block
//! is reported on stderr and changes the checksum. Not from mimalloc-bench.

use super::{Rng, mix, scaled};
use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};

/// `(alignment, smallest size, largest size, count at scale 1)`.
const BATCHES: [(usize, usize, usize, usize); 5] = [
    (128 << 10, 64, 64, 1000),
    (4 << 10, 64, 4 << 10, 1000),
    (64 << 10, 64, 64 << 10, 500),
    (1 << 20, 64, 1 << 20, 100),
    (2 << 20, 2 << 20, 2 << 20, 50),
];

pub(crate) fn run(_threads: usize, scale: f64) -> u64 {
    let rounds = scaled(20, scale);
    let mut rng = Rng::new(909);
    let mut sum = 0u64;
    let mut misaligned = 0u64;
    for _ in 0..rounds {
        let mut live: Vec<(*mut u8, Layout)> = Vec::new();
        for &(align, lo, hi, count) in &BATCHES {
            for _ in 0..scaled(count, scale) {
                let layout = Layout::from_size_align(rng.range(lo, hi), align).expect("layout");
                // SAFETY: `layout` has a non-zero size.
                let p = unsafe { alloc(layout) };
                if p.is_null() {
                    handle_alloc_error(layout);
                }
                if !(p as usize).is_multiple_of(align) {
                    misaligned += 1;
                    eprintln!("overaligned: {p:p} for {layout:?} is misaligned");
                }
                let v = rng.next() as u8;
                // SAFETY: both offsets are inside the block.
                unsafe {
                    p.write(v);
                    p.add(layout.size() - 1).write(v ^ 0xff);
                }
                live.push((p, layout));
            }
        }
        for i in (1..live.len()).rev() {
            live.swap(i, rng.range(0, i));
        }
        for (p, layout) in live {
            // SAFETY: `p` came from `alloc(layout)` above; both bytes were written.
            unsafe {
                sum = mix(
                    sum,
                    u64::from(p.read()) + u64::from(p.add(layout.size() - 1).read()),
                );
                dealloc(p, layout);
            }
        }
    }
    mix(sum, misaligned)
}
