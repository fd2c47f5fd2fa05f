//! Where kernel Soft-RoCE (rxe) and the soft NIC differ: the one table of differences.
//!
//! The soft NIC models what verbs hardware enforces; rxe, the reference kernel stack run in CI,
//! falls short of that in a few places (and refuses a few optional verbs). Each difference is one
//! row of [`RXE`], with the reason, and the scenario suite (`tests/scenarios.rs`) asks
//! [`applies`] before asserting the hardware behaviour, so a change in either stack is noticed.
//!
//! Measured on Debian's 7.3.4 kernel with rdma-core 65 (see `tests/rxe/README.md`).

use super::Caps;

/// A known difference between rxe and the soft NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Quirk {
    /// rxe checks an rkey's access against the window's *region*, not the window's bounds.
    MwBoundsNotEnforced,
    /// rxe has no `rereg_mr`: every call fails with `ERR_CMD`/`EOPNOTSUPP`.
    ReregUnsupported,
    /// rxe has no implicit ODP.
    NoImplicitOdp,
    /// rxe ODP RDMA ignores the in-page offset unless buffers are page-aligned and the path MTU
    /// is 4096: data silently corrupted.
    OdpRdmaNeedsPageAlignment,
    /// rxe refuses to deregister a region with bound windows with `EINVAL`, not `EBUSY`.
    DeregBusyIsEinval,
    /// Unbinding a type 1 window with a NULL region crashes rxe's provider.
    UnbindNeedsRegion,
    /// Destroying a QP before its type 2 windows stalls rxe ~50 s.
    Type2WindowsBeforeQp,
    /// After `ERR_CMD` from `rereg_mr`, rxe's region in fact still works; the soft NIC enforces
    /// ibv_rereg_mr(3)'s "must not be used" by refusing it.
    ErrCmdRegionStillWorks,
    /// rxe has no DEVX (it is no mlx5 device).
    NoDevx,
    /// rxe refuses `IBV_ACCESS_HUGETLB` in `reg_mr` (`EOPNOTSUPP`); hugetlb memory registers
    /// fine without the flag.
    HugetlbAccessRefused,
    /// rxe completes a work request that failed a *local* check (bad lkey range, failed bind,
    /// refused LOCAL_INV) with `WR_FLUSH_ERR` instead of its own status (`LOC_PROT_ERR`,
    /// `MW_BIND_ERR`, `LOC_QP_OP_ERR`); the QP does enter the error state.
    LocalErrorsReportedAsFlush,
    /// rxe invalidates the window on SEND_WITH_INV but the receive completion does not carry
    /// `IBV_WC_WITH_INV` and the invalidated rkey.
    SendWithInvNotReported,
    /// rxe, like hardware, keeps moving the pages a pinned region pinned after the process
    /// dropped, unmapped, remapped or reprotected them; the soft NIC cannot keep those pages,
    /// so it refuses the access (error completion, `stale_pinned_accesses`).
    PinnedPagesOutliveTheMapping,
    /// A SEND landing in a receive whose region lacks `LOCAL_WRITE`: rxe completes the receive
    /// with `LOC_QP_OP_ERR` (a malformed WQE), the soft NIC with `LOC_PROT_ERR`; the sender
    /// gets `REM_OP_ERR` on both.
    RecvProtectionIsQpOpErr,
    /// rxe answers `EINVAL` above `max_mr`/`max_mw` (its object pools), the soft NIC `ENOMEM`;
    /// both surface as [`crate::nic::Error::Limit`].
    LimitIsEinval,
    /// A type 1 bind posted behind a SEND that is in RNR retry (no receive posted yet) fails
    /// the QP on rxe: the SEND and the bind complete with `WR_FLUSH_ERR` (the retry rewinds
    /// the send queue and runs the bind again with its old key). Hardware completes both in
    /// order once a receive is posted, as the soft NIC does.
    BindBehindRnrRetryFails,
    /// rxe binds windows of any length; mlx5 refuses windows above 2 GiB (`EOPNOTSUPP`: its
    /// KLM descriptors cover 2 GiB), as the soft NIC does.
    LongWindowsAccepted,
    /// rxe frees an unsignaled request's send-queue slot as soon as the request completes
    /// (its completer advances the queue for every WQE); hardware (mlx5) frees it only when a
    /// later signaled completion is polled, as the soft NIC does at that completion.
    UnsignaledSlotsFreedEarly,
    /// A receive posted to a QP already in the error state stays queued on rxe (its user-space
    /// receive queue has no doorbell; the kernel flushes only what was there when the QP
    /// failed); hardware and the soft NIC complete it at once with `WR_FLUSH_ERR`.
    RecvAfterErrorWaits,
}

/// One row of the difference table.
#[derive(Debug, Clone, Copy)]
pub struct Difference {
    /// Which difference.
    pub quirk: Quirk,
    /// What the soft NIC does (the hardware rule).
    pub soft: &'static str,
    /// What rxe does.
    pub rxe: &'static str,
    /// Why the soft NIC does not copy rxe here.
    pub reason: &'static str,
}

/// The differences between rxe and the soft NIC.
pub const RXE: &[Difference] = &[
    Difference {
        quirk: Quirk::MwBoundsNotEnforced,
        soft: "access outside a window's range through its rkey: REM_ACCESS_ERR",
        rxe: "succeeds when inside the window's region (rxe_lookup_mw checks rights, not range)",
        reason: "a window grants its own range only (IB spec 10.6.7) and mlx5 enforces it; a grant must cover one buffer",
    },
    Difference {
        quirk: Quirk::ReregUnsupported,
        soft: "configurable: keep keys (default, as mlx5), change keys, or refuse",
        rxe: "ERR_CMD (-4) with EOPNOTSUPP for every flag",
        reason: "the pool must be tested on both the rereg path and the fallback path",
    },
    Difference {
        quirk: Quirk::NoImplicitOdp,
        soft: "implicit ODP supported (configurable)",
        rxe: "EOPNOTSUPP",
        reason: "mlx5 supports implicit ODP; the soft NIC models it so the pool's use is tested",
    },
    Difference {
        quirk: Quirk::OdpRdmaNeedsPageAlignment,
        soft: "ODP RDMA moves the right bytes at any offset",
        rxe: "wrong bytes (success status) unless page-aligned at path MTU 4096",
        reason: "a kernel bug in rxe's ODP copy; the verbs backend keeps ODP RDMA page-aligned on rxe",
    },
    Difference {
        quirk: Quirk::DeregBusyIsEinval,
        soft: "dereg_mr with a bound window: EBUSY",
        rxe: "EINVAL",
        reason: "EBUSY says what is wrong; both refuse and keep the region",
    },
    Difference {
        quirk: Quirk::UnbindNeedsRegion,
        soft: "zero-length bind with or without a region unbinds",
        rxe: "NULL region segfaults in the provider",
        reason: "rdma-pool always passes the region; the soft NIC does not need the workaround",
    },
    Difference {
        quirk: Quirk::Type2WindowsBeforeQp,
        soft: "QP destroy with type 2 windows bound: immediate",
        rxe: "stalls about 50 s (error -110)",
        reason: "a bound window holds its QP alive in rdma-pool's handles, so order is always right",
    },
    Difference {
        quirk: Quirk::ErrCmdRegionStillWorks,
        soft: "after ERR_CMD the region's keys are refused",
        rxe: "the region keeps working",
        reason: "ibv_rereg_mr(3): after ERR_CMD the MR must not be used; hardware may have torn it down",
    },
    Difference {
        quirk: Quirk::NoDevx,
        soft: "UMEM registration with page-size bitmap checks",
        rxe: "Unsupported (not an mlx5 device)",
        reason: "DEVX is mlx5-only; the soft NIC models it so queue-memory code is tested",
    },
    Difference {
        quirk: Quirk::HugetlbAccessRefused,
        soft: "IBV_ACCESS_HUGETLB accepted as a hint",
        rxe: "EOPNOTSUPP (\"access = 0x87 not supported\"); MAP_HUGETLB memory registers without it",
        reason: "the flag is a valid hint on mlx5; the pool retries without it on EOPNOTSUPP",
    },
    Difference {
        quirk: Quirk::LocalErrorsReportedAsFlush,
        soft: "a local failure completes with its own status (LOC_PROT_ERR, MW_BIND_ERR, LOC_QP_OP_ERR)",
        rxe: "the failing request itself completes with WR_FLUSH_ERR",
        reason: "hardware reports the cause (IB spec 10.8.3); callers must not rely on the exact status on rxe",
    },
    Difference {
        quirk: Quirk::PinnedPagesOutliveTheMapping,
        soft: "an access to a pinned region whose pages were dropped, unmapped, remapped or made inaccessible fails (LOC_ACCESS_ERR / REM_ACCESS_ERR), counted",
        rxe: "moves the pages pinned at registration: old bytes are read, writes land in pages the process no longer sees",
        reason: "user space cannot keep the old pages alive; failing loudly is the only alternative to moving bytes the hardware would not (soft/pin.rs)",
    },
    Difference {
        quirk: Quirk::RecvProtectionIsQpOpErr,
        soft: "receive into a region without LOCAL_WRITE: LOC_PROT_ERR on the receiver, REM_OP_ERR on the sender",
        rxe: "LOC_QP_OP_ERR on the receiver (copy_data fails: malformed WQE), REM_OP_ERR on the sender",
        reason: "the IB spec and mlx5 report a local protection error for an lkey without the right",
    },
    Difference {
        quirk: Quirk::LimitIsEinval,
        soft: "above max_mr / max_mw: Error::Limit (errno ENOMEM)",
        rxe: "EINVAL from its object pool, mapped to Error::Limit by the verbs backend when the count is at the limit",
        reason: "ENOMEM says what is wrong; the pool treats both as \"limit reached\"",
    },
    Difference {
        quirk: Quirk::BindBehindRnrRetryFails,
        soft: "a type 1 bind behind a SEND waiting for a receive completes after it, in order",
        rxe: "the SEND and the bind complete with WR_FLUSH_ERR and the QP fails",
        reason: "IB RNR retry retransmits the SEND only; the pool never binds behind an unacknowledged SEND on rxe",
    },
    Difference {
        quirk: Quirk::LongWindowsAccepted,
        soft: "a bind above 2 GiB: EOPNOTSUPP at the call / post (as mlx5's set_bind_wr)",
        rxe: "accepted (rxe_check_bind_mw has no length cap; read in the source: the guest cannot register a region that large with MW_BIND)",
        reason: "mlx5 describes windows with 2 GiB KLMs; a grant never spans more than one buffer anyway",
    },
    Difference {
        quirk: Quirk::SendWithInvNotReported,
        soft: "the receive completion reports the invalidated rkey (IBV_WC_WITH_INV)",
        rxe: "the window is invalidated but the completion does not say so",
        reason: "the IB spec and mlx5 report it; the pool revokes by LOCAL_INV on rxe",
    },
    Difference {
        quirk: Quirk::UnsignaledSlotsFreedEarly,
        soft: "max_send_wr unsignaled requests fill the send queue until a signaled one completes: ENOMEM",
        rxe: "every completed request frees its slot, signaled or not",
        reason: "mlx5 reclaims send-queue slots only up to the last polled completion; code written against rxe deadlocks there",
    },
    Difference {
        quirk: Quirk::RecvAfterErrorWaits,
        soft: "a receive posted to a QP in the error state completes at once with WR_FLUSH_ERR",
        rxe: "it stays queued and never completes",
        reason: "the IB spec flushes work requests posted in the error state, as mlx5 does; a receive waiting forever hides a dead connection",
    },
];

/// True when `quirk` applies to the device described by `caps`.
///
/// # Examples
/// ```
/// use rdma_pool::nic::{Nic, quirks::{applies, Quirk}};
/// assert!(!applies(Nic::soft().caps(), Quirk::MwBoundsNotEnforced));
/// ```
pub fn applies(caps: &Caps, quirk: Quirk) -> bool {
    caps.driver == "rxe" && RXE.iter().any(|d| d.quirk == quirk)
}
