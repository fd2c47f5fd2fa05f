//! mimalloc-bench-style whole-program workloads, re-implemented in Rust, run with a given
//! `#[global_allocator]`: one binary per allocator (`with_rdma_pool`, `with_mimalloc`,
//! `with_jemalloc`, `with_system`) calls [`main`], and the `compare` binary runs them all back
//! to back and writes the table.
//!
//! A run is `with_<allocator> <workload> <threads> [<scale>]`; it prints one line,
//! `RESULT <allocator> <workload> <threads> <seconds> <peak_kib> <final_kib> <checksum>
//! [<notes>]`, where the peak is the process's `VmHWM` plus its `HugetlbPages` (hugetlb pages
//! are not part of RSS), the final memory its `VmRSS` plus `HugetlbPages` once the workload
//! has returned (and dropped what it allocated: what the allocator still holds), and the
//! checksum is a function of what the workload computed, equal for every allocator (the
//! runner checks it). With `COMPARE_SETTLE_MS=<ms>` the run then waits that long and reads
//! the memory again (`settled_kib=<KiB>` among the notes): what the allocator still holds once
//! its purge delay has passed with the program idle.
//!
//! [`Counting`] wraps an allocator to count the bytes the workload asks for: the
//! `with_requested` binary prints their peak (`requested_kib=<KiB>`), the floor any allocator
//! must hold.
#![warn(missing_docs, unreachable_pub)]

pub mod workloads;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A global allocator that counts the bytes live in `A` and their peak (two atomic updates per
/// call: for counting runs, not for timing).
pub struct Counting<A> {
    inner: A,
    live: AtomicUsize,
    peak: AtomicUsize,
}

impl<A> Counting<A> {
    /// Count the bytes `inner` hands out.
    pub const fn new(inner: A) -> Self {
        Counting {
            inner,
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// The most bytes that were live at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }

    fn grow(&self, n: usize) {
        let now = self.live.fetch_add(n, Relaxed) + n;
        self.peak.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call is forwarded to `inner` unchanged; the counters only observe.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            self.grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            self.grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        self.live.fetch_sub(layout.size(), Relaxed);
        // SAFETY: forwarded.
        unsafe { self.inner.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded.
        let q = unsafe { self.inner.realloc(p, layout, new) };
        if !q.is_null() {
            self.live.fetch_sub(layout.size(), Relaxed);
            self.grow(new);
        }
        q
    }
}

/// The number after `name` in a `/proc` key-value text (`/proc/self/status`, `/proc/meminfo`);
/// 0 when absent.
pub fn proc_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Peak memory in KiB: `VmHWM + HugetlbPages` from `/proc/self/status`.
pub fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    proc_field(&status, "VmHWM:") + proc_field(&status, "HugetlbPages:")
}

/// Current memory in KiB: `VmRSS + HugetlbPages` from `/proc/self/status`.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    proc_field(&status, "VmRSS:") + proc_field(&status, "HugetlbPages:")
}

/// Parse the arguments, run the workload, print the `RESULT` line. `notes` adds
/// allocator-specific facts (e.g. degraded allocations) after the run.
pub fn main(allocator: &str, notes: impl Fn() -> Option<String>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!(
            "usage: with_{allocator} <workload> <threads> [<scale>]\nworkloads: {}",
            workloads::NAMES.join(" ")
        );
        std::process::exit(2)
    };
    let (Some(name), Some(threads)) = (args.first(), args.get(1).and_then(|t| t.parse().ok()))
    else {
        usage()
    };
    let scale: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let Some(run) = workloads::by_name(name) else {
        usage()
    };
    let start = Instant::now();
    let checksum = run(threads, scale);
    let secs = start.elapsed().as_secs_f64();
    let final_kib = rss_kib();
    let peak = peak_kib();
    if std::env::var_os("COMPARE_SMAPS").is_some() {
        print_largest_mappings();
    }
    let settle = std::env::var("COMPARE_SETTLE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0);
    let settled = settle.map(|ms| {
        std::thread::sleep(Duration::from_millis(ms));
        format!(" settled_kib={}", rss_kib())
    });
    println!(
        "RESULT {allocator} {name} {threads} {secs:.6} {peak} {final_kib} {checksum:016x} {}{}",
        notes().unwrap_or_default(),
        settled.unwrap_or_default()
    );
}

/// With `COMPARE_SMAPS` set: the ten mappings with the most resident memory, to stderr (what
/// a peak-memory ratio is made of).
fn print_largest_mappings() {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let mut rows: Vec<(u64, String)> = Vec::new();
    let mut name = String::new();
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            name = line.to_string();
        } else if let Some(kib) = line.strip_prefix("Rss:") {
            let kib = kib
                .trim()
                .trim_end_matches(" kB")
                .trim()
                .parse()
                .unwrap_or(0);
            rows.push((kib, name.clone()));
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (kib, name) in rows.iter().take(10) {
        eprintln!("{kib:>8} KiB  {name}");
    }
}
