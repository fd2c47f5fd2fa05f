//! Re-registration (`ibv_rereg_mr`) on the soft NIC, and which devices keep keys when.
//!
//! Contract: the three flags resolve as [`ReregFlags::resolve`] says; input errors that the
//! layer above cannot see (a PD that does not exist) are `ERR_CMD`, after which the region is
//! poisoned, as `ibv_rereg_mr(3)` allows; a successful call keeps or changes the keys per
//! [`ReregMode`]. The mlx5 model ([`ReregMode::Mlx5`]) follows `mlx5_ib_rereg_user_mr`
//! (drivers/infiniband/hw/mlx5/mr.c, 6.x mkey cache):
//!
//! - PD and/or access changes whose access difference stays within `LOCAL_WRITE`,
//!   `REMOTE_WRITE`, `REMOTE_READ`, `RELAXED_ORDERING`, `REMOTE_ATOMIC` are a UMR in place
//!   (`can_use_umr_rereg_access`): keys kept, no revoke; any other access change (`MW_BIND`,
//!   `ON_DEMAND`, …) builds a new mkey: new keys;
//! - a translation change of an ODP region always builds a new mkey: new keys;
//! - a translation change of a pinned region keeps the keys only when the region's mkey came
//!   from the cache and the new translation fits the cache entry's descriptors
//!   (`can_use_umr_rereg_pas`); else new keys. Cache entries hold `4 << i` descriptors: a
//!   region of `n` DMA blocks (pages of its backing page size) gets the smallest entry with
//!   `ndescs >= n`, i.e. `max(4, n.next_power_of_two())`, up to `4 << 20` blocks (16 GiB of
//!   4 KiB pages, devices with extended UMR translation); larger regions are not cached;
//! - when the keys are kept on a translation change, the mkey is *revoked* while it is
//!   updated (`mlx5r_umr_revoke_mr`): traffic on its keys fails meanwhile. The soft NIC keeps
//!   it revoked for [`SoftConfig::umr_revoke_time`](super::SoftConfig::umr_revoke_time).
//!
//! Invariant: on success the returned keys name the region; `keep == false` moves the slot
//! to its next variant, so every key handed out before is refused.

use super::config::ReregMode;
use super::counters::bump;
use super::device::Device;
use super::keys::{KeyObj, MrObj};
use super::mem;
use crate::nic::error::{ReregError, ReregErrorKind, Verb};
use crate::nic::types::*;
use std::sync::atomic::Ordering;

/// The largest cache entry, in DMA blocks (`4 << MKEY_CACHE_LAST_STD_ENTRY`).
const MLX5_CACHE_MAX_BLOCKS: u64 = 4 << 20;

/// Access bits a UMR may change in place (`can_use_umr_rereg_access`).
const UMR_ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::RELAXED_ORDERING)
    .union(Access::REMOTE_ATOMIC);

/// DMA blocks `[addr, addr + len)` spans at the best page size mlx5 would pick: the backing
/// page size where the start is aligned to it, else the base page.
fn dma_blocks(addr: usize, len: usize) -> u64 {
    /// The smallest huge page: a start not aligned to it has base-page blocks, whatever backs
    /// it (and `/proc/self/smaps`, slow to read, is not consulted).
    const MIN_HUGE_PAGE: usize = 2 << 20;
    let base = mem::page_size();
    let page = (addr % MIN_HUGE_PAGE == 0)
        .then(|| mem::backing_page_size(addr))
        .flatten()
        .filter(|&p| p > base && addr % p == 0)
        .unwrap_or(base);
    ((addr + len).div_ceil(page) - addr / page) as u64
}

/// The descriptors of the cache entry an mlx5 registration of `[addr, addr + len)` would take,
/// or `None` when it is not cached (ODP regions are cached too, but their translation changes
/// never reuse the mkey, so it is not recorded).
pub(super) fn mlx5_cache_entry(addr: usize, len: usize, odp: bool) -> Option<u64> {
    if odp || len == usize::MAX {
        return None;
    }
    let blocks = dma_blocks(addr, len);
    (blocks <= MLX5_CACHE_MAX_BLOCKS).then(|| blocks.next_power_of_two().max(4))
}

/// Whether mlx5 keeps the keys of `old` re-registered to `new` with `flags`.
fn mlx5_keeps_keys(old: &MrObj, flags: ReregFlags, new: &MrAttrs) -> bool {
    let access_in_place = !(old.access ^ new.access).intersects(!UMR_ACCESS);
    if !flags.contains(ReregFlags::CHANGE_TRANSLATION) {
        return access_in_place;
    }
    let odp = old.odp.is_some() || new.access.contains(Access::ON_DEMAND);
    access_in_place
        && !odp
        && old
            .cache_ndescs
            .is_some_and(|n| dma_blocks(new.addr, new.len) <= n)
}

/// `ibv_rereg_mr` of region `mr` (a key-table index) to the `requested` attributes whose
/// flags are set. See the module contract.
pub(super) fn rereg(
    dev: &Device,
    mr: u64,
    flags: ReregFlags,
    requested: MrAttrs,
) -> Result<RawMr, ReregError> {
    let index = mr as u32;
    let cmd = |errno| ReregError::new(ReregErrorKind::Cmd, errno);
    let mut slot = dev.keys.write(index);
    let Some(KeyObj::Mr(old)) = slot.obj.as_mut() else {
        return Err(ReregError::new(ReregErrorKind::Input, libc::EINVAL));
    };
    if old.num_mw.load(Ordering::Acquire) > 0 {
        return Err(ReregError::new(ReregErrorKind::Input, libc::EBUSY));
    }
    // An injected DO_FORK_OLD happens after the command: the new translation is in force.
    let mut fork_old = None;
    if let Some((errno, kind)) = dev.injected(Verb::ReregMr) {
        if kind == ReregErrorKind::DoForkOld {
            fork_old = Some(errno);
        } else {
            if !kind.mr_usable() {
                old.usable = false;
            }
            return Err(ReregError::new(kind, errno));
        }
    }
    if dev.config.rereg == ReregMode::Unsupported {
        // rdma-core's rxe has no rereg_mr: libibverbs reports ERR_CMD with EOPNOTSUPP, after
        // which ibv_rereg_mr(3) says the MR must not be used.
        old.usable = false;
        return Err(cmd(libc::EOPNOTSUPP));
    }
    if flags.contains(ReregFlags::CHANGE_PD) && !dev.pd_exists(requested.pd) {
        old.usable = false;
        return Err(cmd(libc::EINVAL));
    }
    let new = flags.resolve(
        MrAttrs {
            pd: old.pd,
            addr: old.addr,
            len: old.len,
            access: old.access,
        },
        requested,
    );
    let keep = match dev.config.rereg {
        ReregMode::KeepKeys => true,
        ReregMode::Mlx5 => mlx5_keeps_keys(old, flags, &new),
        ReregMode::ChangeKeys | ReregMode::Unsupported => false,
    };
    let revoke = dev.config.rereg == ReregMode::Mlx5
        && flags.contains(ReregFlags::CHANGE_TRANSLATION)
        && !dev.config.umr_revoke_time.is_zero();
    if keep && revoke {
        // mlx5 revokes the mkey before loading the new translation: traffic on its keys fails
        // meanwhile. The caller owns the region exclusively (`&mut Mr`), so it is still there.
        old.revoked = true;
        drop(slot);
        std::thread::sleep(dev.config.umr_revoke_time);
        slot = dev.keys.write(index);
    }
    let Some(KeyObj::Mr(old)) = slot.obj.as_mut() else {
        return Err(cmd(libc::EINVAL));
    };
    if flags.contains(ReregFlags::CHANGE_TRANSLATION)
        && old
            .pins
            .as_ref()
            .is_some_and(|p| !p.held(old.addr, old.len))
    {
        bump(&dev.counters.stale_pinned_releases, 1);
    }
    // Release the old pin before charging the new one (the kernel re-pins in place).
    dev.memlock.release(old.pinned);
    old.pinned = 0;
    let cache_entry = old.cache_ndescs;
    match dev.make_mr(new.pd, new.addr, new.len, new.access) {
        Ok(region) => {
            let old_pd = old.pd;
            *old = region;
            if keep {
                // The same mkey: the same cache entry.
                old.cache_ndescs = cache_entry;
            }
            if old_pd != new.pd {
                dev.pd_ref(old_pd, -1);
                dev.pd_ref(new.pd, 1);
            }
        }
        Err(errno) => {
            // The command failed half-way: the region keeps no valid translation.
            old.usable = false;
            old.revoked = false;
            return Err(cmd(errno));
        }
    }
    if !keep {
        slot.variant = slot.variant.wrapping_add(1);
    }
    // The new translation may be ODP where the old one was not.
    dev.keys.mark_odp(index, slot.obj.as_ref());
    let key = index << 8 | slot.variant as u32;
    bump(&dev.counters.reregs, 1);
    let raw = RawMr {
        handle: mr,
        lkey: Lkey(key),
        rkey: Rkey(key),
        addr: new.addr,
        len: new.len,
    };
    match fork_old {
        Some(errno) => Err(ReregError::replaced(raw, errno)),
        None => Ok(raw),
    }
}
