//! # rdma-pool
//!
//! A zero-copy RDMA buffer-pool allocator: every allocation is NIC-ready, registered with the
//! NIC up front, so any buffer can be posted as-is and a peer can be granted (and denied) remote
//! access to exactly one buffer.
//!
//! ```
//! #[global_allocator]
//! static A: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
//! # fn main() {}
//! ```
//! makes every heap allocation of a program registered memory: [`keys_of`] gives the keys of
//! any heap pointer, [`GlobalPool::pd`] the protection domain to create QPs in, [`stats`] what
//! the pool did (see [`global`]).
//!
//! The everyday types are at the crate root: [`Pool`], [`GlobalPool`], [`Nic`], [`Pd`],
//! [`Cq`], [`Qp`], [`Access`], [`Grant`], [`ArenaConfig`], [`GlobalConfig`]; their modules hold
//! the rest. The modules are layers, each built only on those below it (`tests/layers.rs`
//! checks the imports):
//!
//! 1. [`nic`], the one narrow boundary to the NIC, with two implementations — real libibverbs
//!    (feature `verbs`, on by default) and the in-process [`nic::soft`] NIC that enforces the
//!    verbs memory rules and is the embedded default when no RDMA device is present (below it,
//!    a private `sys` layer: mappings, the fork gate, NUMA calls);
//! 2. the [`arena`]: one reservation of hugepage slabs registered before anything is allocated
//!    from it, whose keys never change once handed out, with an O(1) lock-free
//!    [`arena::Arena::keys_of`], and its own prefetch of what it commits;
//! 3. the allocator core, [`alloc::Core`]: size classes, thread caches, pages, heaps, and the
//!    quarantine hook through which a feature keeps a freed block from reuse;
//! 4. the features: [`grant`] (a peer's key to one buffer), [`prefetch`] of hot ranges,
//!    [`queue_mem`] (DEVX queue memory);
//! 5. [`Pool`], the facade composing the core and the features (it dereferences to the core;
//!    [`Pool::stats`] is everything it counts, one [`Stats`] tree; [`PoolError`] why it could
//!    not be made);
//! 6. the front ends: [`GlobalPool`] ([`global`]) over a `Pool`, and `Vec::new_in(&pool)`
//!    through allocator-api2; `cm` (feature `verbs`) connects QPs through `rdma_cm`.
//!
//! # Examples
//! A pool on the soft NIC, and an RDMA WRITE of a vector of it: the vector travels with the
//! work request and comes back with the completion (no `unsafe`: the NIC can never touch it
//! after it is freed).
//! ```
//! use rdma_pool::{Access, Nic, Pool, QpCaps, WcStatus};
//! use std::time::Duration;
//!
//! let nic = Nic::soft();
//! let pd = nic.alloc_pd()?;
//! let cq = nic.create_cq(16)?;
//! let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, pd.create_qp(&cq, &cq, QpCaps::default())?);
//! a.connect(&b.endpoint()?)?;
//! b.connect(&a.endpoint()?)?;
//! let pool: &'static Pool = Box::leak(Box::new(Pool::new(&pd)?));
//!
//! let mut dst = rdma_pool::nic::Buffer::new(4096)?;
//! // SAFETY: `dst` outlives its region.
//! let dst_mr = unsafe { pd.reg_mr(dst.as_mut_ptr(), 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }?;
//! let src = allocator_api2::vec![in pool; 42u8; 20];
//! let done = a.post_write_owned(1, src, dst_mr.addr() as u64, dst_mr.rkey())?.wait(Duration::from_secs(5))?;
//! assert_eq!(done.completion.status, WcStatus::Success);
//! assert_eq!(&dst.as_slice()[..20], &done.buf[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//! The raw verbs layer: two in-process peers on the soft NIC, register, RDMA WRITE.
//! ```
//! use rdma_pool::nic::{Access, Nic, QpCaps, WcStatus};
//! use std::time::Duration;
//!
//! let nic = Nic::soft();
//! let pd = nic.alloc_pd()?;
//! let cq = nic.create_cq(16)?;
//! let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, pd.create_qp(&cq, &cq, QpCaps::default())?);
//! a.connect(&b.endpoint()?)?;
//! b.connect(&a.endpoint()?)?;
//!
//! let mut src = *b"hello, remote memory";
//! let mut dst = [0u8; 20];
//! let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
//! // SAFETY: both buffers outlive their regions.
//! let src_mr = unsafe { pd.reg_mr(src.as_mut_ptr(), src.len(), Access::LOCAL_WRITE) }?;
//! let dst_mr = unsafe { pd.reg_mr(dst.as_mut_ptr(), dst.len(), rw) }?;
//!
//! // SAFETY: `src` is neither freed nor written until the completion is polled below.
//! unsafe { a.post_write(1, &[src_mr.sge(0, 20)?], dst_mr.addr() as u64, dst_mr.rkey()) }?;
//! assert_eq!(cq.wait_one(Duration::from_secs(5))?.status, WcStatus::Success);
//! assert_eq!(&dst, b"hello, remote memory");
//! # Ok::<(), rdma_pool::nic::Error>(())
//! ```
#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod arena;
#[cfg(feature = "verbs")]
pub mod cm;
pub mod global;
pub mod grant;
pub mod nic;
mod pool;
pub mod prefetch;
pub mod queue_mem;
mod sys;

pub use global::{GlobalPool, keys_of, keys_of_on, stats};

// The everyday types, at the crate root: the front door. Their modules hold the rest.
pub use alloc::PoolStats;
pub use arena::{ArenaConfig, Hugepages, Keys, Registration};
pub use global::{GlobalConfig, GlobalStats};
pub use grant::{Grant, GrantError, GrantWire, OwnedGrant};
pub use nic::{Access, Cq, Done, Mr, Nic, Pd, Qp, QpCaps, Sge, WcStatus};
pub use pool::{Pool, PoolError, Stats};
