//! The workloads with jemalloc (tikv-jemallocator) as global allocator.
#[global_allocator]
static A: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    rdma_pool_comparison::main("jemalloc", || None);
}
