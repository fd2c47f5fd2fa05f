//! Hardening, part 1: a model-based test of the whole pool (`model.rs`), a fault-injection
//! sweep over every NIC verb the pool calls (`faults.rs`), and a bad-input sweep over the
//! public API (`bad_input.rs`). On the soft NIC wherever they run (faults are injected there),
//! with the scenarios that make sense on a real device also on `rxe0`/`rxe1` in the QEMU guest
//! (`RDMA_POOL_TEST_NIC=verbs`).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod faults;
mod model;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::nic::*;
