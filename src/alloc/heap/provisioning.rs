//! The provisioning heap: where a pool serves what is allocated while its thread provisions
//! memory — registers, re-registers, deregisters, opens a device (`sys/provision.rs`): with the
//! pool as global allocator, the NIC layer's bookkeeping.
//!
//! Why a heap of its own: such a block — a registration's handle, an entry of the soft NIC's
//! tables — lives as long as what it registers, not as long as the thread that happened to
//! provision it. Served from that thread's heap, one record kept one page of a thread that
//! exited, and in a pinned pool the step under that page stayed registered: 600 threads that
//! came and went left ~1,100 such pages and 70 MiB registered (`threads`, 1.5 s after the end;
//! 5 MiB now). Here the records of the whole process share a few pages.
//!
//! Contract: one heap is no thread's (`heaps.rs` reserves it on first use, never on the free
//! stack). While a thread holds a mark its own heaps are hidden (`tls.rs`) and its small
//! allocations come here: inside the fork gate (a child never finds the heap held) it swaps the
//! heap's owner from 0 to [`PROVISIONING`] (a few tries, yielding between them), allocates
//! through the heap's ordinary paths (growth is refused under the mark: no NIC call nests here)
//! and puts the owner back to 0. When the heap stays held — by another provisioning thread, or a
//! purge collecting it — or has no page without growing, it returns null, and a global allocator
//! serves the block from its bootstrap region: it never waits on a holder that may wait for a lock
//! the caller holds. Every free of these blocks is a remote free (no thread's ways name the heap);
//! a purge pass collects it as it collects the heaps of exited threads (`purge.rs`).
//!
//! One heap, not several: each keeps partly used pages of its own (in a pinned pool, a step
//! each), and a hold lasts one allocation while a registration takes microseconds (`threads`,
//! 600 threads, pinned: eight heaps left 13 MiB registered 1.5 s after the run, one 5.6 MiB,
//! and they served as many blocks: the bootstrap region's share is blocks that needed a fresh
//! page, not a held heap).
//!
//! Invariant: the provisioning heap's owner is [`PROVISIONING`] only inside
//! [`Core::alloc_provisioning`], else 0 or the purge's token.

use crate::alloc::class::class_for;
use crate::alloc::{Core, MAX_SMALL_ALIGN};
use std::alloc::Layout;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// The owner token of the provisioning heap while an allocation holds it (no thread's token:
/// those are addresses; the purge's is `u64::MAX`).
pub(crate) const PROVISIONING: u64 = u64::MAX - 1;

/// Swaps tried before the caller falls back.
const TRIES: usize = 16;

impl Core {
    /// A small block for an allocation made under a provisioning mark, from the pool's
    /// provisioning heap (module contract); null when the layout is not a small class, the heap
    /// stays held by someone else, or it has no memory without growing (a global allocator
    /// then serves the allocation from its bootstrap region).
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
        for _ in 0..TRIES {
            if heap
                .owner
                .compare_exchange(0, PROVISIONING, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                heap.generation
                    .store(crate::sys::atfork::generation(), Ordering::Relaxed);
                if !heap.initialised.load(Ordering::Acquire) {
                    heap.init(inner);
                }
                let p = if zero {
                    heap.alloc_zeroed(c, size)
                } else {
                    heap.alloc(c)
                };
                heap.owner.store(0, Ordering::Release);
                return p;
            }
            std::thread::yield_now();
        }
        null_mut()
    }
}
