//! The free path's quarantine hook: how a feature keeps a freed block from reuse without the
//! allocator knowing the feature. Grants install one (`grant/ledger.rs` parks a block whose
//! key may still work); the core only calls it.
//!
//! Contract: the free path asks the hook only for a block whose granule's `granted` counter
//! is non-zero (one relaxed load on the fast path, the call itself on a `#[cold]` path); a
//! block the hook parks is not freed, and comes back through [`Core::free_plain`] once the
//! feature lets it go. Without a hook every free is an ordinary free.
//!
//! Invariant: `hook` is null or points to a [`Quarantine`] that outlives every use: it is
//! installed by the pool's facade after its features are in place, and cleared (under the
//! pool registry's lock, `tls.rs`) before they go, so no free and no completion router sees
//! a dangling one.

use super::Core;
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{Acquire, Release};

/// A feature's quarantine: `park(ctx, block)` is true when it kept `block` (the first byte of
/// a live block being freed) from reuse.
pub(crate) struct Quarantine {
    /// The feature's state, as the feature knows it.
    pub(crate) ctx: *const (),
    /// Park `block`, or say no (the block is then freed as usual).
    pub(crate) park: unsafe fn(ctx: *const (), block: usize) -> bool,
}

// SAFETY: `ctx` is the state of a `Sync` feature, read through `park` only.
unsafe impl Sync for Quarantine {}
// SAFETY: as above.
unsafe impl Send for Quarantine {}

/// Where a pool's [`Quarantine`] is (null: none).
#[derive(Default)]
pub(crate) struct Hook(AtomicPtr<Quarantine>);

impl Hook {
    /// The installed quarantine, if any.
    #[inline]
    pub(crate) fn get(&self) -> Option<&Quarantine> {
        // SAFETY: null or a quarantine that outlives its installation (module invariant).
        unsafe { self.0.load(Acquire).as_ref() }
    }
}

impl Core {
    /// Install `q` as this pool's quarantine (`None`: take it out), under the pool registry's
    /// lock, so a completion router walking the pools sees the old one or the new one whole.
    ///
    /// # Safety
    /// `q` stays valid until it is taken out again or the pool is dropped, and `q.park` may
    /// be called from any thread.
    pub(crate) unsafe fn set_quarantine(&self, q: Option<&Quarantine>) {
        let p = q.map_or(std::ptr::null_mut(), |q| {
            q as *const Quarantine as *mut Quarantine
        });
        super::tls::with_registry(|| self.inner().quarantine.0.store(p, Release));
    }

    /// The context of the installed quarantine (null: none); for the feature that installed
    /// it, to find its own state from a pool.
    pub(crate) fn quarantine_ctx(&self) -> *const () {
        self.inner()
            .quarantine
            .get()
            .map_or(std::ptr::null(), |q| q.ctx)
    }
}
