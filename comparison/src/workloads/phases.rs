//! `phases`: does memory go back to the system between phases of a program? 20 phases; each
//! allocates 1 GiB (scaled) of blocks of one size — cycling through 40 KiB, 20 KiB, 10 KiB,
//! 64 B, 200 KiB, 1 KiB — held in a `Vec`, writes every page of every block, samples the
//! resident memory, frees them all, sleeps past the allocators' purge delays
//! (`COMPARE_PURGE_WAIT_MS`, default 1100 ms at scale ≥ 0.5, else 30 ms; rdma-pool's delay is
//! 1 s, `RDMA_POOL_PURGE_MS`), runs a short burst of small allocations and frees (allocators
//! that purge when they are next used get to), and samples again. Resident memory is `VmRSS +
//! HugetlbPages`; with `COMPARE_SERIES=<file>` the samples are written there, one line per
//! phase: `<phase> <block bytes> <KiB after the build> <KiB after the free and wait>` (the
//! runner plots them). The checksum does not depend on them. Not from mimalloc-bench.

use super::{Rng, mix, scaled};
use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::time::Duration;

const PHASES: usize = 20;
const SIZES: [usize; 6] = [40 << 10, 20 << 10, 10 << 10, 64, 200 << 10, 1 << 10];
const PAGE: usize = 4096;

/// Allocate `n` blocks of `size` bytes, write every page of each (and its last byte), return
/// the blocks and what was written.
fn build(n: usize, size: usize, phase: usize) -> (Vec<*mut u8>, u64) {
    let layout = Layout::from_size_align(size, 8).expect("layout");
    let mut blocks = Vec::with_capacity(n);
    let mut sum = 0u64;
    for i in 0..n {
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { alloc(layout) };
        if p.is_null() {
            handle_alloc_error(layout);
        }
        let v = (i ^ phase) as u8;
        for off in (0..size).step_by(PAGE).chain([size - 1]) {
            // SAFETY: `off < size`, inside the block.
            unsafe { p.add(off).write(v) };
        }
        sum = sum.wrapping_add(u64::from(v));
        blocks.push(p);
    }
    (blocks, sum)
}

/// Read back the first byte of each block and free it.
fn free(blocks: Vec<*mut u8>, size: usize) -> u64 {
    let layout = Layout::from_size_align(size, 8).expect("layout");
    let mut sum = 0u64;
    for p in blocks {
        // SAFETY: `p` came from `alloc(layout)` in `build` and its first byte was written.
        unsafe {
            sum = sum.wrapping_add(u64::from(p.read()));
            dealloc(p, layout);
        }
    }
    sum
}

/// A little allocator traffic of small blocks: what a program does between its big phases.
fn burst(rng: &mut Rng) -> u64 {
    let mut live: Vec<Box<[u8]>> = Vec::with_capacity(256);
    let mut sum = 0u64;
    for i in 0..4096 {
        let n = rng.range(8, 256);
        let b = vec![i as u8; n].into_boxed_slice();
        if live.len() < 256 {
            live.push(b);
        } else {
            let old = std::mem::replace(&mut live[rng.range(0, 255)], b);
            sum = sum.wrapping_add(u64::from(old[0]) + old.len() as u64);
        }
    }
    sum
}

pub(crate) fn run(_threads: usize, scale: f64) -> u64 {
    let bytes = scaled(1 << 30, scale);
    let wait_ms = std::env::var("COMPARE_PURGE_WAIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if scale >= 0.5 { 1100 } else { 30 });
    let mut rng = Rng::new(404);
    let mut series = String::new();
    let mut sum = 0u64;
    for phase in 0..PHASES {
        let size = SIZES[phase % SIZES.len()];
        let (blocks, written) = build((bytes / size).max(1), size, phase);
        let built = crate::rss_kib();
        let read = free(blocks, size);
        std::thread::sleep(Duration::from_millis(wait_ms));
        let small = burst(&mut rng);
        let after = crate::rss_kib();
        series += &format!("{phase} {size} {built} {after}\n");
        sum = mix(mix(mix(sum, written), read), small);
    }
    if let Some(path) = std::env::var_os("COMPARE_SERIES") {
        std::fs::write(&path, series).expect("cannot write COMPARE_SERIES");
    }
    sum
}
