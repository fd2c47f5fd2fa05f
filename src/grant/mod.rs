//! Grants: a peer's key to exactly one buffer, for exactly the rights it needs, taken back
//! without a network use-after-free.
//!
//! ```text
//! let grant = pool.grant_owned(buf, &qp, Access::REMOTE_WRITE)?; // posts BIND_MW on qp
//! send(grant.wire().to_bytes());                                 // addr, len, rkey
//! ...
//! let buf = grant.revoke(&send_cq, |other| handle(other))?;      // LOCAL_INV, waited for
//! let read_only = pool.grant(&buf, &qp)?;                        // a borrow: read-only
//! ```
//!
//! Contract:
//! - **Kinds** ([`GrantKind`]). `Type2` (what `Auto` and [`Pool::grant`](crate::Pool::grant) make): a type 2
//!   window bound by a BIND_MW work request on the peer's QP, so its key works through that QP
//!   only. `Type1`: a type 1 window (`ibv_bind_mw`), usable from any QP of the PD. `Region`: a
//!   region of its own over exactly the range (usable from any QP of the PD). The PD-wide kinds
//!   are opt-in: another client of the PD that guesses a key (a driver-chosen index, often
//!   sequential, and an 8-bit variant) uses it through its own connection. Isolation with them
//!   takes a PD per peer with the arena attached to it ([`Pool::attach`](crate::alloc::Core::attach)). `Auto` refuses
//!   ([`GrantError::Unsupported`]) where the device has no type 2 windows or the range is longer
//!   than a window may be (2 GiB on mlx5). A window grants no more than the region under it
//!   (C10-74): the pool's regions carry `LOCAL_WRITE | MW_BIND` and no remote right.
//! - **Exactly one buffer on every device.** Where a window's bounds are not enforced (kernel
//!   rxe, `Quirk::MwBoundsNotEnforced`) the window is bound over a region of its own covering
//!   exactly the range ("dedicated", with no remote right: the window's key is the grant's).
//!   Dedicated regions pin the pages again and are charged against memlock again: they are
//!   counted ([`GrantStats`]) and bounded ([`GrantLimits`]).
//! - **Completions.** Binds and invalidations are work requests on the caller's QP; their
//!   completions come on its send CQ with `wr_id`s the pool tags ([`is_pool_wr_id`]), a range
//!   raw posts refuse. [`Cq::poll`](crate::nic::Cq::poll) hands them to their pool and never
//!   to the application, so no completion of a grant can be forged in safe code; only a CQ the
//!   application polls with `ibv_poll_cq` itself needs the `unsafe`
//!   [`Pool::on_completion`](crate::Pool::on_completion). [`Grant::revoke`] polls the
//!   CQ and hands the application's completions to the caller's closure. A grant uses one
//!   send-queue slot for its bind and one for its invalidation while they are in flight: size
//!   `max_send_wr` for them.
//! - **Revocation.** Type 2: LOCAL_INV on the QP; type 1: a zero-length bind (always with a
//!   region: rxe's provider crashes on NULL); region: retirement (`retire.rs`). A QP that
//!   cannot post (error state, full queue) or whose invalidation fails has its window
//!   *deallocated*, which kills the key too: a grant is never left live. A peer's
//!   SEND_WITH_INV, where the device reports it (`Completion::invalidated_rkey`), counts as the
//!   invalidation. A window that cannot be deallocated, or a region that can be neither
//!   retired nor deregistered, keeps its grant open and its memory parked (fail closed;
//!   counted as stuck), and the next event on the grant tries again.
//! - **No key comes back** (`keybook.rs`, `windows.rs`, `retire.rs`). Every key a grant gives a
//!   peer is remembered in the process's key book (a window holds its index's entry from its
//!   allocation and publishes its keys when it goes; a region grant's key is noted before the
//!   grant returns), and no grant of any pool hands out a key the book holds: a revoked or stale key is refused until at least
//!   [`GrantLimits::key_horizon`] later grants of the process (2^20 by default; the horizon
//!   in force when it died), across pools dropped and PDs destroyed, on every device variant.
//!   What advances the horizon: grants *issued* by every pool of the process, and grants a
//!   full book refused (so a full book drains), not other attempts, and not time. The book
//!   fails closed: a full book (2^18 entries process-wide by default, about 80 bytes each;
//!   nothing per pool) refuses the grant ([`GrantError::Limit`] `key book`), never forgets an
//!   entry before its bound. Type 2 variants follow a random order per window and skip the
//!   book's; type 1 variants are the driver's next (a window that would step onto a stale one
//!   is retired); a fresh region grant whose key is stale is spoiled and another registered.
//!   Indices also stay held where that is cheap: windows whose keys went out stay allocated
//!   until the horizon while the pool lives, and revoked region grants are held by their
//!   region (rereg onto a dummy page) or a placeholder region, at most a quarter of `max_mr`
//!   per device in the process (`retire.rs`). On a device with an mkey cache
//!   ([`Caps::mkey_cache`](crate::nic::Caps::mkey_cache): mlx5), where a deregistered region's
//!   key comes back with the next registration of its size, only holding keeps it dead: held
//!   regions outlive their pool, and region grants are refused (`retired regions`) rather
//!   than release one early. Every `Limit` names in its `hint` the setting that changes it;
//!   the ones that can refuse for long are a small `max_mw`, a device with too few windows or
//!   regions for the horizon (`fresh window keys`, `fresh region keys`), an mkey-cache device
//!   granting only regions, and a full key book. Keys given out by other processes are out of
//!   scope.
//! - **Memory of the bookkeeping.** Per process: the key book (at most 2^18 entries by
//!   default, about 80 bytes each: 21 MiB at most; `set_key_book_capacity` is a test hook),
//!   and the held region indices, by device: at most a quarter of `max_mr` per device (at
//!   most 2^16), each a region on one dummy page (on mkey-cache devices they include the held
//!   regions of dropped pools). Per pool: the ledger (2^16 records mapped from the kernel, touched as used), the
//!   grant entries (at most 2^16) and the windows (bounded by `max_mw`: a window holds 256
//!   bytes of variant order).
//! - **Quarantine** (`ledger.rs`): memory freed while a grant on it is open (live or
//!   revoking) is parked, neither reused nor purged, until the invalidation completed. The free
//!   path checks one per-granule counter with a relaxed load. [`Grant`] borrows its buffer, so
//!   safe code cannot free granted memory; only a dropped grant still revoking, a leaked one
//!   or a `GlobalAlloc` free meets the quarantine. `Drop` of a grant never blocks.
//! - **Borrow rules** (`handle.rs`): a grant on a borrow is read-only; write and atomic
//!   rights need a grant that owns its buffer ([`OwnedGrant`]), read meanwhile only by atomic
//!   copy; [`Pool::grant_with`](crate::Pool::grant_with), any rights on a borrow, is
//!   `unsafe`. No safe path leads to the CPU and the NIC racing on one byte.
//!
//! Invariant (checked by `Pool::validate`): `|active| == open ledger records + finished
//! grants whose handle is alive`, and the window cache's invariant.

mod error;
mod handle;
mod issue;
mod keybook;
mod ledger;
mod retire;
mod revoke;
#[cfg(feature = "tokio")]
mod wait_async;
pub(crate) use revoke::route;
mod windows;
mod wire;

pub use error::GrantError;
pub use handle::{Grant, GrantBuf, OwnedGrant, WAIT};
pub use wire::GrantWire;

use crate::alloc::{Core, Quarantine};
use crate::nic::{Mr, Qp, Rkey};
use crate::sys::atfork::{ForkGuard, ForkLock, ForkRwLock};
use ledger::Ledger;
use slab::Slab;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use windows::{Lent, Windows};

/// Which kind of key a grant is (see the module contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum GrantKind {
    /// Isolation: a type 2 window, the only kind bound to the peer's QP; refused
    /// ([`GrantError::Unsupported`]) on a device without type 2 windows and above 2 GiB.
    #[default]
    Auto,
    /// A type 2 window, usable through the granting QP only.
    Type2,
    /// A type 1 window, usable from *any QP of the PD*: another client of the PD that guesses
    /// the key (a driver-chosen index and the previous variant plus one) uses it through its
    /// own connection. Isolate with a PD per peer ([`Pool::attach`](crate::alloc::Core::attach)).
    Type1,
    /// A region of its own over exactly the range (up to `max_mr_size`), usable from *any QP
    /// of the PD*, with the guessing threat of `Type1`; revoked, it is retired (see the module
    /// contract).
    Region,
}

/// Bounds on dedicated regions (region grants, and windows over a region of their own where
/// window bounds are not enforced: each pins its pages again and is charged against
/// `RLIMIT_MEMLOCK` again), and how long a revoked key stays refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantLimits {
    /// Most dedicated regions at once.
    pub regions: u64,
    /// Most bytes under dedicated regions at once.
    pub region_bytes: u64,
    /// The key horizon: a revoked or stale key stays refused until at least this many later
    /// grants (of any kind, by any pool of the process) were issued; the key book keeps it,
    /// and the windows and regions whose keys were handed out stay allocated until then
    /// where that is cheap (see the module contract). A key's horizon is the one in force
    /// when it died. 2^20 by default; 0 gives every key back at once.
    pub key_horizon: u64,
}

impl Default for GrantLimits {
    fn default() -> Self {
        GrantLimits {
            regions: 4096,
            region_bytes: 1 << 30,
            key_horizon: 1 << 20,
        }
    }
}

/// What the pool's grants are doing, read without a lock (the quarantine figures under the
/// ledger's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GrantStats {
    /// Grants issued.
    pub issued: u64,
    /// ... of which type 2 windows.
    pub type2: u64,
    /// ... of which type 1 windows.
    pub type1: u64,
    /// ... of which regions.
    pub regions: u64,
    /// Grants whose key is dead (revocation completed).
    pub revoked: u64,
    /// Grants open: live, or revoking and not yet completed.
    pub open: u64,
    /// Revocations done by deallocating the window (QP in error, full queue, failed
    /// invalidation).
    pub revoked_by_dealloc: u64,
    /// Windows invalidated by the peer's SEND_WITH_INV.
    pub peer_invalidations: u64,
    /// Binds that completed with an error.
    pub failed_binds: u64,
    /// Revocations whose region refused deregistration: the grant stays open (its memory
    /// parked) and is retried on its next event.
    pub stuck_revocations: u64,
    /// Dedicated regions live, and the bytes under them.
    pub dedicated_regions: u64,
    /// Bytes under dedicated regions.
    pub dedicated_bytes: u64,
    /// Windows allocated (cached, lent or retired).
    pub windows: u64,
    /// Windows retired after using up their key variants (kept allocated).
    pub windows_retired: u64,
    /// Retired windows deallocated once the key horizon passed (see the module contract).
    pub windows_recycled: u64,
    /// Revoked region grants kept registered, without remote rights, until the key horizon
    /// passes (see the module contract).
    pub regions_retired: u64,
    /// Placeholder regions (on one dummy page, without remote rights) holding the index of a
    /// revoked region grant that was deregistered (no `rereg_mr`); with `regions_retired`, at
    /// most a quarter of `max_mr`.
    pub region_placeholders: u64,
    /// Grants refused by a [`GrantError::Limit`].
    pub refused: u64,
    /// Entries in the process's key book (one per device and key index whose keys a peer may
    /// still hold; see the module contract), process-wide.
    pub key_book_entries: u64,
    /// Its capacity, process-wide: beyond it grants are refused (`Limit`, `key book`).
    pub key_book_capacity: u64,
    /// The pool's binds and invalidations posted whose completions no poll delivered yet:
    /// send-queue slots (and CQ entries) the grants occupy.
    pub wrs_in_flight: u64,
    /// Freed blocks held in quarantine until their grant's revocation completes.
    pub quarantined_blocks: u64,
    /// Their bytes.
    pub quarantined_bytes: u64,
}

/// Where a grant's bind or invalidation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wr {
    None,
    InFlight,
    Done(crate::nic::WcStatus),
}

/// One grant's state in the pool (a `slab` entry, keyed by the `wr_id`).
struct Active {
    /// The PD of the grant's QP (a rail's, or the pool's own).
    pd: Option<crate::nic::Pd>,
    seq: u16,
    kind: GrantKind,
    window: Option<Lent>,
    /// Keys of the window this grant used (its bind, a type 1 unbind).
    keys: u16,
    /// The dedicated region, if any.
    region: Option<Mr>,
    qp: Option<Qp>,
    record: u32,
    /// First byte of the block (its granule counts the record).
    block: usize,
    rkey: Rkey,
    bind: Wr,
    inv: Wr,
    /// Revocation was asked for.
    revoking: bool,
    /// The key is dead and everything returned.
    done: bool,
    /// The handle was dropped: remove the entry once done.
    orphan: bool,
    /// The peer invalidated the window with SEND_WITH_INV.
    peer_invalidated: bool,
    /// The invalidation could not be posted behind a bind in flight (full send queue): post
    /// it when the bind completes.
    retry_inv: bool,
}

#[derive(Default)]
struct Counters {
    issued: AtomicU64,
    type2: AtomicU64,
    type1: AtomicU64,
    regions: AtomicU64,
    revoked: AtomicU64,
    by_dealloc: AtomicU64,
    peer_inv: AtomicU64,
    failed_binds: AtomicU64,
    dedicated: AtomicU64,
    dedicated_bytes: AtomicU64,
    in_flight: AtomicU64,
    stuck: AtomicU64,
    limit_regions: AtomicU64,
    limit_bytes: AtomicU64,
    limit_horizon: AtomicU64,
    refused: AtomicU64,
}

/// One pool's grant feature at work: its allocator core and its grants' state (what the
/// feature's code reaches, from a [`Pool`](crate::Pool) or from the completion router).
#[derive(Clone, Copy)]
pub(crate) struct GrantCtx<'p> {
    pub(crate) core: &'p Core,
    pub(crate) grants: &'p Grants,
}

impl std::ops::Deref for GrantCtx<'_> {
    type Target = Core;

    fn deref(&self) -> &Core {
        self.core
    }
}

/// A pool's grant state (kept by the [`Pool`](crate::Pool) facade beside its core).
pub(crate) struct Grants {
    /// Held (shared) while a grant is issued, so that a rail it uses is not detached under
    /// it; exclusively by `Pool::detach`.
    rails_gate: ForkRwLock<()>,
    active: ForkLock<Slab<Active>>,
    windows: ForkLock<Windows>,
    /// Revoked region grants' regions, kept until the horizon (`retire.rs`).
    retired: ForkLock<retire::Retired>,
    ledger: Ledger,
    counters: Counters,
    seq: AtomicU64,
    /// This pool's tag in its `wr_id`s.
    tag: u16,
}

/// Top 16 bits of every `wr_id` the pool posts ("RP").
const TAG: u64 = crate::nic::GRANT_TAG << 48;
const OP_BIND: u64 = 1;
const OP_INV: u64 = 2;

/// Set the capacity of the process's key book (entries, one per device and key index; see
/// the module contract) and return the previous one: a test hook, to fill it in a test.
/// Entries beyond a lower capacity are kept; grants needing a new entry are refused
/// ([`GrantError::Limit`], `key book`) until the book is below it.
///
/// # Examples
/// ```
/// let old = rdma_pool::grant::set_key_book_capacity(1 << 10);
/// assert_eq!(rdma_pool::grant::set_key_book_capacity(old), 1 << 10);
/// ```
#[doc(hidden)]
pub fn set_key_book_capacity(n: usize) -> usize {
    keybook::set_capacity(n)
}

/// True when `wr_id` is one the pool tags its binds and invalidations with (top 16 bits
/// `0x5250`): keep the application's own `wr_id`s out of that range.
///
/// # Examples
/// ```
/// assert!(!rdma_pool::grant::is_pool_wr_id(42));
/// ```
pub fn is_pool_wr_id(wr_id: u64) -> bool {
    wr_id >> 48 == TAG >> 48
}

/// `TAG (16 bits) | op (2) | pool tag (16) | slab key (16) | seq (14)`.
fn wr_id(op: u64, tag: u16, key: usize, seq: u16) -> u64 {
    TAG | op << 46 | (tag as u64) << 30 | ((key as u64) & 0xffff) << 14 | (seq as u64 & SEQ_MASK)
}

/// `(op, pool tag, key, seq)` of a tagged `wr_id`.
fn parse(wr_id: u64) -> Option<(u64, u16, usize, u16)> {
    is_pool_wr_id(wr_id).then_some((
        (wr_id >> 46) & 3,
        (wr_id >> 30) as u16,
        ((wr_id >> 14) & 0xffff) as usize,
        (wr_id & SEQ_MASK) as u16,
    ))
}

/// The sequence bits of a `wr_id`.
const SEQ_MASK: u64 = (1 << 14) - 1;

/// The pools' tags (a bit per tag, set while taken): no two live pools share one, so a pool
/// never takes another's completions for its own; a pool dropped while any of its work
/// requests was in flight never gives its tag back, so no later pool takes that request's
/// late completion for its own. Atomics, no allocation: pools are created inside the
/// allocator too.
static TAGS: [AtomicU64; 1 << 10] = [const { AtomicU64::new(0) }; 1 << 10];

/// Take a free tag of `tags`; `None` when all are taken.
fn take_tag(tags: &[AtomicU64]) -> Option<u16> {
    for (w, word) in tags.iter().enumerate() {
        let mut v = word.load(Relaxed);
        while v != u64::MAX {
            let bit = (!v).trailing_zeros();
            match word.compare_exchange_weak(v, v | 1 << bit, Relaxed, Relaxed) {
                Ok(_) => return Some((w * 64 + bit as usize) as u16),
                Err(now) => v = now,
            }
        }
    }
    None
}

/// Give `tag` back to `tags`.
fn give_tag(tags: &[AtomicU64], tag: u16) {
    tags[tag as usize / 64].fetch_and(!(1 << (tag % 64)), Relaxed);
}

/// The errno [`Grants::new`] reports when every tag is taken.
pub(crate) const NO_TAG: i32 = libc::EMFILE;

/// Most grant entries at once (the key field of a `wr_id`).
const MAX_ACTIVE: usize = 1 << 16;

fn lock<T>(m: &ForkLock<T>) -> ForkGuard<'_, T> {
    m.lock()
}

impl Drop for Grants {
    fn drop(&mut self) {
        // The windows go with the pool, and its held regions where the device has no mkey
        // cache: their indices go back to the device, their keys stay in the key book.
        let (now, horizon) = self.clock();
        lock(&self.windows).release_all();
        lock(&self.retired).bury(now, horizon);
        // A completion of this pool's may still come: the tag stays taken for good then.
        if self.counters.in_flight.load(Relaxed) == 0 {
            give_tag(&TAGS, self.tag);
        }
    }
}

impl Grants {
    /// The grants of a new pool; `Err(NO_TAG)` when every tag is taken, or the errno of a
    /// failed mapping.
    pub(crate) fn new() -> Result<Grants, i32> {
        let ledger = Ledger::new()?;
        let tag = take_tag(&TAGS).ok_or(NO_TAG)?;
        let g = Grants {
            rails_gate: ForkRwLock::new(()),
            active: ForkLock::new(Slab::new()),
            windows: ForkLock::new(Windows::default()),
            retired: ForkLock::new(retire::Retired::default()),
            ledger,
            counters: Counters::default(),
            seq: AtomicU64::new(0),
            tag,
        };
        g.set_limits(GrantLimits::default());
        Ok(g)
    }

    /// Run `f` (a detach of `pd`) with no grant being issued meanwhile, unless a grant whose
    /// QP is in `pd` is open: then [`GrantError::Unavailable`]-like refusal, `None`.
    pub(crate) fn without_grants_on<T>(
        &self,
        pd: &crate::nic::Pd,
        f: impl FnOnce() -> T,
    ) -> Option<T> {
        let _gate = self.rails_gate.write();
        let open = lock(&self.active)
            .iter()
            .any(|(_, a)| !a.done && a.pd.as_ref() == Some(pd));
        (!open).then(f)
    }

    pub(crate) fn set_limits(&self, l: GrantLimits) {
        self.counters.limit_regions.store(l.regions, Relaxed);
        self.counters.limit_bytes.store(l.region_bytes, Relaxed);
        self.counters.limit_horizon.store(l.key_horizon, Relaxed);
    }

    /// `(grants issued so far, the key horizon)`: the clock of key retirement.
    pub(super) fn clock(&self) -> (u64, u64) {
        (
            self.counters.issued.load(Relaxed),
            self.counters.limit_horizon.load(Relaxed),
        )
    }

    pub(crate) fn limits(&self) -> GrantLimits {
        GrantLimits {
            regions: self.counters.limit_regions.load(Relaxed),
            region_bytes: self.counters.limit_bytes.load(Relaxed),
            key_horizon: self.counters.limit_horizon.load(Relaxed),
        }
    }

    /// The free path's cold branch (see `ledger.rs`).
    pub(crate) fn park(&self, block: usize) -> bool {
        self.ledger.park(block)
    }

    /// The quarantine hook of these grants, for [`Core::set_quarantine`]: the free path parks
    /// a block a grant is open on (`ledger.rs`).
    pub(crate) fn quarantine(&self) -> Quarantine {
        /// # Safety
        /// `ctx` is the `Grants` that made the hook, alive.
        unsafe fn park(ctx: *const (), block: usize) -> bool {
            // SAFETY: the caller's contract.
            unsafe { &*(ctx as *const Grants) }.park(block)
        }
        Quarantine {
            ctx: self as *const Grants as *const (),
            park,
        }
    }

    /// The grants of `core`, from its quarantine hook (`None`: it has none).
    ///
    /// # Safety
    /// The only quarantine installed in `core` is a [`Grants::quarantine`] whose grants are
    /// alive while the result is used (they are, under the registry lock).
    pub(crate) unsafe fn of(core: &Core) -> Option<&Grants> {
        // SAFETY: the caller's contract: the context is a live `Grants`.
        unsafe { (core.quarantine_ctx() as *const Grants).as_ref() }
    }

    pub(crate) fn stats(&self) -> GrantStats {
        let c = &self.counters;
        let (open, parked, parked_bytes) = self.ledger.counts();
        let (windows, retired, recycled) = lock(&self.windows).counts();
        let (retired_regions, placeholders) = lock(&self.retired).counts();
        let book = keybook::counts();
        GrantStats {
            issued: c.issued.load(Relaxed),
            type2: c.type2.load(Relaxed),
            type1: c.type1.load(Relaxed),
            regions: c.regions.load(Relaxed),
            revoked: c.revoked.load(Relaxed),
            open: open as u64,
            revoked_by_dealloc: c.by_dealloc.load(Relaxed),
            peer_invalidations: c.peer_inv.load(Relaxed),
            failed_binds: c.failed_binds.load(Relaxed),
            stuck_revocations: c.stuck.load(Relaxed),
            dedicated_regions: c.dedicated.load(Relaxed),
            dedicated_bytes: c.dedicated_bytes.load(Relaxed),
            windows,
            windows_retired: retired,
            windows_recycled: recycled,
            regions_retired: retired_regions as u64,
            region_placeholders: placeholders as u64,
            refused: c.refused.load(Relaxed),
            key_book_entries: book.0 as u64,
            key_book_capacity: book.1 as u64,
            wrs_in_flight: c.in_flight.load(Relaxed),
            quarantined_blocks: parked as u64,
            quarantined_bytes: parked_bytes as u64,
        }
    }

    pub(crate) fn validate(&self) -> bool {
        let active = lock(&self.active);
        let (open, _, _) = self.ledger.counts();
        let unfinished = active.iter().filter(|(_, a)| !a.done).count();
        unfinished == open as usize
            && self.ledger.validate()
            && lock(&self.windows).validate()
            && keybook::validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_unique_until_given_back() {
        let tags: [AtomicU64; 1 << 10] = [const { AtomicU64::new(0) }; 1 << 10];
        let mut seen = vec![false; 1 << 16];
        for _ in 0..1 << 16 {
            let t = take_tag(&tags).expect("a free tag") as usize;
            assert!(!seen[t], "tag {t} handed out twice");
            seen[t] = true;
        }
        assert_eq!(take_tag(&tags), None, "all 65,536 are taken");
        give_tag(&tags, 4242);
        assert_eq!(take_tag(&tags), Some(4242));
        assert_eq!(take_tag(&tags), None);
    }
}
