//! The nightly `std::alloc::Allocator` front end of rdma-pool.
//!
//! This member crate is where code that needs the unstable `allocator_api` feature lives, so the
//! stable `rdma-pool` crate never depends on nightly. CI builds it with `RUSTC_BOOTSTRAP=1`.
//! The `Allocator` implementation over the pool arrives with the allocator issue; until then the
//! crate re-exports the stable crate so dependants can already name it.
#![warn(missing_docs)]

pub use rdma_pool;
