pub use rdma_pool;
