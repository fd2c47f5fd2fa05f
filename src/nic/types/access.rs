//! The rights and flags of regions and windows: [`Access`], [`ReregFlags`], the advice of
//! `ibv_advise_mr` ([`Advice`], [`AdviseFlags`], [`MAX_ADVISE_SGES`]) and [`MwType`].
//!
//! Crate-private here: [`RawMr`], a region as a backend reports it (held by `ReregError`, so it
//! lives with the plain data rather than with the backend trait), and [`MrAttrs`] with
//! [`ReregFlags::resolve`], the one place that says which attributes a re-registration changes.

use super::{Lkey, Rkey};
use bitflags::bitflags;

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
