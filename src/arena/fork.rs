//! What the arena does about `fork()`.
//!
//! Contract: where the kernel copies pinned pages for a child (`ibv_is_fork_initialized()` ==
//! `IBV_FORK_UNNEEDED`) the arena applies nothing and a child keeps an ordinary private copy of
//! the heap. Otherwise every chunk is `MADV_DONTFORK` when it is mapped — per chunk, never per
//! allocation — so a child has no arena memory at all: it may only `exec` (or `_exit`), and a
//! child that touches arena memory faults.
//!
//! A fork while other threads are inside the pool (holding its locks, growing, purging) is the
//! business of `atfork.rs`: the fork waits for them to leave.

use crate::nic::ForkStatus;

/// The arena's answer to `fork()`, chosen once from the NIC's [`ForkStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ForkPolicy {
    /// The kernel copies pinned pages at fork: children keep a copy of the heap.
    #[default]
    KernelCopies,
    /// Chunks are `MADV_DONTFORK`: a child sees no arena memory and may only `exec`.
    DontFork,
}

impl ForkPolicy {
    pub(crate) fn for_status(status: ForkStatus) -> ForkPolicy {
        match status {
            ForkStatus::Unneeded => ForkPolicy::KernelCopies,
            ForkStatus::Disabled | ForkStatus::Enabled => ForkPolicy::DontFork,
        }
    }
}
