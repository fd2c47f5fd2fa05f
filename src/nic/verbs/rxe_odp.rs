//! The rxe ODP guard: kernel Soft-RoCE moves the wrong bytes for RDMA READ into / WRITE from a
//! local ODP region unless every packet starts on a page boundary (page-aligned entries at path
//! MTU 4096). The guard refuses such posts with `Unsupported` instead of letting a success
//! completion cover corrupted data, and warns once per device when an ODP region is registered
//! below that MTU.
//!
//! Contract:
//! - on every device but rxe the guard is inactive: its methods do nothing and allocate nothing;
//! - on rxe it keeps the lkeys of live ODP regions in a set; a registration and its set insert
//!   (a deregistration and its removal) happen under the set's write lock, so a reused lkey is
//!   never removed for the wrong region. An insert may allocate when the set grows;
//! - the path MTU it checks is the smaller of port 1's at open and the smallest any QP of the
//!   device connected with.

use crate::nic::error::{Error, Result, Verb};
use crate::nic::types::{RawMr, Sge};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{RwLock, RwLockWriteGuard};

/// The path MTU from which rxe moves ODP data correctly (for page-aligned buffers).
const RXE_ODP_SAFE_MTU: u32 = 4096;

/// See the module contract.
#[derive(Debug)]
pub(super) struct RxeOdpGuard {
    /// True on rxe only.
    active: bool,
    /// Port 1's path MTU at open, in bytes.
    port_mtu: u32,
    /// The warning was logged.
    warned: AtomicBool,
    /// lkeys of live ODP regions.
    lkeys: RwLock<HashSet<u32>>,
    /// The smallest path MTU (bytes) a QP connected with; `u32::MAX` before the first connect.
    conn_mtu: AtomicU32,
}

impl RxeOdpGuard {
    pub(super) fn new(is_rxe: bool, port_mtu: u32) -> RxeOdpGuard {
        RxeOdpGuard {
            active: is_rxe,
            port_mtu,
            warned: AtomicBool::new(false),
            lkeys: RwLock::default(),
            conn_mtu: AtomicU32::new(u32::MAX),
        }
    }

    /// Whether RDMA data through local ODP regions can be trusted (see
    /// [`VerbsNic::odp_rdma_safe`](super::VerbsNic::odp_rdma_safe)).
    pub(super) fn safe(&self) -> bool {
        !self.active || self.port_mtu >= RXE_ODP_SAFE_MTU
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashSet<u32>> {
        self.lkeys.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `reg`, a registration; when it made an ODP region (`odp`) on rxe, track its lkey.
    /// Logs the warning (once) for an ODP region below the safe MTU.
    pub(super) fn track_reg(
        &self,
        device: &str,
        odp: bool,
        reg: impl FnOnce() -> Result<RawMr>,
    ) -> Result<RawMr> {
        if odp && !self.safe() && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                device,
                path_mtu = self.port_mtu,
                "ODP region on rxe below path MTU 4096: RDMA READ/WRITE through it can move the \
                 wrong bytes (kernel bug); use pinned regions for RDMA data, or page-aligned \
                 buffers with link MTU 9000"
            );
        }
        let mut keys = (self.active && odp).then(|| self.write());
        let raw = reg()?;
        if let Some(keys) = keys.as_mut() {
            keys.insert(raw.lkey.0);
        }
        Ok(raw)
    }

    /// Run `dereg`, the deregistration of the region with `lkey`; once it succeeded, forget it.
    pub(super) fn track_dereg(&self, lkey: u32, dereg: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut keys = self.active.then(|| self.write());
        dereg()?;
        if let Some(keys) = keys.as_mut() {
            keys.remove(&lkey);
        }
        Ok(())
    }

    /// A QP of the device connected with path MTU `mtu` bytes.
    pub(super) fn connected(&self, mtu: u32) {
        self.conn_mtu.fetch_min(mtu, Ordering::Relaxed);
    }

    /// Refuse local ODP scatter/gather entries whose data rxe would move wrongly: every packet
    /// must start on a page boundary, so each ODP entry must be page-aligned and begin at a
    /// message offset that is a multiple of the path MTU, which must be the page size.
    ///
    /// # Errors
    /// `Unsupported` for the first such entry, naming its address, offset and the MTU.
    pub(super) fn check(&self, verb: Verb, sges: &[Sge]) -> Result<()> {
        if !self.active {
            return Ok(());
        }
        let odp = self.lkeys.read().unwrap_or_else(|e| e.into_inner());
        if odp.is_empty() {
            return Ok(());
        }
        let page = u64::from(RXE_ODP_SAFE_MTU);
        let mtu = self.port_mtu.min(self.conn_mtu.load(Ordering::Relaxed));
        let mut offset = 0u64;
        for sge in sges {
            if odp.contains(&sge.lkey.0)
                && (sge.addr % page != 0 || offset % page != 0 || mtu < RXE_ODP_SAFE_MTU)
            {
                let detail = format!(
                    "rxe moves wrong bytes for ODP data whose packets do not start on a page \
                     boundary (address {:#x} at message offset {offset}, path MTU {mtu}); use \
                     a pinned region, or page-aligned entries at path MTU 4096",
                    sge.addr
                );
                return Err(Error::unsupported(verb, detail));
            }
            offset += u64::from(sge.length);
        }
        Ok(())
    }
}
