//! The bottom layer: what the operating system gives the pool, and nothing of the pool's own.
//!
//! - `os.rs`: address-space reservations, fixed mappings, `madvise`, memory headroom, and the
//!   arrays and boxes the pool keeps outside the global allocator (`MmapArray`, `MmapBox`);
//!   the MMU-notifier hook a NIC model registers to hear of pages this crate drops.
//! - `atfork.rs`: the fork gate every lock of the pool goes through (`pthread_atfork`).
//! - `provision.rs`: the "this thread is calling the NIC" mark that keeps allocation from
//!   re-entering provisioning.
//! - `env.rs`: environment variables and numbers, read without allocating.
//! - `futex.rs`: waiting on a word until another thread changes it.
//! - `numa.rs`: NUMA system calls (`mbind`, `get_mempolicy`, `getcpu`, `move_pages`).
//!
//! Contract: this layer imports nothing else of the crate (`tests/layers.rs` checks it), and
//! nothing here allocates through the global allocator.

pub(crate) mod atfork;
pub(crate) mod env;
pub(crate) mod futex;
pub(crate) mod numa;
pub(crate) mod os;
pub mod provision;
