//! Runs every workload with every allocator back to back, repeated, and writes one markdown
//! table of median time, peak memory and final memory (each also as a ratio to the best peer)
//! with the machine it ran on, and — with `--out` — a PNG of the resident memory over the
//! `phases` workload next to it.
//!
//! `compare [--threads N] [--repeats R] [--scale F] [--only a,b] [--timeout SECS] [--out FILE]
//! [--doc FILE]` (`scripts/compare.sh` builds and runs it). `--doc` (also spelled `--readme`)
//! names a markdown file whose text between `<!-- comparison:begin -->` and
//! `<!-- comparison:end -->` is replaced by the table (`docs/benchmarks.md`), its links
//! relative to that file. `--threads` is the thread count
//! of the `…N` workloads (default: the machine's cores), so the same suite shows scaling with
//! 1, 2, 4, 8, 16. `--only` takes labels (`larsonN`) or workload names (`larson`). The
//! allocator order rotates between repeats. Every allocator must compute the same checksum for
//! a workload; a run that crashes, exits with an error, prints no result, computes another
//! checksum than the others or outlives `--timeout` (default: 300 s × scale, at least 60 s;
//! the run's whole process group is killed) is recorded as a failure of that allocator and
//! shown in the table — the others still run — and the runner exits with status 1 at the end.
//!
//! The binaries (`with_<allocator>`) are looked for next to this one: `cargo build --bins`
//! puts them all in the same target directory (`target/debug` or `target/release`).
//!
//! With `--c-dir DIR` the table also has the C programs of `comparison/c` (built into `DIR` by
//! `scripts/compare-c.sh`), as rows `c/<name>`: each runs once per allocator, with its library
//! from `--preload ALLOCATOR=PATH` in `LD_PRELOAD` (the system allocator without one unless
//! given), measured and checked the same way. An allocator whose library is not given or not
//! there (rdma-pool's `librdma_pool.so` before it is built) is shown as "not built" in those
//! rows, not as a failure. `--c-only` leaves the Rust workloads out; `--note TEXT` adds a line
//! under the table's header (the allocators' versions, say).
//!
//! Memory beside time: each Rust workload also runs once under `with_requested` (the system
//! allocator behind a counter), whose peak of live requested bytes is the `requested` column —
//! the floor any allocator must hold — and rdma-pool's pinned bytes at their peak (the soft
//! NIC's memlock account) in one more run with pinned registration
//! (`RDMA_POOL_REGISTRATION=pinned`) are the `rdma_pool pinned peak` column, as a ratio to
//! `requested`, beside what it still pinned at the end and its time.
//! `--settle MS` has every run wait MS once its workload returned and read its memory again:
//! the final columns are then that memory, with jemalloc configured alike (its background
//! thread on and its dirty pages decaying over rdma-pool's purge delay:
//! `_RJEM_MALLOC_CONF` for the Rust binaries, `MALLOC_CONF` for the C programs).

use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ALLOCATORS: [&str; 4] = ["rdma_pool", "mimalloc", "jemalloc", "system"];

/// rdma-pool with pinned registration (`RDMA_POOL_REGISTRATION=pinned`): one run per Rust
/// workload, for the `rdma_pool pinned` column (what a device without ODP pins).
const PINNED: &str = "pinned";

/// The colours of the allocators in the plot, with their names for the legend.
const COLOURS: [(RGBColor, &str); 4] = [
    (RGBColor(0xd6, 0x27, 0x28), "red"),
    (RGBColor(0x1f, 0x77, 0xb4), "blue"),
    (RGBColor(0x2c, 0xa0, 0x2c), "green"),
    (RGBColor(0xff, 0x7f, 0x0e), "orange"),
];

/// The workload whose resident memory over time is plotted.
const PHASES: &str = "phases";

/// A workload of the suite: its label, its name for the binaries, its thread count (`None`:
/// the `--threads` argument).
const SUITE: [(&str, &str, Option<usize>); 20] = [
    ("alloc-test1", "alloc-test", Some(1)),
    ("alloc-testN", "alloc-test", None),
    ("larson1", "larson", Some(1)),
    ("larsonN", "larson", None),
    ("xmalloc-testN", "xmalloc-test", None),
    ("cache-scratch1", "cache-scratch", Some(1)),
    ("cache-scratchN", "cache-scratch", None),
    ("cache-thrash1", "cache-thrash", Some(1)),
    ("cache-thrashN", "cache-thrash", None),
    ("mstressN", "mstress", None),
    ("collectionsN", "collections", None),
    ("medium-fragN", "medium-frag", None),
    ("medium-xthreadN", "medium-xthread", None),
    ("vec-growthN", "vec-growth", None),
    ("phases", PHASES, Some(1)),
    ("threads", "threads", Some(1)),
    ("tokio-blockingN", "tokio-blocking", None),
    ("spawnN", "spawn", None),
    ("with-capacity", "with-capacity", Some(1)),
    ("overaligned", "overaligned", Some(1)),
];

/// The C programs (`comparison/c`, with `--c-dir`), labelled as mimalloc-bench labels them,
/// after `c/`: label, program, thread count (`None`: `--threads`; `sh6bench` runs two threads
/// per one asked for, as mimalloc-bench runs it).
const C_SUITE: [(&str, &str, Option<usize>); 11] = [
    ("c/alloc-test1", "alloc-test", Some(1)),
    ("c/alloc-testN", "alloc-test", None),
    ("c/larsonN", "larson", None),
    ("c/xmalloc-testN", "xmalloc-test", None),
    ("c/cache-scratch1", "cache-scratch", Some(1)),
    ("c/cache-scratchN", "cache-scratch", None),
    ("c/mstressN", "mstress", None),
    ("c/glibc-simple", "glibc-simple", Some(1)),
    ("c/glibc-thread", "glibc-thread", None),
    ("c/sh6benchN", "sh6bench", None),
    ("c/rptestN", "rptest", None),
];

/// Whether a suite label is one of the C programs.
fn is_c(label: &str) -> bool {
    label.starts_with("c/")
}

struct Args {
    threads: usize,
    repeats: usize,
    scale: f64,
    only: Option<Vec<String>>,
    timeout: Option<f64>,
    out: Option<PathBuf>,
    /// The markdown file whose marked section gets the table (`--doc`).
    doc: Option<PathBuf>,
    /// Where the C programs are (`--c-dir`), and whether to run only them (`--c-only`).
    c_dir: Option<PathBuf>,
    c_only: bool,
    /// The library each allocator's column preloads for the C programs (`--preload`).
    preload: BTreeMap<String, PathBuf>,
    /// Lines for the header (`--note`).
    notes: Vec<String>,
    /// Milliseconds each run waits before it reads its final memory again (`--settle`).
    settle_ms: u64,
}

/// rdma-pool's purge delay (its default `purge_delay`): what jemalloc's decay is set to when
/// final memory is read after `--settle`.
const PURGE_DELAY_MS: u64 = 1000;

fn parse() -> Args {
    let mut a = Args {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        repeats: 3,
        scale: 1.0,
        only: None,
        timeout: None,
        out: None,
        doc: None,
        c_dir: None,
        c_only: false,
        preload: BTreeMap::new(),
        notes: Vec::new(),
        settle_ms: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| fail(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--threads" => a.threads = value().parse().unwrap_or_else(|_| fail("--threads N")),
            "--repeats" => a.repeats = value().parse().unwrap_or_else(|_| fail("--repeats R")),
            "--scale" => a.scale = value().parse().unwrap_or_else(|_| fail("--scale F")),
            "--only" => a.only = Some(value().split(',').map(String::from).collect()),
            "--timeout" => {
                a.timeout = Some(value().parse().unwrap_or_else(|_| fail("--timeout SECS")))
            }
            "--out" => a.out = Some(value().into()),
            "--doc" | "--readme" => a.doc = Some(value().into()),
            "--c-dir" => a.c_dir = Some(value().into()),
            "--c-only" => a.c_only = true,
            "--preload" => {
                let v = value();
                let Some((alloc, path)) = v.split_once('=').filter(|(a, _)| ALLOCATORS.contains(a))
                else {
                    fail(&format!(
                        "--preload ALLOCATOR=PATH, ALLOCATOR one of {ALLOCATORS:?}"
                    ))
                };
                a.preload.insert(alloc.to_string(), path.into());
            }
            "--note" => a.notes.push(value()),
            "--settle" => a.settle_ms = value().parse().unwrap_or_else(|_| fail("--settle MS")),
            _ => fail(&format!("unknown argument {flag}")),
        }
    }
    if a.c_only && a.c_dir.is_none() {
        fail("--c-only needs --c-dir");
    }
    if a.threads == 0 || a.repeats == 0 || a.scale <= 0.0 || a.timeout.is_some_and(|t| t <= 0.0) {
        fail("threads, repeats, scale and timeout must be positive");
    }
    a
}

fn fail(msg: &str) -> ! {
    eprintln!("compare: {msg}");
    std::process::exit(2)
}

/// One run's result.
#[derive(Clone)]
struct Run {
    secs: f64,
    peak_kib: u64,
    final_kib: u64,
    checksum: String,
    notes: String,
    /// `settled_kib=` of the notes: the memory read again after `--settle`.
    settled_kib: Option<u64>,
    /// Why the run does not count (crash, timeout, error, wrong checksum).
    failure: Option<String>,
    /// `phases`: `(RSS KiB after the build, RSS KiB after the free and wait)` per phase.
    series: Vec<(u64, u64)>,
}

/// Whether child `pid` has exited, without reaping it (so its process group stays ours).
fn exited(pid: u32) -> bool {
    // SAFETY: an all-zero `siginfo_t` is valid; `waitid` writes into it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child; WNOWAIT leaves it waitable.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: `waitid` filled `info` (with WNOHANG, `si_pid` stays 0 while the child runs).
    r == 0 && unsafe { info.si_pid() } != 0
}

/// Read a pipe to its end on a thread.
fn reader(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// What `status` says went wrong, if anything.
fn status_failure(status: std::process::ExitStatus) -> Option<String> {
    if let Some(sig) = status.signal() {
        // SAFETY: `strsignal` returns a static or thread-local string for any number.
        let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) };
        Some(format!(
            "killed by signal {sig} ({})",
            name.to_string_lossy()
        ))
    } else if !status.success() {
        Some(format!("exit status {}", status.code().unwrap_or(-1)))
    } else {
        None
    }
}

/// The command that runs workload `label` (`name`) with `alloc`: the Rust binary
/// `with_<alloc>`, or the C program with the allocator's library preloaded; `None` for a C
/// program when the allocator has no library (not built).
fn command(
    args: &Args,
    dir: &Path,
    alloc: &str,
    (label, name, threads): (&str, &str, usize),
) -> Option<Command> {
    let (threads, scale) = (threads.to_string(), args.scale.to_string());
    let alike = format!("background_thread:true,dirty_decay_ms:{PURGE_DELAY_MS}");
    if !is_c(label) {
        // `pinned`: rdma-pool registering pinned memory (no ODP), for its pinned bytes.
        let bin = if alloc == PINNED { "rdma_pool" } else { alloc };
        let mut cmd = Command::new(dir.join(format!("with_{bin}")));
        cmd.args([name, &threads, &scale]);
        if alloc == PINNED {
            cmd.env("RDMA_POOL_REGISTRATION", "pinned");
        }
        if args.settle_ms > 0 {
            cmd.env("COMPARE_SETTLE_MS", args.settle_ms.to_string());
            if alloc == "jemalloc" {
                cmd.env("_RJEM_MALLOC_CONF", &alike);
            }
        }
        return Some(cmd);
    }
    let c_dir = args.c_dir.as_deref().expect("C rows come with --c-dir");
    let mut cmd = Command::new(c_dir.join(name));
    cmd.args(["--threads", &threads, "--scale", &scale])
        .env("COMPARE_ALLOCATOR", alloc)
        .env_remove("LD_PRELOAD");
    if args.settle_ms > 0 {
        cmd.env("COMPARE_SETTLE_MS", args.settle_ms.to_string());
        if alloc == "jemalloc" {
            cmd.env("MALLOC_CONF", &alike);
        }
    }
    match args.preload.get(alloc) {
        Some(lib) if lib.as_os_str().is_empty() => {}
        Some(lib) if lib.is_file() => {
            let lib = std::path::absolute(lib).unwrap_or_else(|_| lib.clone());
            cmd.env("LD_PRELOAD", lib);
        }
        None if alloc == "system" => {}
        _ => return None,
    }
    Some(cmd)
}

/// Run one workload with one allocator (`cmd`, from [`command`]), in its own process group,
/// for at most `timeout`.
fn run_one(
    mut cmd: Command,
    alloc: &str,
    name: &str,
    threads: usize,
    scale: f64,
    timeout: Duration,
) -> Run {
    let bin = PathBuf::from(cmd.get_program());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let series_file = (name == PHASES).then(|| {
        std::env::temp_dir().join(format!(
            "rdma-pool-compare-{}-{alloc}.series",
            std::process::id()
        ))
    });
    if let Some(f) = &series_file {
        let _ = std::fs::remove_file(f);
        cmd.env("COMPARE_SERIES", f);
        if alloc == "rdma_pool" && scale < 0.5 {
            // The workload's wait is 30 ms below scale 0.5; the pool's purge delay is 1 s.
            cmd.env("RDMA_POOL_PURGE_MS", "10");
        }
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        fail(&format!(
            "cannot run {} ({e}); build the binaries with `cargo build -p rdma-pool-comparison --bins` \
             (the C programs with scripts/compare-c.sh)",
            bin.display()
        ))
    });
    let out = reader(child.stdout.take().expect("piped stdout"));
    let err = reader(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let mut timed_out = false;
    while !exited(child.id()) {
        if start.elapsed() > timeout {
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The leader is unreaped, so the group is still ours: end it with whatever it left behind
    // (a forked child that hangs, say), then reap the leader.
    // SAFETY: a plain kill(2) of the process group we created.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let status = child.wait().expect("wait for the workload");
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let series = series_file
        .as_ref()
        .and_then(|f| {
            let text = std::fs::read_to_string(f).ok();
            let _ = std::fs::remove_file(f);
            text
        })
        .map(|t| {
            t.lines()
                .filter_map(|l| {
                    let v: Vec<u64> = l
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    (v.len() == 4).then(|| (v[2], v[3]))
                })
                .collect()
        })
        .unwrap_or_default();
    let line = stdout.lines().find(|l| l.starts_with("RESULT "));
    let f: Vec<&str> = line.map_or(Vec::new(), |l| l.split_whitespace().collect());
    let failure = if timed_out {
        Some(format!("timed out after {} s", timeout.as_secs_f64()))
    } else if let Some(why) = status_failure(status) {
        Some(why)
    } else if f.len() < 8 {
        Some("no RESULT line".to_string())
    } else {
        None
    };
    if let Some(why) = &failure {
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
        eprintln!("compare: {alloc} {name} {threads} failed: {why}");
        if !tail.trim().is_empty() {
            eprintln!("its stderr ends with:\n{tail}");
        }
    } else if !stderr.trim().is_empty() {
        eprintln!(
            "compare: {alloc} {name} {threads} said on stderr:\n{}",
            stderr.trim_end()
        );
    }
    let field = |i: usize| f.get(i).copied().unwrap_or("");
    Run {
        secs: field(4).parse().unwrap_or(f64::NAN),
        peak_kib: field(5).parse().unwrap_or(0),
        final_kib: field(6).parse().unwrap_or(0),
        checksum: field(7).to_string(),
        notes: f.get(8..).map_or(String::new(), |n| n.join(" ")),
        settled_kib: note_kib(&f, "settled_kib="),
        failure,
        series,
    }
}

/// The KiB after `key` among a RESULT line's notes (fields 8 on).
fn note_kib(fields: &[&str], key: &str) -> Option<u64> {
    fields
        .iter()
        .skip(8)
        .find_map(|f| f.strip_prefix(key))
        .and_then(|v| v.parse().ok())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_string(), |m| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| rdma_pool_comparison::proc_field(&mem, name);
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let thp = thp
        .split_whitespace()
        .find(|w| w.starts_with('['))
        .unwrap_or("?")
        .trim_matches(|c| c == '[' || c == ']')
        .to_string();
    format!(
        "{model}, {cores} cores, {} GiB RAM, Linux {}, THP {thp}, {} hugetlb pages of 2 MiB reserved",
        field("MemTotal:") >> 20,
        kernel.trim(),
        field("HugePages_Total:")
    )
}

/// `results[label][alloc]` = the runs of one allocator on one workload.
type Results<'a> = BTreeMap<&'a str, BTreeMap<&'a str, Vec<Run>>>;

fn main() {
    let args = parse();
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| fail("cannot find the directory of the binaries"));
    let c_suite = if args.c_dir.is_some() {
        &C_SUITE[..]
    } else {
        &[]
    };
    let rust_suite = if args.c_only { &[] } else { &SUITE[..] };
    let suite: Vec<(&str, &str, usize)> = rust_suite
        .iter()
        .chain(c_suite)
        .filter(|(label, name, _)| {
            args.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|x| x == label || x == name))
        })
        .map(|&(label, name, t)| (label, name, t.unwrap_or(args.threads)))
        .collect();
    if suite.is_empty() {
        fail("--only matched no workload");
    }
    if let Some(&first_c) = suite.iter().find(|w| is_c(w.0)) {
        for a in ALLOCATORS {
            if command(&args, &dir, a, first_c).is_none() {
                let lib = args
                    .preload
                    .get(a)
                    .map_or("none given".to_string(), |p| p.display().to_string());
                eprintln!("compare: {a}: no library for the C programs ({lib}): \"not built\"");
            }
        }
    }
    let timeout = Duration::from_secs_f64(args.timeout.unwrap_or((300.0 * args.scale).max(60.0)));
    let mut results: Results = suite.iter().map(|s| (s.0, BTreeMap::new())).collect();
    // What each Rust workload asks for at its peak, and what rdma-pool pins for it without
    // ODP: one run each.
    let mut requested: BTreeMap<&str, Run> = BTreeMap::new();
    let mut pinned: BTreeMap<&str, Run> = BTreeMap::new();
    for &(label, name, threads) in suite.iter().filter(|w| !is_c(w.0)) {
        for (what, into) in [("requested", &mut requested), (PINNED, &mut pinned)] {
            let Some(cmd) = command(&args, &dir, what, (label, name, threads)) else {
                continue;
            };
            let run = run_one(cmd, what, name, threads, args.scale, timeout);
            eprintln!(
                "[{what}] {label:<16} {} {}",
                run.failure
                    .as_ref()
                    .map_or(String::new(), |f| format!("FAILED ({f}) ")),
                run.notes
            );
            into.insert(label, run);
        }
    }
    for r in 0..args.repeats {
        for &(label, name, threads) in &suite {
            for i in 0..ALLOCATORS.len() {
                // Rotate the order so that no allocator always runs first (or after a warm cache).
                let alloc = ALLOCATORS[(i + r) % ALLOCATORS.len()];
                let Some(cmd) = command(&args, &dir, alloc, (label, name, threads)) else {
                    continue; // a C row's allocator without its library: "not built"
                };
                let run = run_one(cmd, alloc, name, threads, args.scale, timeout);
                eprintln!(
                    "[{}/{}] {label:<16} {alloc:<10} {:>9.3} s {:>8} KiB peak {:>8} KiB final {}{}",
                    r + 1,
                    args.repeats,
                    run.secs,
                    run.peak_kib,
                    run.final_kib,
                    run.failure
                        .as_ref()
                        .map_or(String::new(), |f| format!("FAILED ({f}) ")),
                    run.notes
                );
                results
                    .entry(label)
                    .or_default()
                    .entry(alloc)
                    .or_default()
                    .push(run);
            }
        }
    }
    check_checksums(&mut results);
    // The pinned run computes what the other allocators computed.
    for (label, run) in pinned.iter_mut() {
        let agreed = results
            .get(label)
            .into_iter()
            .flat_map(|row| row.values().flatten())
            .find(|r| r.failure.is_none())
            .map(|r| r.checksum.clone());
        if let Some(c) = agreed.filter(|c| run.failure.is_none() && *c != run.checksum) {
            run.failure = Some(format!("checksum {} (others {c})", run.checksum));
        }
    }
    let plotted = suite.iter().any(|s| s.1 == PHASES);
    let image = args
        .out
        .as_ref()
        .filter(|_| plotted)
        .map(|out| out.with_file_name("rss-phases.png"));
    if let Some(png) = &image {
        let series: Vec<(usize, &[(u64, u64)])> = (0..ALLOCATORS.len())
            .filter_map(|i| {
                let label = suite.iter().find(|s| s.1 == PHASES)?.0;
                let runs = results.get(label)?.get(ALLOCATORS[i])?;
                let run = runs.iter().rev().find(|r| r.failure.is_none())?;
                Some((i, run.series.as_slice()))
            })
            .filter(|(_, s)| !s.is_empty())
            .collect();
        if let Err(e) = plot(png, &series) {
            fail(&format!("{}: cannot draw the plot: {e}", png.display()));
        }
    }
    // The image's link, relative to the file the report goes into.
    let link = |into: &Path| image.as_ref().map(|png| relative(into, png));
    let table = report(
        &args,
        &suite,
        (&results, &requested, &pinned),
        args.out.as_deref().and_then(link).as_deref(),
    );
    print!("{table}");
    if let Some(out) = &args.out {
        std::fs::write(out, &table).unwrap_or_else(|e| fail(&format!("{}: {e}", out.display())));
    }
    if let Some(doc) = &args.doc {
        update_doc(
            doc,
            &report(
                &args,
                &suite,
                (&results, &requested, &pinned),
                link(doc).as_deref(),
            ),
        );
    }
    let mut failures = failures(&suite, &results);
    failures.extend(
        pinned
            .iter()
            .filter_map(|(label, r)| Some(format!("{label} {PINNED}: {}", r.failure.as_ref()?))),
    );
    if !failures.is_empty() {
        eprintln!("compare: failed runs: {}", failures.join("; "));
        std::process::exit(1);
    }
}

/// Mark the runs whose checksum differs from the one most allocators computed (on a tie, the
/// one the most allocators other than rdma_pool computed) as failures.
fn check_checksums(results: &mut Results) {
    for (label, row) in results.iter_mut() {
        let mut votes: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (alloc, runs) in row.iter() {
            for r in runs.iter().filter(|r| r.failure.is_none()) {
                let v = votes.entry(r.checksum.clone()).or_default();
                v.0 += 1;
                v.1 += usize::from(*alloc != "rdma_pool");
            }
        }
        let Some(agreed) = votes
            .iter()
            .max_by_key(|(_, v)| **v)
            .map(|(c, _)| c.clone())
        else {
            continue;
        };
        for (alloc, runs) in row.iter_mut() {
            for r in runs.iter_mut().filter(|r| r.failure.is_none()) {
                if r.checksum != agreed {
                    eprintln!(
                        "compare: {label}: {alloc} computed checksum {}, the others {agreed}",
                        r.checksum
                    );
                    r.failure = Some(format!("wrong checksum {}", r.checksum));
                }
            }
        }
    }
}

/// `label allocator: why` for every failed run.
fn failures(suite: &[(&str, &str, usize)], results: &Results) -> Vec<String> {
    let mut v = Vec::new();
    for &(label, _, _) in suite {
        for a in ALLOCATORS {
            let Some(runs) = results.get(label).and_then(|row| row.get(a)) else {
                continue;
            };
            let failed: BTreeSet<&str> = runs.iter().filter_map(|r| r.failure.as_deref()).collect();
            let n = runs.iter().filter(|r| r.failure.is_some()).count();
            if n > 0 {
                let why = failed.into_iter().collect::<Vec<_>>().join(", ");
                v.push(format!("{label} {a}: {n} of {} runs ({why})", runs.len()));
            }
        }
    }
    v
}

/// `to` relative to the directory of the file `from` (both as given, or made absolute),
/// climbing with `..` where `to` is not below it.
fn relative(from: &Path, to: &Path) -> String {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let dir = from.parent().filter(|d| !d.as_os_str().is_empty());
    let base = abs(dir.unwrap_or(Path::new(".")));
    let to = abs(to);
    let (base, to): (Vec<_>, Vec<_>) = (base.components().collect(), to.components().collect());
    let common = base.iter().zip(&to).take_while(|(b, t)| b == t).count();
    let mut rel = PathBuf::new();
    for _ in common..base.len() {
        rel.push("..");
    }
    rel.extend(&to[common..]);
    rel.display().to_string()
}

/// The markdown report: one row per workload, time, peak and final memory per allocator with
/// its ratio to the best of the row, rdma-pool's summary against mimalloc/jemalloc, the
/// `phases` samples and, when drawn, the plot (`image`: its link).
fn report(
    args: &Args,
    suite: &[(&str, &str, usize)],
    (results, requested, pinned_runs): (&Results, &BTreeMap<&str, Run>, &BTreeMap<&str, Run>),
    image: Option<&str>,
) -> String {
    let mut s = String::new();
    s += &format!(
        "Comparison suite, {} repeats, scale {}, `…N` workloads with {} threads; medians.\n\
         Machine: {}.\n\
         Peak memory is `VmHWM + HugetlbPages` (hugetlb pages counted; rdma-pool prefers them); \
         final memory is `VmRSS + HugetlbPages` when the workload has returned and freed \
         everything (what the allocator keeps){}. `requested` is the most bytes the workload \
         had live at once (counted around the system allocator): the floor any allocator must \
         hold; `rdma_pool pinned peak` is the most memory rdma-pool's soft NIC had pinned (its \
         memlock account) in one more run with pinned registration \
         (`RDMA_POOL_REGISTRATION=pinned`: what a device without ODP pins), with its ratio \
         to `requested`; `pinned final` what it still pinned when the final memory was read, \
         `pinned time` that run's time (one run, ratio to the row's best median).\n",
        args.repeats,
        args.scale,
        args.threads,
        machine(),
        if args.settle_ms > 0 {
            format!(
                ", read {} ms later with the program idle (jemalloc with \
                 `background_thread:true,dirty_decay_ms:{PURGE_DELAY_MS}`, rdma-pool's purge \
                 delay)",
                args.settle_ms
            )
        } else {
            String::new()
        }
    );
    if suite.iter().any(|w| is_c(w.0)) {
        s += "Rows `c/…` are the C programs of `comparison/c` (mimalloc-bench's benchmarks, \
              re-written to do a fixed amount of work), each a process of its own with the \
              allocator's shared library in `LD_PRELOAD` (the system allocator without one), \
              measuring itself the same way; \"not built\": that allocator's library was not \
              there.\n";
    }
    for note in &args.notes {
        s += &format!("{note}\n");
    }
    s += "\n";
    s += "| workload |";
    for what in ["", " peak", " final"] {
        for a in ALLOCATORS {
            s += &format!(" {a}{what} |");
        }
    }
    s += " requested | rdma_pool pinned peak | pinned final | pinned time |";
    s += "\n|---|";
    s += &"---|".repeat(3 * ALLOCATORS.len() + 4);
    s += "\n";
    let (mut log_time, mut log_mem, mut log_final, mut n) = (0.0f64, 0.0f64, 0.0f64, 0);
    let mut worst_time = (String::new(), 0.0f64);
    let mut worst_mem = (String::new(), 0.0f64);
    let mut worst_final = (String::new(), 0.0f64);
    for &(label, _, _) in suite {
        let row = &results[label];
        // An allocator counts in a row when none of its runs failed.
        let ok: BTreeMap<&str, &Vec<Run>> = row
            .iter()
            .filter(|(_, runs)| runs.iter().all(|r| r.failure.is_none()))
            .map(|(a, runs)| (*a, runs))
            .collect();
        let med = |f: fn(&Run) -> f64| -> BTreeMap<&str, f64> {
            ok.iter()
                .map(|(a, runs)| (*a, median(runs.iter().map(f).collect())))
                .collect()
        };
        let time = med(|r| r.secs);
        let mem = med(|r| r.peak_kib as f64);
        let fin = med(|r| r.settled_kib.unwrap_or(r.final_kib) as f64);
        let best =
            |m: &BTreeMap<&str, f64>| m.values().copied().fold(f64::INFINITY, f64::min).max(1e-9);
        let (best_t, best_m, best_f) = (best(&time), best(&mem), best(&fin));
        s += &format!("| {label} |");
        let failed = |a: &str| {
            let why: BTreeSet<&str> = row
                .get(a)
                .into_iter()
                .flatten()
                .filter_map(|r| r.failure.as_deref())
                .collect();
            why.into_iter().collect::<Vec<_>>().join(", ")
        };
        for a in ALLOCATORS {
            s += &match time.get(a) {
                Some(t) => format!(" {t:.3} s ({:.2}×) |", t / best_t),
                None if !row.contains_key(a) => " not built |".to_string(),
                None => format!(" **failed**: {} |", failed(a)),
            };
        }
        for (m, best) in [(&mem, best_m), (&fin, best_f)] {
            for a in ALLOCATORS {
                s += &match m.get(a) {
                    Some(v) => format!(" {:.1} MiB ({:.2}×) |", v / 1024.0, v / best),
                    None => " – |".to_string(),
                };
            }
        }
        let asked = requested
            .get(label)
            .filter(|r| r.failure.is_none())
            .and_then(|r| {
                r.notes
                    .split_whitespace()
                    .find_map(|n| n.strip_prefix("requested_kib="))
            })
            .and_then(|v| v.parse::<f64>().ok());
        // The pinned run's pinned bytes, at their peak and after the settle.
        let pinned_run = pinned_runs.get(label);
        let pinned_kib = |key: &str| {
            pinned_run
                .filter(|r| r.failure.is_none())
                .and_then(|r| r.notes.split_whitespace().find_map(|n| n.strip_prefix(key)))
                .and_then(|v| v.parse::<f64>().ok())
        };
        s += &match asked {
            Some(q) => format!(" {:.1} MiB |", q / 1024.0),
            None => " – |".to_string(),
        };
        s += &match (pinned_kib("pinned_peak_kib="), asked) {
            (Some(p), Some(q)) => format!(" {:.1} MiB ({:.2}×) |", p / 1024.0, p / q.max(1.0)),
            (Some(p), None) => format!(" {:.1} MiB |", p / 1024.0),
            _ if pinned_run.is_some_and(|r| r.failure.is_some()) => " **failed** |".to_string(),
            _ => " – |".to_string(),
        };
        s += &match (pinned_kib("pinned_kib="), pinned_run) {
            (Some(p), _) => format!(" {:.1} MiB |", p / 1024.0),
            _ => " – |".to_string(),
        };
        s += &match pinned_run.filter(|r| r.failure.is_none()) {
            Some(r) => format!(" {:.3} s ({:.2}×) |", r.secs, r.secs / best_t),
            None => " – |".to_string(),
        };
        s += "\n";
        let (Some(t), Some(tm), Some(tj)) = (
            time.get("rdma_pool"),
            time.get("mimalloc"),
            time.get("jemalloc"),
        ) else {
            continue;
        };
        let rt = t / tm.min(*tj);
        let rm = mem["rdma_pool"] / mem["mimalloc"];
        let rf = fin["rdma_pool"] / fin["mimalloc"];
        log_time += rt.ln();
        log_mem += rm.ln();
        log_final += rf.ln();
        n += 1;
        for (worst, r) in [
            (&mut worst_time, rt),
            (&mut worst_mem, rm),
            (&mut worst_final, rf),
        ] {
            if r > worst.1 {
                *worst = (label.to_string(), r);
            }
        }
    }
    if n > 0 {
        s += &format!(
            "\nrdma_pool against the faster of mimalloc and jemalloc, per workload: time geometric \
             mean {:.2}× (worst {} {:.2}×); against mimalloc: peak memory geometric mean {:.2}× \
             (worst {} {:.2}×), final memory geometric mean {:.2}× (worst {} {:.2}×).\n",
            (log_time / n as f64).exp(),
            worst_time.0,
            worst_time.1,
            (log_mem / n as f64).exp(),
            worst_mem.0,
            worst_mem.1,
            (log_final / n as f64).exp(),
            worst_final.0,
            worst_final.1
        );
    }
    let failures = failures(suite, results);
    if !failures.is_empty() {
        s += &format!("\nFailed runs: {}.\n", failures.join("; "));
    }
    let notes: Vec<String> = suite
        .iter()
        .filter_map(|&(label, _, _)| {
            let n = &results[label].get("rdma_pool")?.last()?.notes;
            (!n.is_empty()).then(|| format!("{label}: {n}"))
        })
        .collect();
    if !notes.is_empty() {
        s += &format!(
            "\nrdma_pool's own counters (last run): {}.\n",
            notes.join("; ")
        );
    }
    if let Some(&(label, _, _)) = suite.iter().find(|s| s.1 == PHASES) {
        s += &phases_report(label, &results[label], image);
    }
    s
}

/// The `phases` samples: per allocator, the most resident memory with the blocks live, and
/// the mean and last with them freed; the plot's link and legend.
fn phases_report(label: &str, row: &BTreeMap<&str, Vec<Run>>, image: Option<&str>) -> String {
    let mut s = format!(
        "\nResident memory over `{label}` (last run; 20 phases of building 1 GiB × scale of \
         equal blocks, freeing them and waiting past the purge delay):\n\n\
         | allocator | most, blocks live | mean, freed | last, freed |\n|---|---|---|---|\n"
    );
    for a in ALLOCATORS {
        let Some(run) = row
            .get(a)
            .and_then(|runs| runs.iter().rev().find(|r| !r.series.is_empty()))
        else {
            s += &format!("| {a} | – | – | – |\n");
            continue;
        };
        let built = run.series.iter().map(|p| p.0).max().unwrap_or(0);
        let freed: Vec<u64> = run.series.iter().map(|p| p.1).collect();
        let mean = freed.iter().sum::<u64>() as f64 / freed.len() as f64;
        s += &format!(
            "| {a} | {:.1} MiB | {:.1} MiB | {:.1} MiB |\n",
            built as f64 / 1024.0,
            mean / 1024.0,
            *freed.last().unwrap_or(&0) as f64 / 1024.0
        );
    }
    if let Some(link) = image {
        let legend: Vec<String> = ALLOCATORS
            .iter()
            .zip(COLOURS)
            .map(|(a, (_, colour))| format!("{a} {colour}"))
            .collect();
        s += &format!(
            "\n![Resident memory over the phases workload]({link})\n\n\
             Resident memory (MiB, left) over the phases (numbered below): per phase, one point \
             with its blocks live, then one after freeing them and waiting. Colours: {}.\n",
            legend.join(", ")
        );
    }
    s
}

/// Draw the `phases` series (`(allocator index, samples)`) as lines on a white PNG, without
/// text: the axes' numbers are drawn with a small built-in digit font (no system fonts).
fn plot(path: &Path, series: &[(usize, &[(u64, u64)])]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let phases = series.iter().map(|s| s.1.len()).max().unwrap_or(0).max(1);
    let top_kib = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0.max(p.1)))
        .max()
        .unwrap_or(1);
    // A round grid step in MiB, 4 to 10 lines.
    let top_mib = (top_kib as f64 / 1024.0).max(1.0);
    let step = [1u64, 2, 5]
        .iter()
        .flat_map(|m| (0..7).map(move |e| m * 10u64.pow(e)))
        .filter(|s| top_mib / *s as f64 <= 8.0)
        .min()
        .unwrap_or(1 << 20);
    let y_max = ((top_mib / step as f64).ceil() as u64).max(1) * step;
    let x_max = (2 * phases - 1) as f64;
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let chart = ChartBuilder::on(&root)
        .margin_left(70)
        .margin_bottom(36)
        .margin_top(16)
        .margin_right(16)
        .build_cartesian_2d(-0.25f64..x_max + 0.25, 0f64..y_max as f64)
        .map_err(|e| err(&e))?;
    let grid = RGBColor(0xdd, 0xdd, 0xdd);
    let area = chart.plotting_area();
    for y in (0..=y_max).step_by(step as usize) {
        let y = y as f64;
        area.draw(&PathElement::new(vec![(-0.25, y), (x_max + 0.25, y)], grid))
            .map_err(|e| err(&e))?;
        let (px, py) = chart.backend_coord(&(-0.25, y));
        digits(&root, &format!("{}", y as u64), px - 8, py, true).map_err(|e| err(&e))?;
    }
    for p in 0..phases {
        let x = 2.0 * p as f64;
        area.draw(&PathElement::new(vec![(x, 0.0), (x, y_max as f64)], grid))
            .map_err(|e| err(&e))?;
        let (px, py) = chart.backend_coord(&(x + 0.5, 0.0));
        digits(&root, &p.to_string(), px, py + 18, false).map_err(|e| err(&e))?;
    }
    area.draw(&PathElement::new(
        vec![(-0.25, y_max as f64), (-0.25, 0.0), (x_max + 0.25, 0.0)],
        BLACK,
    ))
    .map_err(|e| err(&e))?;
    for &(i, samples) in series {
        let colour = COLOURS[i].0;
        let points: Vec<(f64, f64)> = samples
            .iter()
            .enumerate()
            .flat_map(|(p, &(built, freed))| {
                [
                    (2.0 * p as f64, built as f64 / 1024.0),
                    (2.0 * p as f64 + 1.0, freed as f64 / 1024.0),
                ]
            })
            .collect();
        area.draw(&PathElement::new(points.clone(), colour.stroke_width(2)))
            .map_err(|e| err(&e))?;
        for &p in &points {
            area.draw(&Circle::new(p, 3, colour.filled()))
                .map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))
}

/// 3×5 pixel digits, one row of three bits per line, top first.
const FONT: [[u8; 5]; 10] = [
    [7, 5, 5, 5, 7],
    [2, 6, 2, 2, 7],
    [7, 1, 7, 4, 7],
    [7, 1, 7, 1, 7],
    [5, 5, 7, 1, 1],
    [7, 4, 7, 1, 7],
    [7, 4, 7, 5, 7],
    [7, 1, 1, 1, 1],
    [7, 5, 7, 5, 7],
    [7, 5, 7, 1, 7],
];

/// Draw the digits of `text` with their vertical centre at `y`: ending at `x` when
/// `right_aligned`, else centred on it.
fn digits<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    text: &str,
    x: i32,
    y: i32,
    right_aligned: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    const PX: i32 = 3;
    let width = text.len() as i32 * 4 * PX - PX;
    let x0 = if right_aligned {
        x - width
    } else {
        x - width / 2
    };
    let y0 = y - 5 * PX / 2;
    for (i, c) in text.bytes().enumerate() {
        let glyph = FONT[usize::from(c - b'0')];
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..3 {
                if bits & (4 >> col) != 0 {
                    let gx = x0 + (i as i32 * 4 + col) * PX;
                    let gy = y0 + row as i32 * PX;
                    area.draw(&Rectangle::new(
                        [(gx, gy), (gx + PX, gy + PX)],
                        BLACK.filled(),
                    ))?;
                }
            }
        }
    }
    Ok(())
}

const BEGIN: &str = "<!-- comparison:begin -->";
const END: &str = "<!-- comparison:end -->";

/// Replace the text between [`BEGIN`] and [`END`] in the file at `path`.
fn update_doc(path: &Path, table: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{e}")));
    let Some(new) = replace_marked(&text, table) else {
        fail(&format!(
            "{} has no {BEGIN} … {END} markers",
            path.display()
        ))
    };
    std::fs::write(path, new).unwrap_or_else(|e| fail(&format!("{e}")));
}

/// `text` with what lies between [`BEGIN`] and [`END`] replaced by `table`; `None` without
/// both markers in that order.
fn replace_marked(text: &str, table: &str) -> Option<String> {
    let i = text.find(BEGIN)?;
    let j = i + text[i..].find(END)?;
    Some(format!("{}{BEGIN}\n{table}{}", &text[..i], &text[j..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_relative_to_the_file_they_go_into() {
        let rel = |from: &str, to: &str| relative(Path::new(from), Path::new(to));
        let png = "comparison/rss-phases.png";
        assert_eq!(rel("README.md", png), png);
        assert_eq!(
            rel("docs/benchmarks.md", png),
            "../comparison/rss-phases.png"
        );
        assert_eq!(rel("comparison/RESULTS.md", png), "rss-phases.png");
    }

    #[test]
    fn the_table_replaces_what_lies_between_the_markers() {
        let text = format!("# Title\n\n{BEGIN}\nold table\n{END}\n\nafter\n");
        let new = replace_marked(&text, "new table\n").unwrap();
        assert_eq!(
            new,
            format!("# Title\n\n{BEGIN}\nnew table\n{END}\n\nafter\n")
        );
        assert_eq!(replace_marked("no markers", "t"), None);
        assert_eq!(replace_marked(&format!("{END} {BEGIN}"), "t"), None);
    }

    #[test]
    fn the_docs_file_compare_sh_names_has_the_markers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let script = std::fs::read_to_string(root.join("scripts/compare.sh")).unwrap();
        let doc = "docs/benchmarks.md";
        assert!(
            script.contains(&format!("--doc {doc}")),
            "scripts/compare.sh: --doc {doc}"
        );
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        assert!(
            replace_marked(&text, "").is_some(),
            "{doc} has no {BEGIN} … {END}"
        );
    }
}
