//! The workloads with mimalloc as global allocator.
#[global_allocator]
static A: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    rdma_pool_comparison::main("mimalloc", || None);
}
