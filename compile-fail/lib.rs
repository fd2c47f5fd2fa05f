//! No code: this crate only holds `tests/compile_fail.rs` and the programs in `tests/ui/` that
//! must fail to compile against rdma-pool (see `Cargo.toml` for why they live apart).
