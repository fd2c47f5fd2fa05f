//! Plain data that crosses the NIC boundary: keys, access flags, capabilities, work requests
//! and completions.
//!
//! Contract: every numeric value here is the one libibverbs uses (`ibv_access_flags`,
//! `ibv_rereg_mr_flags`, `ibv_advise_mr_advice`, `ibv_wc_status`), so the verbs backend passes
//! them through unchanged and the soft NIC speaks the same language.
//!
//! Invariant: `key.variant() == key.0 & 0xff` and `key.index() == key.0 >> 8` for every key;
//! a new binding or registration of the same index changes the variant.
//!
//! Crate-private here: [`RawMr`], a region as a backend reports it (held by `ReregError`, so it
//! lives with the plain data rather than with the backend trait), and [`MrAttrs`] with
//! [`ReregFlags::resolve`], the one place that says which attributes a re-registration changes.

use bitflags::bitflags;

/// A local key: names a memory region to the local NIC in scatter/gather entries.
///
/// # Examples
/// ```
/// use rdma_pool::nic::Lkey;
/// let k = Lkey(0x1234_56ab);
/// assert_eq!(k.variant(), 0xab);
/// assert_eq!(k.index(), 0x12_3456);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lkey(pub u32);

/// A remote key: names a memory region or memory window to a peer's NIC.
///
/// The low 8 bits are the key *variant*: rebinding a window or re-registering a region
/// changes them, and a key with an earlier variant is rejected.
///
/// # Examples
/// ```
/// use rdma_pool::nic::Rkey;
/// let k = Rkey(0x0000_0107);
/// assert_eq!(k.variant(), 7);
/// assert_eq!(k.next_variant(), Rkey(0x0000_0108));
/// assert_eq!(Rkey(0x01ff).next_variant(), Rkey(0x0100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Rkey(pub u32);

macro_rules! key_methods {
    ($t:ident) => {
        impl $t {
            /// The low 8 bits: the key variant, changed by every rebind / re-registration.
            pub const fn variant(self) -> u8 {
                (self.0 & 0xff) as u8
            }
            /// The high 24 bits: the index of the region or window in the NIC's key table.
            pub const fn index(self) -> u32 {
                self.0 >> 8
            }
            /// The same index with the next variant (what `ibv_inc_rkey` computes).
            pub const fn next_variant(self) -> Self {
                $t((self.0 & !0xff) | ((self.0.wrapping_add(1)) & 0xff))
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{:#010x}", self.0)
            }
        }
    };
}
key_methods!(Lkey);
key_methods!(Rkey);

bitflags! {
    /// Memory access flags (`enum ibv_access_flags`), for regions, windows and UMEMs.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::Access;
    /// let a = Access::LOCAL_WRITE | Access::REMOTE_READ;
    /// assert!(a.is_valid_for_mr());
    /// assert!(!Access::REMOTE_WRITE.is_valid_for_mr()); // needs LOCAL_WRITE
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the local NIC may write (RECV, READ response).
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may issue atomics.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to this region.
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: remote addresses are offsets (windows only).
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging, pages are not pinned.
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB`: the range is backed by huge pages.
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_RELAXED_ORDERING`.
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl Access {
    /// The remote rights, which need `LOCAL_WRITE` when they include a write.
    pub const REMOTE: Access = Access::REMOTE_READ
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_ATOMIC);

    /// True when `REMOTE_WRITE`/`REMOTE_ATOMIC` come with `LOCAL_WRITE`, as `ibv_reg_mr`
    /// requires (the kernel answers `EINVAL` otherwise).
    pub fn is_valid_for_mr(self) -> bool {
        !self.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            || self.contains(Access::LOCAL_WRITE)
    }
}

bitflags! {
    /// `ibv_rereg_mr` flags: which properties of the region change.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ReregFlags: u32 {
        /// `IBV_REREG_MR_CHANGE_TRANSLATION`: new address and length.
        const CHANGE_TRANSLATION = 1;
        /// `IBV_REREG_MR_CHANGE_PD`: new protection domain.
        const CHANGE_PD = 1 << 1;
        /// `IBV_REREG_MR_CHANGE_ACCESS`: new access flags.
        const CHANGE_ACCESS = 1 << 2;
    }
}

/// A registered region as the backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawMr {
    pub(crate) handle: u64,
    pub(crate) lkey: Lkey,
    pub(crate) rkey: Rkey,
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

/// The attributes of a region that `ibv_rereg_mr` can change. `P` names the protection domain:
/// a backend handle (`u64`) in the backends, a `Pd` in the public layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct MrAttrs<P = u64> {
    pub(crate) pd: P,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) access: Access,
}

impl ReregFlags {
    /// What a region re-registered with these flags gets: `requested`'s PD with
    /// `CHANGE_PD`, its address and length with `CHANGE_TRANSLATION`, its access with
    /// `CHANGE_ACCESS`, and `old`'s value for every attribute whose flag is clear. Unknown
    /// flag bits are ignored (the public layer refuses them).
    ///
    /// With `old = MrAttrs::default()` (null PD, address, length and access) the result is what
    /// the C verb is passed: each argument only with its flag, as libibverbs requires.
    pub(crate) fn resolve<P>(self, old: MrAttrs<P>, requested: MrAttrs<P>) -> MrAttrs<P> {
        let translation = self.contains(ReregFlags::CHANGE_TRANSLATION);
        let pick = |change: bool, new, old| if change { new } else { old };
        MrAttrs {
            pd: if self.contains(ReregFlags::CHANGE_PD) {
                requested.pd
            } else {
                old.pd
            },
            addr: pick(translation, requested.addr, old.addr),
            len: pick(translation, requested.len, old.len),
            access: if self.contains(ReregFlags::CHANGE_ACCESS) {
                requested.access
            } else {
                old.access
            },
        }
    }
}

/// The most entries one `ibv_advise_mr` call takes: the kernel bounds the list only by its
/// uverbs attribute, whose length is a `u16`, so 65535 bytes of 16-byte `ib_uverbs_sge`s. It is
/// not `max_sge` (a work-request limit). Longer lists are split by the caller.
pub const MAX_ADVISE_SGES: usize = u16::MAX as usize / 16;

bitflags! {
    /// `ibv_advise_mr` flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AdviseFlags: u32 {
        /// `IBV_ADVISE_MR_FLAG_FLUSH`: return only once the translations are in the NIC.
        const FLUSH = 1;
    }
}

/// `enum ibv_advise_mr_advice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Advice {
    /// Make pages present read-only before the I/O.
    Prefetch = 0,
    /// Make pages present readable and writable.
    PrefetchWrite = 1,
    /// Map pages already present in the CPU, without faulting.
    PrefetchNoFault = 2,
}

/// Memory window type (`IBV_MW_TYPE_1` / `IBV_MW_TYPE_2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MwType {
    /// Bound with `ibv_bind_mw` on any QP of the PD, usable from any QP.
    Type1 = 1,
    /// Bound by a BIND_MW work request, usable only through the QP that bound it.
    Type2 = 2,
}

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
/// [`Nic::poll_async_event`]: super::Nic::poll_async_event
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

/// A scatter/gather entry (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Key of the region that covers `[addr, addr + length)`.
    pub lkey: Lkey,
}

/// Completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: a receive buffer was too small.
    LocLenErr,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error (bad invalidate, …).
    LocQpOpErr,
    /// `IBV_WC_LOC_PROT_ERR`: a local key, bound or right was wrong.
    LocProtErr,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP was in the error state.
    WrFlushErr,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind failed.
    MwBindErr,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local access fault (ODP page the process cannot reach).
    LocAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid.
    RemInvReqErr,
    /// `IBV_WC_REM_ACCESS_ERR`: the remote key, bound or right was wrong.
    RemAccessErr,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
    RemOpErr,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retries exhausted.
    RetryExcErr,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: receiver-not-ready retries exhausted.
    RnrRetryExcErr,
    /// Any other `ibv_wc_status` value.
    Other(u32),
}

impl WcStatus {
    /// Map an `ibv_wc_status` value.
    pub fn from_raw(v: u32) -> WcStatus {
        match v {
            0 => WcStatus::Success,
            1 => WcStatus::LocLenErr,
            2 => WcStatus::LocQpOpErr,
            4 => WcStatus::LocProtErr,
            5 => WcStatus::WrFlushErr,
            6 => WcStatus::MwBindErr,
            8 => WcStatus::LocAccessErr,
            9 => WcStatus::RemInvReqErr,
            10 => WcStatus::RemAccessErr,
            11 => WcStatus::RemOpErr,
            12 => WcStatus::RetryExcErr,
            13 => WcStatus::RnrRetryExcErr,
            other => WcStatus::Other(other),
        }
    }
}

/// What a completion completes (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcOpcode {
    /// SEND (or SEND_WITH_INV).
    #[default]
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// BIND_MW (type 1 or 2).
    BindMw,
    /// LOCAL_INV.
    LocalInv,
    /// ATOMIC_CMP_AND_SWP.
    CompareSwap,
    /// ATOMIC_FETCH_AND_ADD.
    FetchAdd,
    /// A receive (of a SEND, with or without immediate data).
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate data (`IBV_WC_RECV_RDMA_WITH_IMM`):
    /// `byte_len` is the length written, `imm_data` the immediate.
    RecvRdmaWithImm,
    /// Anything else.
    Other(u32),
}

/// A work completion (`struct ibv_wc`), the fields rdma-pool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The rkey a SEND_WITH_INV invalidated (receives only).
    pub invalidated_rkey: Option<Rkey>,
    /// The immediate data of a SEND_WITH_IMM or RDMA_WRITE_WITH_IMM (receives only), in host
    /// byte order (the wire carries it big-endian; the conversion is done here).
    pub imm_data: Option<u32>,
}

bitflags! {
    /// Flags of a send-queue request ([`SendWr::flags`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Report a completion when it succeeds (errors are always reported). An unsignaled
        /// request keeps its send-queue slot until a later signaled request of the same QP
        /// completes: post a signaled one at least every `max_send_wr` requests, or the queue
        /// fills and posting fails with `ENOMEM`.
        const SIGNALED = 1;
        /// Copy the payload into the request at post time (`IBV_SEND_INLINE`): the memory may
        /// be reused as soon as the post returns, and its lkey is not used. At most
        /// [`QpCaps::max_inline_data`] bytes; SEND and WRITE only.
        const INLINE = 1 << 1;
        /// Ask the responder for a solicited event (`IBV_SEND_SOLICITED`): a CQ armed with
        /// [`Cq::req_notify`](crate::nic::Cq::req_notify)`(true)` notifies only for these.
        const SOLICITED = 1 << 2;
    }
}

/// A send-queue operation of [`Qp::post_send_wrs`](crate::nic::Qp::post_send_wrs). Binds,
/// invalidations and atomics have their own calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND into the responder's next receive.
    Send,
    /// SEND with 32 bits of immediate data, delivered in the receive's completion.
    SendWithImm(u32),
    /// SEND that also invalidates this rkey at the responder.
    SendWithInv(Rkey),
    /// RDMA WRITE to `remote_addr` through `rkey`.
    Write {
        /// Where the bytes go, in the responder's address space.
        remote_addr: u64,
        /// The responder's key.
        rkey: Rkey,
    },
    /// RDMA WRITE that also consumes one receive at the responder, whose completion
    /// ([`WcOpcode::RecvRdmaWithImm`]) carries `imm` and the length written.
    WriteWithImm {
        /// Where the bytes go, in the responder's address space.
        remote_addr: u64,
        /// The responder's key.
        rkey: Rkey,
        /// The immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` through `rkey` into the local SGEs.
    Read {
        /// Where the bytes come from, in the responder's address space.
        remote_addr: u64,
        /// The responder's key.
        rkey: Rkey,
    },
}

/// One send-queue request of a batch ([`Qp::post_send_wrs`](crate::nic::Qp::post_send_wrs)).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// The id its completion carries (not in the range [`is_reserved_wr_id`](crate::nic::is_reserved_wr_id)).
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The local memory: gathered for SEND/WRITE, scattered into for READ.
    pub sges: &'a [Sge],
    /// Signaled, inline, solicited.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A signaled request.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{SendFlags, SendOp, SendWr};
    /// let wr = SendWr::new(7, SendOp::SendWithImm(42), &[]);
    /// assert_eq!(wr.flags, SendFlags::SIGNALED);
    /// ```
    pub fn new(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sges,
            flags: SendFlags::SIGNALED,
        }
    }

    /// The same request with `flags`.
    pub fn flags(self, flags: SendFlags) -> SendWr<'a> {
        SendWr { flags, ..self }
    }
}

/// QP state as far as rdma-pool cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, not connected (RESET/INIT).
    Init,
    /// Connected, ready to send (RTS).
    Ready,
    /// The error state: every posted request completes with `WrFlushErr`.
    Error,
}

/// QP sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline ([`SendFlags::INLINE`](crate::nic::SendFlags::INLINE),
    /// [`Qp::post_inline`](crate::nic::Qp::post_inline)). The device may grant more than asked:
    /// [`Qp::caps`](crate::nic::Qp::caps) tells what it granted.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What a peer needs to connect its QP to ours (exchanged out of band: [`Endpoint::to_bytes`],
/// or serde with the `serde` feature).
///
/// # Examples
/// ```
/// use rdma_pool::nic::Endpoint;
/// let e = Endpoint { gid: [7; 16], qpn: 0x11, lid: 3, psn: 0x42 };
/// let b = e.to_bytes();
/// assert_eq!(Endpoint::from_bytes(&b), Some(e));
/// assert_eq!(Endpoint::from_bytes(&b[..25]), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "EndpointFields")
)]
pub struct Endpoint {
    /// Port GID (RoCE: the IPv6 link-local GID at index 0).
    pub gid: [u8; 16],
    /// QP number.
    pub qpn: u32,
    /// Port LID (InfiniBand only; 0 on RoCE).
    pub lid: u16,
    /// Initial packet sequence number.
    pub psn: u32,
}

/// What serde reads of an [`Endpoint`], before the range check.
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
struct EndpointFields {
    gid: [u8; 16],
    qpn: u32,
    lid: u16,
    psn: u32,
}

#[cfg(feature = "serde")]
impl TryFrom<EndpointFields> for Endpoint {
    type Error = &'static str;
    fn try_from(f: EndpointFields) -> Result<Endpoint, &'static str> {
        let e = Endpoint {
            gid: f.gid,
            qpn: f.qpn,
            lid: f.lid,
            psn: f.psn,
        };
        e.check().map(|()| e)
    }
}

impl Endpoint {
    /// Bytes of the wire form.
    pub const BYTES: usize = 26;

    /// Refuse a QP number or PSN wider than their 24 bits (hardware would silently take the
    /// low bits: another QP).
    ///
    /// # Errors
    /// What is out of range.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.qpn >> 24 != 0 {
            return Err("QP number wider than 24 bits");
        }
        if self.psn >> 24 != 0 {
            return Err("PSN wider than 24 bits");
        }
        Ok(())
    }

    /// The wire form: the GID, then QP number, LID and PSN little-endian.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..16].copy_from_slice(&self.gid);
        b[16..20].copy_from_slice(&self.qpn.to_le_bytes());
        b[20..22].copy_from_slice(&self.lid.to_le_bytes());
        b[22..].copy_from_slice(&self.psn.to_le_bytes());
        b
    }

    /// Parse the wire form; `None` when `b` is not exactly [`Endpoint::BYTES`] long or a
    /// number is out of range (QP number and PSN are 24 bits).
    pub fn from_bytes(b: &[u8]) -> Option<Endpoint> {
        let b: &[u8; Self::BYTES] = b.try_into().ok()?;
        let e = Endpoint {
            gid: b[..16].try_into().ok()?,
            qpn: u32::from_le_bytes(b[16..20].try_into().ok()?),
            lid: u16::from_le_bytes(b[20..22].try_into().ok()?),
            psn: u32::from_le_bytes(b[22..26].try_into().ok()?),
        };
        e.check().ok().map(|()| e)
    }
}

/// How [`Qp::connect_with`](crate::nic::Qp::connect_with) connects (`ibv_modify_qp` to RTR
/// and RTS). The defaults are what [`Qp::connect`](crate::nic::Qp::connect) uses.
///
/// # Examples
/// ```
/// use rdma_pool::nic::ConnectOptions;
/// let o = ConnectOptions { path_mtu: Some(1024), retry_cnt: 3, ..ConnectOptions::default() };
/// assert!(o.check().is_ok());
/// assert!(ConnectOptions { rnr_retry: 8, ..o }.check().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectOptions {
    /// The local GID index the connection's packets carry (RoCE: 0 is the IPv6 link-local
    /// GID; RoCE v2 over IPv4 uses the index of the address's GID).
    pub gid_index: u8,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096); `None`: the port's active MTU.
    pub path_mtu: Option<u32>,
    /// Local ACK timeout, `4.096 µs × 2^timeout` (0..=31; 0 waits forever).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (0..=7; 7 retries forever).
    pub rnr_retry: u8,
    /// The RNR NAK timer this side asks of senders (0..=31, the IB encoding).
    pub min_rnr_timer: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            gid_index: 0,
            path_mtu: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

impl ConnectOptions {
    /// Refuse values outside their ranges.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::nic::Error::InvalidArgument) naming the field.
    pub fn check(&self) -> Result<(), crate::nic::Error> {
        let bad = |detail| {
            Err(crate::nic::Error::invalid(
                crate::nic::Verb::ModifyQp,
                detail,
            ))
        };
        if let Some(m) = self.path_mtu
            && ![256, 512, 1024, 2048, 4096].contains(&m)
        {
            return bad("path_mtu must be 256, 512, 1024, 2048 or 4096");
        }
        if self.timeout > 31 {
            return bad("timeout must be 0..=31");
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return bad("retry_cnt and rnr_retry must be 0..=7");
        }
        if self.min_rnr_timer > 31 {
            return bad("min_rnr_timer must be 0..=31");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rereg_takes_each_requested_attribute_only_with_its_flag() {
        let old = MrAttrs {
            pd: 1u64,
            addr: 0x1000,
            len: 4096,
            access: Access::LOCAL_WRITE,
        };
        let new = MrAttrs {
            pd: 2u64,
            addr: 0x8000,
            len: 8192,
            access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        };
        let f = ReregFlags::CHANGE_TRANSLATION;
        assert_eq!(
            f.resolve(old, new),
            MrAttrs {
                addr: 0x8000,
                len: 8192,
                ..old
            }
        );
        let f = ReregFlags::CHANGE_PD;
        assert_eq!(f.resolve(old, new), MrAttrs { pd: 2, ..old });
        let f = ReregFlags::CHANGE_ACCESS;
        assert_eq!(
            f.resolve(old, new),
            MrAttrs {
                access: new.access,
                ..old
            }
        );
        assert_eq!(ReregFlags::all().resolve(old, new), new);
        assert_eq!(ReregFlags::empty().resolve(old, new), old);
    }
}
