//! The in-process fabric: every live soft device by id, so that a QP can connect to a QP of
//! another soft device from its endpoint (GID + QP number), as over a wire.
//!
//! Contract: control path only (device creation, connect); a device is listed from its
//! creation until it is dropped (dead entries are swept at the next creation). A soft GID is a
//! link-local address whose low bytes name the device (`fe80::736f:6674:<id>`), so a GID of
//! another kind never resolves to a soft device.

use super::device::Device;
use super::sync::lock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

static NEXT_DEVICE: AtomicU32 = AtomicU32::new(0);
static FABRIC: Mutex<Vec<(u32, Weak<Device>)>> = Mutex::new(Vec::new());

/// A fresh device id.
pub(super) fn next_id() -> u32 {
    NEXT_DEVICE.fetch_add(1, Ordering::Relaxed)
}

/// List `dev` on the fabric.
pub(super) fn attach(id: u32, dev: &Arc<Device>) {
    // From now on the pages this crate drops reach the live devices' ODP translations.
    crate::sys::os::set_mmu_notifier(super::mmu_notify);
    let mut fabric = lock(&FABRIC);
    fabric.retain(|(_, w)| w.strong_count() > 0);
    fabric.push((id, Arc::downgrade(dev)));
}

/// The live device a GID names.
pub(super) fn device_of(gid: &[u8; 16]) -> Option<Arc<Device>> {
    let id = gid_device(gid)?;
    lock(&FABRIC)
        .iter()
        .find(|(i, _)| *i == id)
        .and_then(|(_, w)| w.upgrade())
}

/// Run `f` on every live device, without allocating. The list's lock is only tried (a
/// device being created may hold it while it allocates, and this runs inside the allocator):
/// after a bounded wait the call is skipped.
pub(super) fn for_each_live(mut f: impl FnMut(&Device)) {
    for _ in 0..1000 {
        match FABRIC.try_lock() {
            Ok(fabric) => {
                for (_, w) in fabric.iter() {
                    if let Some(dev) = w.upgrade() {
                        f(&dev);
                    }
                }
                return;
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                for (_, w) in p.into_inner().iter() {
                    if let Some(dev) = w.upgrade() {
                        f(&dev);
                    }
                }
                return;
            }
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
}

/// A soft device's GID.
pub(super) fn soft_gid(id: u32) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..12].copy_from_slice(b"soft");
    g[12..].copy_from_slice(&id.to_be_bytes());
    g
}

fn gid_device(gid: &[u8; 16]) -> Option<u32> {
    (gid[0] == 0xfe && gid[1] == 0x80 && &gid[8..12] == b"soft")
        .then(|| u32::from_be_bytes([gid[12], gid[13], gid[14], gid[15]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_name_soft_devices_only() {
        assert_eq!(gid_device(&soft_gid(7)), Some(7));
        let mut other = soft_gid(7);
        other[8] = b'x';
        assert_eq!(gid_device(&other), None);
        assert_eq!(gid_device(&[0; 16]), None);
    }
}
