//! The workloads with rdma-pool's `GlobalPool` as global allocator, on the soft NIC (without
//! a memlock limit: the comparison is about the allocator, not the limit a deployment sets).
use rdma_pool::global::GlobalConfig;
use rdma_pool::nic::Nic;
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};

#[global_allocator]
static A: rdma_pool::GlobalPool = rdma_pool::GlobalPool::with_config(GlobalConfig {
    open: Some(soft_nic),
    ..GlobalConfig::DEFAULT
});

fn soft_nic() -> rdma_pool::nic::Result<Nic> {
    Ok(Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    }))
}

fn main() {
    rdma_pool_comparison::main("rdma_pool", || {
        let s = rdma_pool::stats()?;
        let pool = s.pool.as_ref()?;
        let soft = A.nic().ok().and_then(|n| n.as_soft());
        let (pinned, pinned_peak) =
            soft.map_or((0, 0), |n| (n.pinned_bytes(), n.pinned_peak_bytes()));
        Some(format!(
            "mode={:?} degraded={} committed_mib={} hugetlb_slabs={} thp_slabs={} small_slabs={} \
             purged_mib={} pinned_kib={} pinned_peak_kib={}",
            pool.arena.mode,
            s.degraded_allocations,
            pool.arena.committed_bytes >> 20,
            pool.arena.slabs_hugetlb,
            pool.arena.slabs_thp,
            pool.arena.slabs_small,
            pool.arena.purged_bytes >> 20,
            pinned >> 10,
            pinned_peak >> 10
        ))
    });
}
