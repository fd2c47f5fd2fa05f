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
        Some(format!(
            "mode={:?} degraded={} committed_mib={} hugetlb_slabs={} thp_slabs={} small_slabs={} \
             purged_mib={}",
            pool.arena.mode,
            s.degraded_allocations,
            pool.arena.committed_bytes >> 20,
            pool.arena.slabs_hugetlb,
            pool.arena.slabs_thp,
            pool.arena.slabs_small,
            pool.arena.purged_bytes >> 20
        ))
    });
}
