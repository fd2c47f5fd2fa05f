//! Why a grant could not be issued, bound or revoked.

use crate::nic::{self, Access, QpState, WcStatus};

/// A grant's error. Nothing leaks on any of them: windows, regions and ledger records taken
/// for a refused grant are returned before the error is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The pool cannot grant: the global pool could not initialise (see
    /// `GlobalPool::init_error`), or the device reported a fatal event
    /// (`Arena::device_dead`).
    #[error("the pool cannot grant: not initialised, or its device is dead")]
    Unavailable,
    /// The range is empty.
    #[error("a grant needs at least one byte")]
    Empty,
    /// The range does not lie in this pool's memory.
    #[error("the range is not in this pool's memory")]
    OutsidePool,
    /// No live block of the pool holds the range's first byte (never allocated, or freed).
    #[error("no live block of the pool holds {addr:#x}")]
    NotAllocated {
        /// The range's first byte.
        addr: usize,
    },
    /// The range runs past the end of its block (so it would also span another
    /// block, or a registration boundary).
    #[error("the range runs {excess} bytes past the end of its block")]
    AcrossBlocks {
        /// Bytes beyond the block.
        excess: usize,
    },
    /// The block is served unregistered (the pool degraded; see the arena's stats).
    #[error("the range is not registered memory (the pool degraded)")]
    Unregistered,
    /// The QP belongs to another PD or device than the pool.
    #[error("the QP belongs to another PD or device than the pool")]
    ForeignQp,
    /// The QP cannot post work requests (not connected, or in the error state).
    #[error("the QP is {0:?}, not ready to send")]
    QpNotReady(QpState),
    /// Rights a grant cannot carry: no remote right, a local right or `ZERO_BASED`.
    #[error("a grant carries remote rights only, at least one; asked for {0:?}")]
    Rights(Access),
    /// The device (or a known defect of it) rules out the kind of grant asked for.
    #[error("unsupported grant: {0}")]
    Unsupported(&'static str),
    /// A bound on grants would be exceeded: the grant is refused (never issued) and counted
    /// ([`GrantStats::refused`](super::GrantStats::refused)). Some bounds lift as grants are
    /// revoked or as the key horizon passes; `hint` says which setting changes it where a
    /// configuration can keep it refusing for good.
    #[error("grant limit {what} = {max} would be exceeded: {hint}")]
    Limit {
        /// Which bound (`region grants`, `region grant bytes`, `open grants`, `grant entries`,
        /// `max_mw`, `key book`, `retired regions`).
        what: &'static str,
        /// Its value.
        max: u64,
        /// What lifts it, and which setting changes it.
        hint: &'static str,
    },
    /// The window's bind completed with an error: the key never worked.
    #[error("the bind completed with {0:?}")]
    BindFailed(WcStatus),
    /// `revoke` was called on a grant already revoked.
    #[error("the grant was already revoked")]
    Revoked,
    /// No completion ended the wait in time; the grant stays revoking (its memory quarantined)
    /// until a poll of its QP's send CQ delivers it.
    #[error(
        "no completion for the grant within {0:?}: its completions arrive on the send CQ of its \
         QP and reach the pool only through this crate's polls of that CQ (Cq::poll, \
         Grant::wait) or, for a CQ polled elsewhere, Pool::on_completion"
    )]
    Timeout(std::time::Duration),
    /// A verb failed.
    #[error(transparent)]
    Nic(#[from] nic::Error),
}
