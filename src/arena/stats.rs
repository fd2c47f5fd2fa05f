//! The arena's counters: plain atomics bumped on the slow path, read as one `Copy` snapshot
//! without a lock; and the arena's introspection: [`Arena::stats`], what it was set up with
//! (its PD, rights, fork policy, purge delay), and [`Arena::validate`].
//!
//! Invariants (at quiescence): `committed_bytes == SLAB * (slabs_hugetlb + slabs_thp +
//! slabs_small)` (purged slabs are not committed); `registered_bytes + unregistered (live) <=
//! committed_bytes`; `resident_bytes + hugetlb_bytes == committed_bytes`.

use super::fork::ForkPolicy;
use super::numa::NumaPlacement;
use super::register::{Degradation, MemlockInfo, ModeReason, RegMode};
use super::{Arena, SLAB, SLAB_SHIFT};
use crate::nic::{Access, Pd};
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};

/// Nodes whose chunk bytes [`ArenaStats::node_chunk_bytes`] reports one by one.
pub const MAX_STAT_NODES: usize = 32;

/// A snapshot of an arena's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Bytes of address space reserved: `reservations` × the configured `reserve`.
    pub reserved_bytes: u64,
    /// Reservations held: 1 at creation, one more each time a run did not fit in those
    /// before ([`ArenaConfig::reservations`](super::ArenaConfig::reservations) at most).
    pub reservations: u32,
    /// Bytes of address space held for all reservations the arena may add (`PROT_NONE`).
    pub window_bytes: u64,
    /// Bytes committed (faulted in) as slabs.
    pub committed_bytes: u64,
    /// Bytes covered by live registrations.
    pub registered_bytes: u64,
    /// Slabs backed by hugetlb pages.
    pub slabs_hugetlb: u64,
    /// Slabs in `MADV_HUGEPAGE` memory (transparent huge pages where the kernel finds them).
    pub slabs_thp: u64,
    /// Slabs of ordinary 4 KiB pages.
    pub slabs_small: u64,
    /// Live memory regions.
    pub mrs: u64,
    /// `reg_mr` calls that succeeded.
    pub regs: u64,
    /// Successful growths of a tail region by `rereg_mr(CHANGE_TRANSLATION)`.
    pub reregs: u64,
    /// Of those, how many came back with new keys (never handed out, so harmless).
    pub rereg_new_keys: u64,
    /// Growths that registered a region of their own: the tail's keys had been handed out,
    /// re-registration is off or unsupported, or it failed and left the old region valid.
    pub fallbacks_to_new_mr: u64,
    /// Re-registrations that ended in `IBV_REREG_MR_ERR_CMD` (region registered anew).
    pub rereg_cmd_errors: u64,
    /// Chunks opened.
    pub chunks: u64,
    /// Runs handed out.
    pub runs: u64,
    /// Runs that failed (commit or registration), their slabs returned.
    pub failed_runs: u64,
    /// The fork policy chosen at creation.
    pub fork: ForkPolicy,
    /// Pinned or ODP regions.
    pub mode: RegMode,
    /// Why that mode.
    pub mode_reason: ModeReason,
    /// Live ODP regions (one per chunk, per dedicated run, or the implicit one).
    pub odp_mrs: u64,
    /// Chunks whose pinned registration failed and whose ODP region took over.
    pub odp_fallbacks: u64,
    /// Bytes handed out unregistered because no registration could be had (`keys_of` is
    /// `None` for them).
    pub unregistered_bytes: u64,
    /// Runs handed out unregistered.
    pub unregistered_runs: u64,
    /// Bytes committed for memory that no region covers by design (DEVX queue memory, see
    /// [`crate::queue_mem`]): never registered as a region, never purged.
    pub queue_bytes: u64,
    /// Refused registrations that degraded (to ODP or to unregistered memory) or failed a
    /// run under `RegistrationPolicy::Required`.
    pub degradations: u64,
    /// The last of those, with its cause.
    pub last_degradation: Option<Degradation>,
    /// `RLIMIT_MEMLOCK` after the preflight.
    pub memlock: MemlockInfo,
    /// Committed bytes in ordinary (THP or 4 KiB) pages: what counts in the process's RSS in a
    /// pinned arena (populated to be pinned); an upper bound in an ODP arena, whose ordinary
    /// pages become resident only as they are touched.
    pub resident_bytes: u64,
    /// Committed bytes in hugetlb pages (out of the hugetlb pool, not RSS).
    pub hugetlb_bytes: u64,
    /// Bytes returned to the system by purges (cumulative).
    pub purged_bytes: u64,
    /// Purge calls that returned memory.
    pub purges: u64,
    /// Purges refused: a registration shared with live memory, a bound window, or a failed
    /// re-registration of the rest.
    pub purges_refused: u64,
    /// Bytes of purged slabs committed (and registered) again for reuse (cumulative).
    pub revived_bytes: u64,
    /// Steps registered as regions of their own, of slabs a pinned arena registers in steps
    /// (each [`STEP_BYTES`](super::STEP_BYTES) long and counted in `registered_bytes`).
    pub step_regions: u64,
    /// Slabs registered in steps on this arena's device by every arena of the process, and
    /// the most there may be (a quarter of its `max_mr` over the steps in a slab; 0 where
    /// this arena registers no steps): the device's regions are shared by its pools.
    pub device_step_slabs: (u64, u64),
    /// Where chunks are placed: what [`ArenaConfig::numa`](super::ArenaConfig::numa)
    /// resolved to.
    pub numa: NumaPlacement,
    /// Bytes of the chunks opened and bound to node `n`, at index `n` (chunks on nodes at or
    /// above [`MAX_STAT_NODES`] are not counted here): committed memory is a prefix of them.
    /// Unbound chunks are the rest of `chunks`. All zero on an arena that binds nothing.
    pub node_chunk_bytes: [u64; MAX_STAT_NODES],
    /// `mbind` calls that failed: the memory stayed unbound (allocations never fail for it).
    pub numa_bind_failures: u64,
    /// The device reported a fatal event: nothing is registered on it any more (`events.rs`).
    pub device_dead: bool,
    /// Asynchronous device events read.
    pub device_events: u64,
    /// Of those, ports going down.
    pub port_errors: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) device_events: AtomicU64,
    pub(crate) port_errors: AtomicU64,
    pub(crate) committed_bytes: AtomicU64,
    pub(crate) registered_bytes: AtomicU64,
    pub(crate) slabs_hugetlb: AtomicU64,
    pub(crate) slabs_thp: AtomicU64,
    pub(crate) slabs_small: AtomicU64,
    pub(crate) mrs: AtomicU64,
    pub(crate) regs: AtomicU64,
    pub(crate) reregs: AtomicU64,
    pub(crate) rereg_new_keys: AtomicU64,
    pub(crate) fallbacks_to_new_mr: AtomicU64,
    pub(crate) rereg_cmd_errors: AtomicU64,
    pub(crate) chunks: AtomicU64,
    pub(crate) runs: AtomicU64,
    pub(crate) failed_runs: AtomicU64,
    pub(crate) odp_mrs: AtomicU64,
    pub(crate) odp_fallbacks: AtomicU64,
    pub(crate) unregistered_bytes: AtomicU64,
    pub(crate) unregistered_runs: AtomicU64,
    pub(crate) queue_bytes: AtomicU64,
    pub(crate) degradations: AtomicU64,
    pub(crate) purged_bytes: AtomicU64,
    pub(crate) purges: AtomicU64,
    pub(crate) purges_refused: AtomicU64,
    pub(crate) revived_bytes: AtomicU64,
    /// Steps of stepped slabs registered as regions of their own (`step.rs`).
    pub(crate) step_regions: AtomicU64,
    pub(crate) node_chunk_bytes: [AtomicU64; MAX_STAT_NODES],
}

/// What the snapshot reads besides the counters.
pub(crate) struct Fixed {
    pub(crate) reserved_bytes: u64,
    pub(crate) reservations: u32,
    pub(crate) window_bytes: u64,
    pub(crate) fork: ForkPolicy,
    pub(crate) mode: RegMode,
    pub(crate) mode_reason: ModeReason,
    pub(crate) memlock: MemlockInfo,
    pub(crate) last_degradation: u64,
    pub(crate) numa: NumaPlacement,
    pub(crate) numa_bind_failures: u64,
    pub(crate) device_dead: bool,
    pub(crate) device_step_slabs: (u64, u64),
}

/// `counter += n`.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

/// `counter -= n`.
pub(crate) fn sub(c: &AtomicU64, n: u64) {
    c.fetch_sub(n, Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self, f: Fixed) -> ArenaStats {
        let r = |c: &AtomicU64| c.load(Relaxed);
        let hugetlb_bytes = r(&self.slabs_hugetlb) * super::SLAB as u64;
        ArenaStats {
            reserved_bytes: f.reserved_bytes,
            reservations: f.reservations,
            window_bytes: f.window_bytes,
            committed_bytes: r(&self.committed_bytes),
            registered_bytes: r(&self.registered_bytes),
            slabs_hugetlb: r(&self.slabs_hugetlb),
            slabs_thp: r(&self.slabs_thp),
            slabs_small: r(&self.slabs_small),
            mrs: r(&self.mrs),
            regs: r(&self.regs),
            reregs: r(&self.reregs),
            rereg_new_keys: r(&self.rereg_new_keys),
            fallbacks_to_new_mr: r(&self.fallbacks_to_new_mr),
            rereg_cmd_errors: r(&self.rereg_cmd_errors),
            chunks: r(&self.chunks),
            runs: r(&self.runs),
            failed_runs: r(&self.failed_runs),
            fork: f.fork,
            mode: f.mode,
            mode_reason: f.mode_reason,
            odp_mrs: r(&self.odp_mrs),
            odp_fallbacks: r(&self.odp_fallbacks),
            unregistered_bytes: r(&self.unregistered_bytes),
            unregistered_runs: r(&self.unregistered_runs),
            queue_bytes: r(&self.queue_bytes),
            degradations: r(&self.degradations),
            last_degradation: Degradation::unpack(f.last_degradation),
            memlock: f.memlock,
            resident_bytes: r(&self.committed_bytes).saturating_sub(hugetlb_bytes),
            hugetlb_bytes,
            purged_bytes: r(&self.purged_bytes),
            purges: r(&self.purges),
            purges_refused: r(&self.purges_refused),
            revived_bytes: r(&self.revived_bytes),
            step_regions: r(&self.step_regions),
            device_step_slabs: f.device_step_slabs,
            numa: f.numa,
            node_chunk_bytes: std::array::from_fn(|n| r(&self.node_chunk_bytes[n])),
            numa_bind_failures: f.numa_bind_failures,
            device_dead: f.device_dead,
            device_events: r(&self.device_events),
            port_errors: r(&self.port_errors),
        }
    }
}

impl Arena {
    /// The PD every region of the arena belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The rights every region of the arena was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// What the arena does about `fork()`.
    pub fn fork_policy(&self) -> ForkPolicy {
        self.pages.fork
    }

    /// How long a freed slab stays committed before a purge (the configuration's
    /// `purge_delay`).
    pub fn purge_delay(&self) -> Option<std::time::Duration> {
        self.purge_delay
    }

    /// Whether due purges run on the process's purge clock (the configuration's
    /// `purge_thread`).
    pub(crate) fn purge_thread(&self) -> bool {
        self.purge_thread
    }

    /// Bytes a thread is served from the shared heaps (the configuration's `shared_bytes`).
    pub(crate) fn shared_bytes(&self) -> u32 {
        self.shared_bytes
    }

    /// A snapshot of the counters, read without a lock.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// arena.alloc_run(3 << 20, 64)?;
    /// let s = arena.stats();
    /// assert_eq!((s.committed_bytes, s.registered_bytes, s.slabs_small), (4 << 20, 4 << 20, 2));
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn stats(&self) -> ArenaStats {
        self.counters.snapshot(Fixed {
            reserved_bytes: self.reserved_now() as u64,
            reservations: (self.reserved_now() / self.reserve) as u32,
            window_bytes: self.window as u64,
            fork: self.pages.fork,
            mode: self.mode,
            mode_reason: self.mode_reason,
            memlock: self.memlock,
            last_degradation: self.last_degradation.load(Ordering::Relaxed),
            device_dead: self.device_dead(),
            numa: self.numa,
            numa_bind_failures: self.pages.bind_failures.load(Ordering::Relaxed),
            device_step_slabs: {
                let (n, max) = self.table.device_steps();
                (n as u64, max as u64)
            },
        })
    }

    /// Check the invariants of the module contract (for tests and debug builds).
    pub fn validate(&self) -> bool {
        let st = self.lock();
        let reserved = self.reserved_now();
        let chunks_ok = st.next_chunk <= self.chunks()
            && reserved % self.reserve == 0
            && reserved <= self.window
            && (0..st.chunks.len()).all(|c| {
                st.chunks
                    .get(c)
                    .is_some_and(|ch| ch.used <= self.slabs_per_chunk)
            });
        drop(st);
        let s = self.stats();
        let purged_ok = (0..self.span() >> SLAB_SHIFT).all(|i| {
            !self.is_purged((self.base + (i << SLAB_SHIFT)) as *const u8)
                || self
                    .table
                    .reg_at(i)
                    .is_none_or(|id| self.table.reg(id).is_odp())
        });
        chunks_ok
            && purged_ok
            && self.table.validate()
            && self.rails_valid()
            && s.committed_bytes == SLAB as u64 * (s.slabs_hugetlb + s.slabs_thp + s.slabs_small)
            && s.registered_bytes <= s.committed_bytes
    }
}
