//! The environment overrides, read by a pool in a child process of this test binary.

use crate::common::serial;
use rdma_pool::GlobalPool;
use rdma_pool::arena::Hugepages;
use rdma_pool::global::{GlobalConfig, Registration};
use rdma_pool::nic::{self, Nic};

fn soft() -> nic::Result<Nic> {
    Ok(Nic::soft())
}

static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
    registration: Registration::Pinned,
    hugepages: Hugepages::Prefer,
    reserve: 1 << 30,
    chunk: 1 << 24,
    open: Some(soft),
    ..GlobalConfig::DEFAULT
});

#[test]
fn environment_overrides_are_applied_and_unknown_values_counted() {
    let _env = serial();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "env::child_sees_the_overrides",
            "--include-ignored",
            "--nocapture",
        ])
        .env("RDMA_POOL_CHILD", "1")
        .env("RDMA_POOL_HUGEPAGES", "off")
        .env("RDMA_POOL_REGISTRATION", "auto")
        .env("RDMA_POOL_NIC", "soft")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "env::child_sees_the_overrides",
            "--include-ignored",
            "--nocapture",
        ])
        .env("RDMA_POOL_CHILD", "2")
        .env("RDMA_POOL_HUGEPAGES", "sometimes")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run in a child process by environment_overrides_are_applied_and_unknown_values_counted"]
fn child_sees_the_overrides() {
    let mode = std::env::var("RDMA_POOL_CHILD").expect("only run by the parent test");
    P.init().unwrap();
    let cfg = P.effective_config().unwrap();
    let stats = P.stats();
    match mode.as_str() {
        "1" => {
            assert_eq!(cfg.hugepages, Hugepages::Off);
            assert_eq!(cfg.registration, Registration::Auto);
            assert_eq!(stats.pool.unwrap().arena.slabs_hugetlb, 0);
        }
        _ => {
            // Unknown value: ignored (the constructor's setting stays) and counted.
            assert_eq!(cfg.hugepages, Hugepages::Prefer);
            assert!(stats.env_ignored >= 1, "{stats:?}");
        }
    }
    assert_eq!(P.config().registration, Registration::Pinned);
}
