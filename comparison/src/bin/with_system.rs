//! The workloads with the system allocator (glibc malloc).
fn main() {
    rdma_pool_comparison::main("system", || None);
}
