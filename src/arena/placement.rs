//! Where the arena's chunks live: the NUMA node each chunk was bound to when it was opened,
//! and the node (and open-chunk slot) a chunk opened now by the calling thread gets.
//!
//! Contract:
//! - the placement is resolved once, at creation ([`Arena::numa_placement`]); a chunk is bound
//!   right after it is mapped and before any page of it is touched (`commit.rs`, `numa.rs`),
//!   and its node is recorded in its `ChunkState` (`n + 1`, 0 for unbound);
//! - under `Local` placement each node has its own open chunk (slot `node % MAX_NODES`), so a
//!   thread's runs are cut from a chunk bound to its node; every other placement uses slot 0;
//! - a failed binding leaves the chunk unbound and is counted, never fails a run.

use super::Arena;
use super::numa::{self, NumaPlacement};

impl Arena {
    /// The NUMA node the chunk holding `ptr` was bound to when it was opened; `None` for a
    /// pointer outside the arena, a chunk not opened, or an unbound chunk (placement
    /// [`NumaPlacement::Unbound`], or a failed `mbind`). Takes the arena's lock.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::arena::{Arena, ArenaConfig, Hugepages, NumaPolicy};
    /// let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, numa: NumaPolicy::Node(0), ..Default::default() };
    /// let arena = Arena::new(&pd, cfg)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// assert_eq!(arena.chunk_node(run.as_ptr()), Some(0));
    /// assert_eq!(arena.stats().node_chunk_bytes[0], 1 << 26);
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn chunk_node(&self, ptr: *const u8) -> Option<u32> {
        let c = self.chunk_of(ptr)?;
        self.chunk_node_code(c).checked_sub(1)
    }

    /// `ChunkState::node` of chunk `c` (0 for none).
    pub(crate) fn chunk_node_code(&self, c: usize) -> u32 {
        self.lock().chunks.get(c).map_or(0, |ch| ch.node)
    }

    /// What [`ArenaConfig::numa`] resolved to (also in [`ArenaStats::numa`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::arena::{Arena, ArenaConfig, Hugepages, NumaPlacement, NumaPolicy};
    /// use rdma_pool::nic::Nic;
    /// let pd = Nic::soft().alloc_pd()?; // a soft NIC reports no node by default
    /// let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, numa: NumaPolicy::DeviceNode, ..Default::default() };
    /// assert_eq!(Arena::new(&pd, cfg)?.numa_placement(), NumaPlacement::DeviceHasNoNode);
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    ///
    /// [`ArenaConfig::numa`]: super::ArenaConfig::numa
    /// [`ArenaStats::numa`]: super::ArenaStats::numa
    pub fn numa_placement(&self) -> NumaPlacement {
        self.numa
    }

    /// The node code (`n + 1`, 0 for none) a chunk opened now by this thread is bound to, and
    /// the open-chunk slot its runs are cut from.
    pub(super) fn wanted_node(&self) -> (u32, usize) {
        match self.numa {
            NumaPlacement::Unbound | NumaPlacement::DeviceHasNoNode => (0, 0),
            NumaPlacement::Node(n) => (n + 1, 0),
            NumaPlacement::Local => match numa::current_node() {
                Some(n) => (n + 1, n as usize % numa::MAX_NODES),
                None => (0, 0),
            },
        }
    }
}
