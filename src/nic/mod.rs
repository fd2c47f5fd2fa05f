//! The NIC boundary: owned RAII handles over one narrow [`backend`](self) trait with two
//! implementations, the in-process [`soft`] NIC and real libibverbs (`verbs`, feature `verbs`).
//!
//! Contract:
//! - every handle owns an `Arc` of its parent's inner (`Mr → Pd → Nic`, `Qp → Cq`), so a parent
//!   is destroyed only after its last child, and every handle tears down in `Drop` without
//!   panicking (a failure there is logged with `tracing`);
//! - argument errors that lose nothing are caught here, before the backend, and reported as
//!   [`Error::InvalidArgument`] / [`ReregErrorKind::Input`]; device limits (`max_mr_size`,
//!   `max_sge`, the `advise_mr` list bound [`MAX_ADVISE_SGES`]) are checked here too and
//!   reported as [`Error::Limit`], as the backends report `max_mr` / `max_mw` (rxe's `EINVAL`
//!   and mlx5's `ENOMEM` alike);
//! - a region whose re-registration ended in `ERR_CMD` is *poisoned*: it can only be dropped.
//!
//! Invariant: `mr.lkey()/rkey()/addr()/len()` always equal what the backend last reported for
//! that region.
//!
//! Public surface: the handles, the plain data of `types/`, the errors, [`quirks`], the soft
//! NIC's configuration, counters and fault injection ([`soft`]), and of the verbs backend only
//! [`VerbsNic`] (through [`Nic::as_verbs`]), [`device_names`], [`mlx5_load_error`] and the raw
//! attach points ([`Nic::from_raw_context`], [`Nic::raw_context`], [`Pd::from_raw`]). The
//! backend trait and rdma-sys types stay inside the crate.
//!
//! # Allocation
//! A future arena registers memory from inside `GlobalAlloc`, so it must know which calls may
//! allocate (and so re-enter it) and guard them with a re-entrancy flag. The calls it makes
//! there, and what they allocate:
//! - [`Pd::reg_mr`]: the `Arc` of the new [`Mr`] on every backend. Verbs: on rxe only, an ODP
//!   region's lkey goes into the ODP guard's `HashSet` (which grows now and then); the kernel
//!   verb itself allocates only in the kernel and in the provider (`malloc` of the `ibv_mr`).
//!   Soft NIC: an ODP region's residency bitmaps (a bit per page); for a pinned region, the
//!   text of `/proc/self/maps` (its rights check) and the identities of its pages (8 bytes a
//!   page), and in the mlx5 re-registration model the text of `/proc/self/smaps`.
//! - [`Mr::rereg`]: nothing in this layer. Verbs: nothing (the provider may). Soft NIC: as
//!   `reg_mr` for the new translation.
//! - [`Mr::dereg`] and dropping a [`Mr`]: frees only (the provider frees the `ibv_mr`; the soft
//!   NIC returns the key to a free list whose capacity is reserved up front).
//! - [`Pd::advise_mr`]: verbs converts up to 16 scatter/gather entries on the stack and
//!   allocates a list for more; the soft NIC grows an implicit ODP region's page map and lists
//!   the pages it faults in.
//! - Failures on any backend build an [`Error`]: fixed texts are `&'static str` and allocate
//!   nothing, but [`Error::DeviceNotFound`], the rxe ODP guard's `Unsupported` detail and an
//!   `io::Error` with a custom message do; a failure in `Drop` is logged with `tracing`, whose
//!   subscriber may allocate.
//!
//! Setup calls (opening a NIC, PDs, CQs, QPs) allocate freely and are not made from inside the
//! allocator; they hold the one-time work: [`Nic::open_default`] reads `RDMA_POOL_NIC` once per
//! process, and a soft NIC starts its prefetch thread and reads `CAP_IPC_LOCK` when created.
//!
//! # Files
//! - handles: `device.rs` [`Nic`] (and [`device_names`], [`mlx5_load_error`]), `pd.rs` [`Pd`],
//!   `mr.rs` [`Mr`] and [`DeregError`], `mw.rs` [`Mw`], `cq.rs` [`Cq`], `qp.rs` [`Qp`] and its
//!   connection, `umem.rs` [`Umem`], `srq.rs` [`Srq`] and [`RecvRing`], `channel.rs`
//!   [`CompChannel`], `async_cq.rs` `AsyncCq` (feature `tokio`), `foreign.rs` adopted objects;
//! - posting: `qp_post.rs` the raw post verbs, `post.rs` batches; owned posts: `owned.rs` (the
//!   contract, the buffers), `posted.rs` (the handles), `inflight.rs` (a CQ's slots and the
//!   routing of its completions), `owned_post.rs` (the posts);
//! - data: `types/` the plain data, `error.rs` the errors, `buffer.rs` and `registered.rs`
//!   memory, [`quirks`] what devices get wrong;
//! - backends: `backend.rs` the trait, [`soft`] and `verbs/` its two implementations.

/// Implement `Debug` for a handle as a struct named after it with the listed fields.
macro_rules! debug_fields {
    ($ty:ident, |$s:ident| { $($name:literal: $value:expr),* $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $s = self;
                f.debug_struct(stringify!($ty))$(.field($name, &$value))*.finish()
            }
        }
    };
}

#[cfg(feature = "tokio")]
mod async_cq;
mod backend;
mod buffer;
mod channel;
mod cq;
mod device;
mod error;
mod foreign;
mod inflight;
mod mr;
mod mw;
mod owned;
mod owned_post;
mod pd;
mod post;
mod posted;
mod qp;
mod qp_post;
pub mod quirks;
mod registered;
pub mod soft;
mod srq;
mod types;
mod umem;
#[cfg(feature = "verbs")]
mod verbs;

#[cfg(feature = "tokio")]
pub use async_cq::AsyncCq;
pub use buffer::{Buffer, huge_page_size};
pub use channel::CompChannel;
pub use cq::Cq;
pub use device::{Nic, device_names, mlx5_load_error};
pub use error::{Error, ReregError, ReregErrorKind, Result, Verb};
pub use mr::{DeregError, Mr};
pub use mw::Mw;
pub(crate) use owned::{GRANT_TAG, set_grant_sink};
pub use owned::{NicBuf, NicBufMut, is_reserved_wr_id};
pub use pd::Pd;
pub use post::BatchError;
pub use posted::{Done, PostError, Posted, WaitError};
pub use qp::Qp;
pub use registered::Registered;
pub use srq::{RecvRing, Srq};
pub use types::*;
pub use umem::Umem;
#[cfg(feature = "verbs")]
pub use verbs::VerbsNic;
#[cfg(feature = "verbs")]
pub(crate) use verbs::set_nonblocking;

use backend::RawSendOp;

/// Finish a handle's destroy verb in `Drop`: never panics; a failure is logged with `tracing`
/// and the object is leaked (the device still holds it).
fn leak_on_error(object: &'static str, handle: u64, result: Result<()>) {
    if let Err(e) = result {
        tracing::error!(error = %e, object, handle, "destroy failed in drop; the object is leaked");
    }
}
