//! The environment overrides, read by a pool in a child process of this test binary.

use crate::common::serial;
use rdma_pool::GlobalPool;
use rdma_pool::arena::{Hugepages, NumaPlacement, NumaPolicy};
use rdma_pool::global::{GlobalConfig, Registration};
use rdma_pool::nic::{self, Nic};

fn soft() -> nic::Result<Nic> {
    Ok(Nic::soft())
}

static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
    arena: rdma_pool::arena::ArenaConfig {
        registration: Registration::Pinned,
        hugepages: Hugepages::Prefer,
        reserve: 1 << 30,
        chunk: 1 << 24,
        ..GlobalConfig::DEFAULT.arena
    },
    open: Some(soft),
    ..GlobalConfig::DEFAULT
});

/// Run this very test in a child process with `env`, in child mode.
fn child(env: &[(&str, &str)]) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "env::environment_overrides_are_applied_and_unknown_values_counted",
        "--nocapture",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
}

/// In the parent: run the child twice, with understood and with unknown values. In a child
/// (`RDMA_POOL_CHILD` set): check what its pool made of its environment.
#[test]
fn environment_overrides_are_applied_and_unknown_values_counted() {
    let Ok(mode) = std::env::var("RDMA_POOL_CHILD") else {
        let _env = serial();
        child(&[
            ("RDMA_POOL_CHILD", "1"),
            ("RDMA_POOL_HUGEPAGES", "off"),
            ("RDMA_POOL_REGISTRATION", "auto"),
            ("RDMA_POOL_NIC", "soft"),
            ("RDMA_POOL_NUMA", "0"),
            ("RDMA_POOL_SHARED_BYTES", "0"),
        ]);
        child(&[
            ("RDMA_POOL_CHILD", "2"),
            ("RDMA_POOL_HUGEPAGES", "sometimes"),
            ("RDMA_POOL_NUMA", "nearby"),
            ("RDMA_POOL_SHARED_BYTES", "-1"),
        ]);
        return;
    };
    P.init().unwrap();
    let cfg = P.effective_config().unwrap();
    let stats = P.stats();
    match mode.as_str() {
        "1" => {
            assert_eq!(cfg.arena.hugepages, Hugepages::Off);
            assert_eq!(cfg.arena.registration, Registration::Auto);
            assert_eq!(stats.pool.unwrap().arena.slabs_hugetlb, 0);
            assert_eq!(cfg.arena.numa, NumaPolicy::Node(0));
            assert_eq!(cfg.arena.shared_bytes, 0);
            assert_eq!(stats.pool.unwrap().arena.numa, NumaPlacement::Node(0));
            let layout = std::alloc::Layout::from_size_align(100, 8).unwrap();
            // SAFETY: a non-zero layout; the block is freed below with it.
            let p = unsafe { std::alloc::GlobalAlloc::alloc(&P, layout) };
            assert!(P.keys_of(p).is_some());
            assert_eq!(rdma_pool::arena::numa::policy_of(p).unwrap().1, Some(0));
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::GlobalAlloc::dealloc(&P, p, layout) };
        }
        _ => {
            // Unknown value: ignored (the constructor's setting stays) and counted.
            assert_eq!(cfg.arena.hugepages, Hugepages::Prefer);
            assert_eq!(cfg.arena.numa, NumaPolicy::Any);
            assert_eq!(
                cfg.arena.shared_bytes,
                GlobalConfig::DEFAULT.arena.shared_bytes
            );
            assert!(stats.env_ignored >= 3, "{stats:?}");
        }
    }
    // Every pool takes the same overrides, whatever configuration it was given.
    let pd = Nic::soft().alloc_pd().unwrap();
    let own = rdma_pool::arena::ArenaConfig {
        reserve: 1 << 30,
        chunk: 1 << 24,
        hugepages: Hugepages::Prefer,
        ..Default::default()
    };
    let pool = rdma_pool::Pool::with_config(&pd, own).unwrap();
    let p = pool.alloc(std::alloc::Layout::new::<[u8; 100]>());
    let stats = pool.stats();
    if mode == "1" {
        assert_eq!(stats.alloc.arena.numa, NumaPlacement::Node(0));
        assert_eq!(
            stats.alloc.arena.slabs_hugetlb, 0,
            "RDMA_POOL_HUGEPAGES=off"
        );
        assert_eq!(stats.alloc.env_ignored, 0);
    } else {
        assert_eq!(stats.alloc.arena.numa, NumaPlacement::Unbound);
        assert_eq!(stats.alloc.env_ignored, 3, "{stats:?}");
    }
    // SAFETY: allocated above.
    unsafe { pool.free(p) };
    assert_eq!(P.config().arena.registration, Registration::Pinned);
}

/// `RDMA_POOL_NIC` naming a device that is not there (or anything unknown): the error names
/// the variable, its value and the device, and a `GlobalPool` opening its NIC from the
/// environment reports it as its `init_error` (a child process: the variable is read once).
#[test]
fn a_missing_device_in_rdma_pool_nic_is_named_with_the_variable() {
    if std::env::var_os("RDMA_POOL_NIC_CHILD").is_none() {
        let _env = serial();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "env::a_missing_device_in_rdma_pool_nic_is_named_with_the_variable",
                "--nocapture",
            ])
            .env("RDMA_POOL_NIC_CHILD", "1")
            .env("RDMA_POOL_NIC", "mlx5_9")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let e = Nic::open_default().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, nic::Error::Env { var: "RDMA_POOL_NIC", value, source }
            if value == "mlx5_9" && matches!(**source, nic::Error::DeviceNotFound(ref d) if d == "mlx5_9")),
        "{e:?}"
    );
    assert!(
        text.contains("RDMA_POOL_NIC") && text.contains("mlx5_9"),
        "{text}"
    );
    static G: GlobalPool = GlobalPool::with_config(GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            reserve: 1 << 30,
            chunk: 1 << 24,
            hugepages: Hugepages::Off,
            ..GlobalConfig::DEFAULT.arena
        },
        ..GlobalConfig::DEFAULT
    });
    assert!(G.init().is_err());
    let why = G.init_error().map(|e| e.to_string()).unwrap_or_default();
    assert!(why.contains("RDMA_POOL_NIC=\"mlx5_9\""), "{why}");
}

/// Run test `name` of this binary in a child with `env`; its stdout and stderr.
fn run_child(name: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A pool that opens its NIC from `RDMA_POOL_NIC` (which names no device in these children).
static DEGRADED: GlobalPool = GlobalPool::with_config(GlobalConfig {
    arena: rdma_pool::arena::ArenaConfig {
        reserve: 1 << 30,
        chunk: 1 << 24,
        hugepages: Hugepages::Off,
        ..GlobalConfig::DEFAULT.arena
    },
    ..GlobalConfig::DEFAULT
});

/// Allocate and free through `DEGRADED` as `#[global_allocator]` would.
fn allocate_through_degraded(n: usize) {
    let layout = std::alloc::Layout::from_size_align(64, 8).unwrap();
    for _ in 0..n {
        // SAFETY: a non-zero layout; freed with it at once.
        unsafe {
            let p = std::alloc::GlobalAlloc::alloc(&DEGRADED, layout);
            assert!(!p.is_null());
            std::alloc::GlobalAlloc::dealloc(&DEGRADED, p, layout);
        }
    }
}

fn stderr_subscriber() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
}

const REPORT: &str = "the global pool degraded";

/// Why a pool degraded is counted per reason at the allocation, and logged once, by the next
/// method that is not an allocation — with the error naming `RDMA_POOL_NIC` and its value.
#[test]
fn a_degradation_is_counted_by_reason_and_logged_once_outside_the_allocation_path() {
    if std::env::var_os("RDMA_POOL_DEGRADE_CHILD").is_none() {
        let _env = serial();
        let (ok, out, err) = run_child(
            "env::a_degradation_is_counted_by_reason_and_logged_once_outside_the_allocation_path",
            &[
                ("RDMA_POOL_DEGRADE_CHILD", "1"),
                ("RDMA_POOL_NIC", "mlx5_9"),
            ],
        );
        assert!(ok && out.contains("1 passed"), "{out}\n{err}");
        assert_eq!(err.matches(REPORT).count(), 1, "{err}");
        let line = err.lines().find(|l| l.contains(REPORT)).unwrap();
        assert!(
            line.contains("InitFailed")
                && line.contains("RDMA_POOL_NIC")
                && line.contains("mlx5_9"),
            "{line}"
        );
        assert!(line.contains("allocations=3"), "{line}");
        return;
    }
    stderr_subscriber();
    allocate_through_degraded(3);
    // The allocations logged nothing themselves (the report comes from a method call).
    let s = DEGRADED.stats();
    assert_eq!(
        s.first_degradation,
        Some(rdma_pool::global::DegradeReason::InitFailed)
    );
    assert_eq!(s.degraded_by.init_failed, 3);
    assert_eq!(s.degraded_by.init_pending + s.degraded_by.pool_refused, 0);
    assert_eq!(
        s.degraded_by.init_failed,
        s.degraded_allocations + s.failed_allocations
    );
    // Again: logged once only.
    let _ = DEGRADED.stats();
    let _ = DEGRADED.init_error();
}

/// A program that never asks: the report comes at exit.
#[test]
fn a_degradation_nobody_asked_about_is_logged_at_exit() {
    if std::env::var_os("RDMA_POOL_DEGRADE_CHILD").is_none() {
        let _env = serial();
        let (ok, out, err) = run_child(
            "env::a_degradation_nobody_asked_about_is_logged_at_exit",
            &[
                ("RDMA_POOL_DEGRADE_CHILD", "1"),
                ("RDMA_POOL_NIC", "mlx5_9"),
            ],
        );
        assert!(ok && out.contains("1 passed"), "{out}\n{err}");
        assert_eq!(err.matches(REPORT).count(), 1, "{err}");
        assert!(err.contains("mlx5_9"), "{err}");
        // The report came after the test harness printed its result.
        assert!(!out.contains(REPORT));
        return;
    }
    stderr_subscriber();
    allocate_through_degraded(2);
}
