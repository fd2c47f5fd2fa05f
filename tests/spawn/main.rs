//! `std::process::Command` from a threaded program whose global allocator is the default
//! `GlobalPool`: every std spawn path (posix_spawn; fork + exec when the child's `PATH` is set;
//! fork + `pre_exec` + exec) while other threads allocate, free and write small, medium and
//! large blocks. The parent must never die (the default heap used to be hugetlb memory, and the
//! copy-on-write of a hugetlb page after fork killed the parent with SIGBUS once the hugetlb
//! pool was dry), every child must run, and the parent's data stays intact.
//!
//! Run with hugetlb pages reserved (`scripts/test.sh` reserves 8 as root) to meet the old
//! failure; in the QEMU guest too.

#[path = "../common/mod.rs"]
mod common;

use rdma_pool::GlobalPool;
use rdma_pool::global::GlobalConfig;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

#[global_allocator]
static A: GlobalPool = GlobalPool::with_config(GlobalConfig {
    open: Some(common::open_pool_nic),
    ..GlobalConfig::DEFAULT
});

/// Allocate, fill, check and free blocks of every size band until `stop`; the bytes checked.
fn churn(seed: u64, stop: &AtomicBool) -> u64 {
    let sizes = [24usize, 200, 3000, 40 << 10, 100 << 10, 700 << 10, 3 << 20];
    let mut ring: Vec<Vec<u8>> = Vec::new();
    let mut checked = 0u64;
    let mut i = seed as usize;
    while !stop.load(Relaxed) {
        let len = sizes[i % sizes.len()];
        let fill = (i as u8).wrapping_mul(13) ^ seed as u8;
        ring.push(vec![fill; len]);
        if ring.len() > 24 {
            let v = ring.remove(i % ring.len());
            let want = v[0];
            assert!(
                v.iter().all(|&b| b == want),
                "a block changed under the parent"
            );
            checked += v.len() as u64;
        }
        i += 1;
    }
    checked
}

fn run(cmd: &mut Command, what: &str) {
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{what}: spawn failed: {e}"));
    assert!(
        status.success(),
        "{what}: the child did not run: {status:?}"
    );
}

#[test]
fn a_threaded_program_spawns_on_every_std_path_and_never_dies() {
    let _one = common::serial();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
    let rounds: usize = std::env::var("SPAWN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let stop = AtomicBool::new(false);
    let spawned = AtomicU64::new(0);
    let (checked, slowest) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..3)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || churn(t + 1, stop))
            })
            .collect();
        let mut slowest = 0f64;
        for r in 0..rounds {
            let t = Instant::now();
            // posix_spawn (std's default when nothing forbids it).
            run(Command::new("sh").args(["-c", "exit 0"]), "posix_spawn");
            // fork + exec: std cannot pass a changed PATH to posix_spawnp.
            run(
                Command::new("sh").args(["-c", "exit 0"]).env("PATH", &path),
                "fork with env",
            );
            // fork + pre_exec + exec.
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "exit 0"]);
            // SAFETY: the closure only returns (async-signal-safe).
            unsafe { cmd.pre_exec(|| Ok(())) };
            run(&mut cmd, "fork with pre_exec");
            slowest = slowest.max(t.elapsed().as_secs_f64() / 3.0);
            spawned.fetch_add(3, Relaxed);
            // The heap grows under the spawning: new slabs between the forks.
            let keep: Vec<Vec<u8>> = (0..4).map(|k| vec![r as u8; (k + 1) << 20]).collect();
            assert!(keep.iter().all(|v| v.iter().all(|&b| b == r as u8)));
        }
        stop.store(true, Relaxed);
        let checked: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        (checked, slowest)
    });
    let s = rdma_pool::stats().unwrap();
    let pool = s.pool.as_ref().unwrap();
    eprintln!(
        "spawned {} children, checked {} MiB, slowest spawn {:.1} ms; slabs: hugetlb {} thp {} \
         small {}; forks {}",
        spawned.load(Relaxed),
        checked >> 20,
        slowest * 1e3,
        pool.arena.slabs_hugetlb,
        pool.arena.slabs_thp,
        pool.arena.slabs_small,
        rdma_pool::arena::fork_stats().forks
    );
    assert_eq!(spawned.load(Relaxed), 3 * rounds as u64);
    assert_eq!(s.failed_allocations, 0);
    assert!(A.validate());
}
