//! The provisioning heap: where a global allocator built on the pool puts what the NIC layer
//! allocates while this process provisions memory (registers, re-registers, deregisters, opens
//! a device: `sys/provision.rs`).
//!
//! Why a heap of its own: such a block — a registration's handle, an entry of the soft NIC's
//! tables — lives as long as what it registers, not as long as the thread that happened to
//! provision it. Served from that thread's heap, one record kept one page of a thread that
//! exited, and in a pinned pool the step under that page stayed registered: 600 threads that
//! came and went left ~1,100 such pages and 70 MiB pinned (`threads`, 1.5 s after the end).
//! Here the records of the whole process share a few pages.
//!
//! Contract: the heap is no thread's (`heaps.rs` reserves it, never on the free stack). A
//! provisioning thread holds it for one allocation: inside the fork gate, it swaps the owner
//! from 0 to [`PROVISIONING`] (a few tries; when another holder has it — another provisioning
//! thread, or a purge collecting it — the caller falls back to the bootstrap region, never
//! waiting on a holder that may wait on a lock the caller holds), allocates through the heap's
//! ordinary paths (growth is refused under the mark: no NIC call nests here), and puts the
//! owner back to 0. Every free of its blocks is a remote free (no thread's ways name the heap);
//! a purge pass collects it as it collects the heaps of exited threads (`purge.rs`).
//!
//! Invariant: the heap's owner is [`PROVISIONING`] only inside [`Core::alloc_provisioning`],
//! else 0 or the purge's token.

use super::Heap;
use crate::alloc::class::class_for;
use crate::alloc::{Core, MAX_SMALL_ALIGN};
use std::alloc::Layout;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// The owner token of the provisioning heap while an allocation holds it (no thread's token:
/// those are addresses; the purge's is `u64::MAX`).
pub(crate) const PROVISIONING: u64 = u64::MAX - 1;

/// Swaps tried before the caller falls back.
const TRIES: u32 = 64;

impl Core {
    /// A small block for an allocation made under a provisioning mark, from the pool's
    /// provisioning heap (module contract); null when the layout is not a small class, the
    /// heap is held by someone else, or it has no memory without growing (the caller then
    /// serves the allocation from its bootstrap region).
    pub(crate) fn alloc_provisioning(&self, layout: Layout, zero: bool) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        let Some(c) = (align <= MAX_SMALL_ALIGN)
            .then(|| class_for(size, align))
            .flatten()
        else {
            return null_mut();
        };
        let inner = self.inner();
        let Some(heap) = inner.heaps.meta() else {
            return null_mut();
        };
        // A fork waits until the heap is put back: a child never finds it held.
        let _inside = crate::sys::atfork::inside();
        if !heap.hold() {
            return null_mut();
        }
        if !heap.initialised.load(Ordering::Acquire) {
            heap.init(inner);
        }
        let p = if zero {
            heap.alloc_zeroed(c, size)
        } else {
            heap.alloc(c)
        };
        heap.owner.store(0, Ordering::Release);
        p
    }
}

impl Heap {
    /// Take the provisioning heap for one allocation; false when another holder has it.
    fn hold(&self) -> bool {
        for i in 0..TRIES {
            if self
                .owner
                .compare_exchange(0, PROVISIONING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.generation
                    .store(crate::sys::atfork::generation(), Ordering::Relaxed);
                return true;
            }
            if i % 8 == 7 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        false
    }
}
