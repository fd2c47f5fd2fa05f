//! What a device is and can do: [`Caps`] (with [`OdpCaps`] and [`OdpOps`]), [`NicKind`],
//! [`ForkStatus`] and the asynchronous events it reports ([`AsyncEvent`]).

use bitflags::bitflags;

bitflags! {
    /// ODP support for one transport's operations (`ibv_odp_transport_cap_bits`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpOps: u32 {
        /// SEND.
        const SEND = 1;
        /// RECV.
        const RECV = 1 << 1;
        /// RDMA WRITE.
        const WRITE = 1 << 2;
        /// RDMA READ.
        const READ = 1 << 3;
        /// Atomics.
        const ATOMIC = 1 << 4;
        /// SRQ receive.
        const SRQ_RECV = 1 << 5;
    }
}

/// On-demand paging capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OdpCaps {
    /// Explicit ODP regions (`IBV_ODP_SUPPORT`).
    pub explicit: bool,
    /// Implicit ODP, a region over the whole address space (`IBV_ODP_SUPPORT_IMPLICIT`).
    pub implicit: bool,
    /// Which RC operations may touch ODP memory.
    pub rc: OdpOps,
}

/// An asynchronous event of a device (`ibv_get_async_event(3)`), as [`Nic::poll_async_event`]
/// reads it.
///
/// [`Nic::poll_async_event`]: crate::nic::Nic::poll_async_event
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`; also what a hot-unplugged device reports):
    /// every object on it is unusable, and the verbs fail from now on.
    DeviceFatal,
    /// A port came up (`IBV_EVENT_PORT_ACTIVE`).
    PortActive {
        /// Port number.
        port: u8,
    },
    /// A port went down (`IBV_EVENT_PORT_ERR`): QPs on it stop moving data.
    PortError {
        /// Port number.
        port: u8,
    },
    /// A QP entered the error state (`IBV_EVENT_QP_FATAL`, `_REQ_ERR`, `_ACCESS_ERR`).
    QpError,
    /// A CQ overran (`IBV_EVENT_CQ_ERR`).
    CqError,
    /// Another event, with its `ibv_event_type` code.
    Other(u32),
}

impl AsyncEvent {
    /// Whether the device is gone for good after this event.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::AsyncEvent;
    /// assert!(AsyncEvent::DeviceFatal.is_fatal());
    /// assert!(!AsyncEvent::PortError { port: 1 }.is_fatal());
    /// ```
    pub fn is_fatal(self) -> bool {
        self == AsyncEvent::DeviceFatal
    }

    /// The event for an `ibv_event_type` code and its port (for port events).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn from_code(code: u32, port: u8) -> AsyncEvent {
        match code {
            8 => AsyncEvent::DeviceFatal,
            9 => AsyncEvent::PortActive { port },
            10 => AsyncEvent::PortError { port },
            1..=3 => AsyncEvent::QpError,
            0 => AsyncEvent::CqError,
            c => AsyncEvent::Other(c),
        }
    }
}

/// Whether `fork()` is safe next to registered memory (`ibv_is_fork_initialized(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForkStatus {
    /// `IBV_FORK_DISABLED`: fork support was not initialised; a child that touches pinned
    /// memory may corrupt the parent's DMA (the caller must keep registered memory from the
    /// child with `MADV_DONTFORK`).
    Disabled,
    /// `IBV_FORK_ENABLED`: `ibv_fork_init()` ran; libibverbs marks every registered range
    /// `MADV_DONTFORK`, so the child does not see it.
    Enabled,
    /// `IBV_FORK_UNNEEDED`: the kernel copies pinned pages for the child at fork (Linux ≥
    /// 5.13): nothing needs to be done, the child keeps an ordinary copy.
    Unneeded,
}

/// Which backend a [`crate::nic::Nic`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NicKind {
    /// The in-process software NIC.
    Soft,
    /// A real libibverbs device (hardware or the kernel's Soft-RoCE).
    Verbs,
}

/// What a device can do, as queried once when it is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caps {
    /// Device name (`rxe0`, `mlx5_0`, `soft0`).
    pub name: String,
    /// Provider driver (`rxe`, `mlx5`, `soft`).
    pub driver: String,
    /// Largest region in bytes (`max_mr_size`).
    pub max_mr_size: u64,
    /// Most regions (`max_mr`).
    pub max_mr: u32,
    /// Most memory windows (`max_mw`); 0 when windows are unsupported.
    pub max_mw: u32,
    /// Most scatter/gather entries per work request (`max_sge`).
    pub max_sge: u32,
    /// Most outstanding work requests per queue (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Most completions per CQ (`max_cqe`).
    pub max_cqe: u32,
    /// ODP support.
    pub odp: OdpCaps,
    /// `ibv_rereg_mr` is implemented by the provider. (Whether it keeps the keys is a
    /// separate question that only a probe answers.)
    pub rereg_mr: bool,
    /// A deregistered region's key goes to the driver's cache and comes back, index and
    /// variant alike, with the next registration of its size (mlx5's mkey cache, 6.x; the
    /// soft NIC in [`ReregMode::Mlx5`](crate::nic::soft::ReregMode::Mlx5)): a key given to a
    /// peer stays dead only while its region stays registered.
    pub mkey_cache: bool,
    /// Type 1 windows.
    pub mw_type1: bool,
    /// Type 2 windows.
    pub mw_type2: bool,
    /// `ibv_advise_mr` is implemented.
    pub advise_mr: bool,
    /// RC atomics (compare-and-swap, fetch-and-add) are supported (`atomic_cap` is not
    /// `IBV_ATOMIC_NONE`).
    pub atomics: bool,
    /// mlx5 DEVX (UMEM registration) is available.
    pub devx: bool,
    /// Active path MTU of port 1 in bytes.
    pub path_mtu: u32,
    /// The NUMA node the device is attached to (verbs: `/sys/class/infiniband/<name>/device/
    /// numa_node`, `None` for `-1` or a missing file; soft: [`SoftConfig::numa_node`]).
    ///
    /// [`SoftConfig::numa_node`]: crate::nic::soft::SoftConfig::numa_node
    pub numa_node: Option<u32>,
}
