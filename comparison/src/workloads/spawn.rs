//! `spawn`: `fork` + `exec` under allocation load. `threads` worker threads churn small
//! (16–1024 bytes) and medium (64–512 KiB) blocks while the main thread runs `true` 100 times
//! (scaled, at least 5) with `std::process::Command`, each with `PATH` set (so std forks
//! instead of using `posix_spawn`) and every other one with a no-op `pre_exec` hook (which
//! always forks), checking each child exits 0. A fork taken while another thread holds an
//! allocator lock, or an allocator's fork handlers mishandling their state, shows up as a
//! child that hangs or dies — reported on stderr, and the checksum then differs. The workers
//! do a fixed, counted amount of work (40,000 steps each, scaled) and go on churning,
//! uncounted, until the children are all done. Not from mimalloc-bench.

use super::{Rng, mix, read_touched, scaled, touched};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

/// Live blocks per worker.
const RING: usize = 256;

/// One step of churn: replace a random block of `ring`, 1 in 16 a medium one.
fn step(
    rng: &mut Rng,
    ring: &mut [Vec<u8>],
    medium: &mut Vec<Box<[std::mem::MaybeUninit<u8>]>>,
) -> u64 {
    if rng.next().is_multiple_of(16) {
        let b = touched(rng.range(64 << 10, 512 << 10), rng.next() as u8);
        let old = if medium.len() < 8 {
            medium.push(b);
            0
        } else {
            let i = rng.range(0, medium.len() - 1);
            read_touched(&std::mem::replace(&mut medium[i], b))
        };
        return old;
    }
    let n = rng.range(16, 1024);
    let i = rng.range(0, ring.len() - 1);
    let old = std::mem::replace(&mut ring[i], vec![n as u8; n]);
    old.first().map_or(0, |&b| u64::from(b))
}

fn worker(id: usize, steps: usize, done: &AtomicBool) -> u64 {
    let mut rng = Rng::new(id as u64 + 707);
    let mut ring = vec![Vec::new(); RING];
    let mut medium = Vec::new();
    let mut sum = 0u64;
    for _ in 0..steps {
        sum = sum.wrapping_add(step(&mut rng, &mut ring, &mut medium));
    }
    // Keep the load on until the children are done; this part is not counted.
    let mut extra = Rng::new(id as u64 + 808);
    while !done.load(Ordering::Relaxed) {
        for _ in 0..64 {
            std::hint::black_box(step(&mut extra, &mut ring, &mut medium));
        }
    }
    sum
}

/// Run `true` once; whether it exited 0.
fn child(i: usize, path: &std::ffi::OsStr) -> bool {
    let mut cmd = Command::new("true");
    cmd.env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if i % 2 == 1 {
        // SAFETY: the hook does nothing (it only makes std fork rather than posix_spawn).
        unsafe {
            cmd.pre_exec(|| Ok(()));
        }
    }
    match cmd.status() {
        Ok(s) if s.success() => true,
        Ok(s) => {
            eprintln!("spawn: child {i} (`true`) ended with {s}");
            false
        }
        Err(e) => {
            eprintln!("spawn: cannot run child {i} (`true`): {e}");
            false
        }
    }
}

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let children = scaled(100, scale).max(5);
    let steps = scaled(40_000, scale);
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let done = &done;
                s.spawn(move || worker(t, steps, done))
            })
            .collect();
        let ok = (0..children).filter(|&i| child(i, &path)).count();
        done.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .fold(ok as u64, |s, h| mix(s, h.join().unwrap()))
    })
}
