//! Runs every workload with every allocator back to back, repeated, and writes one markdown
//! table of median time and peak memory (each also as a ratio to the best peer) with the
//! machine it ran on.
//!
//! `compare [--threads N] [--repeats R] [--scale F] [--only a,b] [--out FILE] [--readme FILE]`
//! (`scripts/compare.sh` builds and runs it). `--threads` is the thread count of the `…N`
//! workloads (default: the machine's cores), so the same suite shows scaling with 1, 2, 4, 8,
//! 16. The allocator order rotates between repeats; every allocator must compute the same
//! checksum for a workload, or the run fails.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

const ALLOCATORS: [&str; 4] = ["rdma_pool", "mimalloc", "jemalloc", "system"];

/// A workload of the suite: its label, its name for the binaries, its thread count (`None`:
/// the `--threads` argument).
const SUITE: [(&str, &str, Option<usize>); 10] = [
    ("alloc-test1", "alloc-test", Some(1)),
    ("alloc-testN", "alloc-test", None),
    ("larsonN", "larson", None),
    ("xmalloc-testN", "xmalloc-test", None),
    ("cache-scratch1", "cache-scratch", Some(1)),
    ("cache-scratchN", "cache-scratch", None),
    ("cache-thrash1", "cache-thrash", Some(1)),
    ("cache-thrashN", "cache-thrash", None),
    ("mstressN", "mstress", None),
    ("collectionsN", "collections", None),
];

struct Args {
    threads: usize,
    repeats: usize,
    scale: f64,
    only: Option<Vec<String>>,
    out: Option<PathBuf>,
    readme: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        repeats: 3,
        scale: 1.0,
        only: None,
        out: None,
        readme: None,
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
            "--out" => a.out = Some(value().into()),
            "--readme" => a.readme = Some(value().into()),
            _ => fail(&format!("unknown argument {flag}")),
        }
    }
    if a.threads == 0 || a.repeats == 0 || a.scale <= 0.0 {
        fail("threads, repeats and scale must be positive");
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
    checksum: String,
    notes: String,
}

fn run_one(dir: &std::path::Path, alloc: &str, name: &str, threads: usize, scale: f64) -> Run {
    let bin = dir.join(format!("with_{alloc}"));
    let out = Command::new(&bin)
        .args([name, &threads.to_string(), &scale.to_string()])
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", bin.display())));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("RESULT "));
    let (true, Some(line)) = (out.status.success(), line) else {
        fail(&format!(
            "{alloc} {name} {threads} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    let f: Vec<&str> = line.split_whitespace().collect();
    Run {
        secs: f[4].parse().unwrap_or(f64::NAN),
        peak_kib: f[5].parse().unwrap_or(0),
        checksum: f[6].to_string(),
        notes: f[7..].join(" "),
    }
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

fn main() {
    let args = parse();
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| fail("cannot find the directory of the binaries"));
    let suite: Vec<(&str, &str, usize)> = SUITE
        .iter()
        .filter(|(label, _, _)| {
            args.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|x| x == label))
        })
        .map(|&(label, name, t)| (label, name, t.unwrap_or(args.threads)))
        .collect();
    if suite.is_empty() {
        fail("--only matched no workload");
    }
    // results[label][alloc] = runs
    let mut results: BTreeMap<&str, BTreeMap<&str, Vec<Run>>> = BTreeMap::new();
    for r in 0..args.repeats {
        for &(label, name, threads) in &suite {
            for i in 0..ALLOCATORS.len() {
                // Rotate the order so that no allocator always runs first (or after a warm cache).
                let alloc = ALLOCATORS[(i + r) % ALLOCATORS.len()];
                let run = run_one(&dir, alloc, name, threads, args.scale);
                eprintln!(
                    "[{}/{}] {label:<15} {alloc:<10} {:>9.3} s {:>8} KiB {}",
                    r + 1,
                    args.repeats,
                    run.secs,
                    run.peak_kib,
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
    let table = report(&args, &suite, &results);
    print!("{table}");
    if let Some(out) = &args.out {
        std::fs::write(out, &table).unwrap_or_else(|e| fail(&format!("{}: {e}", out.display())));
    }
    if let Some(readme) = &args.readme {
        update_readme(readme, &table);
    }
}

/// The markdown report: one row per workload, time and peak memory per allocator with its
/// ratio to the best of the row, and rdma-pool's summary against mimalloc/jemalloc.
fn report(
    args: &Args,
    suite: &[(&str, &str, usize)],
    results: &BTreeMap<&str, BTreeMap<&str, Vec<Run>>>,
) -> String {
    let mut s = String::new();
    s += &format!(
        "Comparison suite, {} repeats, scale {}, `…N` workloads with {} threads; medians.\n\
         Machine: {}.\n\
         Peak memory is `VmHWM + HugetlbPages` (hugetlb pages counted; rdma-pool prefers them).\n\n",
        args.repeats,
        args.scale,
        args.threads,
        machine()
    );
    s += "| workload | rdma_pool | mimalloc | jemalloc | system | rdma_pool memory | mimalloc memory | jemalloc memory | system memory |\n";
    s += "|---|---|---|---|---|---|---|---|---|\n";
    let (mut log_time, mut log_mem, mut n) = (0.0f64, 0.0f64, 0);
    let mut worst_time = (String::new(), 0.0f64);
    let mut worst_mem = (String::new(), 0.0f64);
    for &(label, _, _) in suite {
        let row = &results[label];
        // Every allocator must have computed the same thing.
        let sums: std::collections::BTreeSet<&str> = row
            .values()
            .flat_map(|runs| runs.iter().map(|r| r.checksum.as_str()))
            .collect();
        if sums.len() != 1 {
            fail(&format!(
                "{label}: allocators disagree on the checksum: {sums:?}"
            ));
        }
        let time: BTreeMap<&str, f64> = row
            .iter()
            .map(|(a, runs)| (*a, median(runs.iter().map(|r| r.secs).collect())))
            .collect();
        let mem: BTreeMap<&str, f64> = row
            .iter()
            .map(|(a, runs)| (*a, median(runs.iter().map(|r| r.peak_kib as f64).collect())))
            .collect();
        let best_t = time.values().copied().fold(f64::INFINITY, f64::min);
        let best_m = mem.values().copied().fold(f64::INFINITY, f64::min);
        s += &format!("| {label} |");
        for a in ALLOCATORS {
            s += &format!(" {:.3} s ({:.2}×) |", time[a], time[a] / best_t);
        }
        for a in ALLOCATORS {
            s += &format!(" {:.1} MiB ({:.2}×) |", mem[a] / 1024.0, mem[a] / best_m);
        }
        s += "\n";
        let rt = time["rdma_pool"] / time["mimalloc"].min(time["jemalloc"]);
        let rm = mem["rdma_pool"] / mem["mimalloc"];
        log_time += rt.ln();
        log_mem += rm.ln();
        n += 1;
        if rt > worst_time.1 {
            worst_time = (label.to_string(), rt);
        }
        if rm > worst_mem.1 {
            worst_mem = (label.to_string(), rm);
        }
    }
    let notes: Vec<String> = suite
        .iter()
        .filter_map(|&(label, _, _)| {
            let n = &results[label]["rdma_pool"].last()?.notes;
            (!n.is_empty()).then(|| format!("{label}: {n}"))
        })
        .collect();
    s += &format!(
        "\nrdma_pool against the faster of mimalloc and jemalloc, per workload: time geometric \
         mean {:.2}× (worst {} {:.2}×); peak memory against mimalloc: geometric mean {:.2}× \
         (worst {} {:.2}×).\n",
        (log_time / n as f64).exp(),
        worst_time.0,
        worst_time.1,
        (log_mem / n as f64).exp(),
        worst_mem.0,
        worst_mem.1
    );
    if !notes.is_empty() {
        s += &format!(
            "\nrdma_pool's own counters (last run): {}.\n",
            notes.join("; ")
        );
    }
    s
}

/// Replace the text between `<!-- comparison:begin -->` and `<!-- comparison:end -->`.
fn update_readme(path: &std::path::Path, table: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{e}")));
    let (b, e) = ("<!-- comparison:begin -->", "<!-- comparison:end -->");
    let (Some(i), Some(j)) = (text.find(b), text.find(e)) else {
        fail(&format!("{} has no {b} … {e} markers", path.display()))
    };
    let new = format!("{}{b}\n{table}{}", &text[..i], &text[j..]);
    std::fs::write(path, new).unwrap_or_else(|e| fail(&format!("{e}")));
}
