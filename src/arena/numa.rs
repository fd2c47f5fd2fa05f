//! NUMA placement: which node the arena's chunks take their memory from (the system calls
//! that bind a mapping and read back where memory went are in `sys/numa.rs`).
//!
//! Contract:
//! - [`NumaPolicy`] is asked for in [`ArenaConfig::numa`](super::ArenaConfig::numa) and
//!   resolved once, in `Arena::new`, into a [`NumaPlacement`] (reported in
//!   [`ArenaStats::numa`](super::ArenaStats::numa)): `Any` and a `DeviceNode` whose device
//!   reports no node leave memory unbound (today's behaviour); `Node(n)` and a `DeviceNode` of
//!   a device on node `n` bind every chunk to `n`; `Local` binds each chunk to the node of the
//!   thread that opens it, and keeps one open chunk per node so a thread's fresh runs come from
//!   its CPU's node.
//! - A node that is not online (or not allowed to the process) is an `Error::Config` at
//!   `Arena::new`: asking for memory on a node the machine does not have is a configuration
//!   mistake, reported where it is made, never silently ignored.
//! - Binding is `mbind(MPOL_PREFERRED)`, made right after a chunk is mapped and before any of
//!   its pages is touched, and again wherever a part of it is mapped anew (hugetlb → ordinary
//!   fallback, a purged hugetlb slab re-mapped). `MPOL_PREFERRED` rather than `MPOL_BIND`: the
//!   kernel takes pages from the node while it has them and from the others when it does not,
//!   so a full node slows memory down instead of failing it (`MPOL_BIND` would end in the
//!   OOM killer, or an `ENOMEM` on populate, for a node that is full while others are not).
//! - A failed `mbind` never fails an allocation: it is counted
//!   ([`ArenaStats::numa_bind_failures`](super::ArenaStats::numa_bind_failures)) and the chunk
//!   stays unbound (its node reads `None`).
//! - Nothing here allocates through the global allocator: sysfs is read with `open`/`read`
//!   into stack buffers, node masks are stack arrays.
//! - On a single-node machine binding to node 0 is still made (and visible to
//!   `get_mempolicy`); it changes nothing about where memory comes from.

pub use crate::sys::numa::{MAX_NODES, current_node, is_available, online_nodes};
// Diagnostics the tests use (what the kernel says of a page's policy and node): not part of
// the documented surface.
#[doc(hidden)]
pub use crate::sys::numa::{
    MASK_NODES, MPOL_BIND, MPOL_DEFAULT, MPOL_PREFERRED, node_of_page, policy_node_of, policy_of,
};

/// Where the arena asks the kernel to place its chunks.
///
/// # Examples
/// ```
/// use rdma_pool::arena::{Arena, ArenaConfig, Hugepages, NumaPlacement, NumaPolicy};
/// assert_eq!(ArenaConfig::default().numa, NumaPolicy::Any);
/// let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
/// let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, numa: NumaPolicy::Node(0), hugepages: Hugepages::Off, ..Default::default() };
/// assert_eq!(Arena::new(&pd, cfg)?.numa_placement(), NumaPlacement::Node(0));
/// let nowhere = ArenaConfig { numa: NumaPolicy::Node(100_000), ..cfg };
/// assert!(matches!(Arena::new(&pd, nowhere), Err(rdma_pool::arena::Error::Config(_))));
/// # Ok::<(), rdma_pool::PoolError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NumaPolicy {
    /// No binding: the kernel places pages as for any memory (first touch). The default.
    #[default]
    Any,
    /// Every chunk bound (preferred) to this node. `Error::Config` at `Arena::new` when the
    /// node is not online.
    Node(u32),
    /// The node of the arena's device (`/sys/class/infiniband/<dev>/device/numa_node`, a soft
    /// NIC's `SoftConfig::numa_node`); unbound when the device reports none.
    DeviceNode,
    /// Each chunk bound to the node of the thread that opens it, one open chunk per node: a
    /// thread's fresh runs (and so its thread cache's fresh pages) come from its CPU's node.
    /// Memory recycled through shared free lists, or taken by another thread, may come from
    /// another node; the refill reserve is not used under `Local` (`Pool::start_refill`
    /// starts nothing).
    Local,
}

/// What a [`NumaPolicy`] resolved to for one arena.
///
/// # Examples
/// ```
/// use rdma_pool::arena::NumaPlacement;
/// assert_eq!(NumaPlacement::Node(1).node(), Some(1));
/// assert_eq!(NumaPlacement::Unbound.node(), None);
/// assert!(!NumaPlacement::DeviceHasNoNode.is_bound());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NumaPlacement {
    /// Nothing bound (`NumaPolicy::Any`).
    #[default]
    Unbound,
    /// Nothing bound: `NumaPolicy::DeviceNode` and the device reports no node.
    DeviceHasNoNode,
    /// Every chunk bound to this node.
    Node(u32),
    /// Every chunk bound to the node of the thread that opened it.
    Local,
}

impl NumaPlacement {
    /// The one node every chunk is bound to, if there is one.
    pub fn node(self) -> Option<u32> {
        match self {
            NumaPlacement::Node(n) => Some(n),
            _ => None,
        }
    }

    /// Whether chunks are bound at all.
    pub fn is_bound(self) -> bool {
        matches!(self, NumaPlacement::Node(_) | NumaPlacement::Local)
    }

    /// Resolve `policy` for a device on `device_node`, checking the node against the
    /// machine's online (and allowed) nodes.
    pub(crate) fn resolve(
        policy: NumaPolicy,
        device_node: Option<u32>,
    ) -> Result<NumaPlacement, &'static str> {
        let fixed = |n: u32| {
            if is_available(n) {
                Ok(NumaPlacement::Node(n))
            } else {
                Err("the NUMA node asked for is not online (or not allowed to this process)")
            }
        };
        match policy {
            NumaPolicy::Any => Ok(NumaPlacement::Unbound),
            NumaPolicy::Node(n) => fixed(n),
            NumaPolicy::DeviceNode => match device_node {
                Some(n) => fixed(n),
                None => Ok(NumaPlacement::DeviceHasNoNode),
            },
            NumaPolicy::Local => Ok(NumaPlacement::Local),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_resolve() {
        assert_eq!(
            NumaPlacement::resolve(NumaPolicy::Any, Some(0)),
            Ok(NumaPlacement::Unbound)
        );
        assert_eq!(
            NumaPlacement::resolve(NumaPolicy::DeviceNode, None),
            Ok(NumaPlacement::DeviceHasNoNode)
        );
        assert_eq!(
            NumaPlacement::resolve(NumaPolicy::DeviceNode, Some(0)),
            Ok(NumaPlacement::Node(0))
        );
        let missing = online_nodes() + 1000;
        assert!(NumaPlacement::resolve(NumaPolicy::Node(missing), None).is_err());
        assert!(NumaPlacement::resolve(NumaPolicy::DeviceNode, Some(missing)).is_err());
    }
}
