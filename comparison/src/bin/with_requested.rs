//! The workloads with the system allocator behind a counter: the bytes each one asks for at
//! its peak (`requested_kib=` in the notes), the floor any allocator must hold. The runner runs
//! it once per workload for the table's `requested` column; its time is not compared.
#[global_allocator]
static A: rdma_pool_comparison::Counting<std::alloc::System> =
    rdma_pool_comparison::Counting::new(std::alloc::System);

fn main() {
    rdma_pool_comparison::main("requested", || {
        Some(format!("requested_kib={}", A.peak().div_ceil(1024)))
    });
}
