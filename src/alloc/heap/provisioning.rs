//! The provisioning heap: where a pool serves small blocks allocated while their thread
//! provisions memory — registers, re-registers, deregisters, opens a device
//! (`sys/provision.rs`) — when they must be pool memory: a `GlobalPool` that is the process's
//! `malloc` (the C library, whose other fallback is a mapping per block), and a [`Core`]
//! allocation made under a mark. A `GlobalPool` whose fallback is the system allocator (a Rust
//! program's) serves such blocks from its bootstrap region, then `malloc`: never registered
//! memory.
//!
//! Why not the provisioning thread's own heap: such a block — a registration's handle, an entry
//! of the soft NIC's tables, a page list — lives as long as what it registers, not as long as
//! the thread that happened to register. In that thread's heap one record kept one page of a
//! thread that exited, and in a pinned pool the step under that page stayed registered; records
//! of registrations inside registered pages also keep each other's regions (`threads`, pinned,
//! 600 threads that came and went: ~1,100 such pages and 70 MiB still registered 1.5 s after
//! the end; 2.3–2.6 MiB with the records in `malloc`, 5.4–7.2 MiB with them here).
//!
//! Contract: one heap is no thread's (`heaps.rs` reserves it on first use, never on the free
//! stack). While a thread holds a mark its own heaps are hidden (`tls.rs`): inside the fork gate
//! (a child never finds the heap held) it swaps the heap's owner from 0 to [`PROVISIONING`] (a
//! few tries, yielding between them), allocates a block of at most [`PROVISIONING_MAX`] bytes
//! through the heap's ordinary paths (growth is refused under the mark: no NIC call nests here;
//! larger blocks would take pages sized for them, which records keep) and puts the owner back to
//! 0. When the heap stays held — by another provisioning thread, or a purge collecting it — or has
//! no page without growing, it returns null and the caller serves the block elsewhere (a global
//! allocator: its bootstrap region): it never waits on a holder that may wait for a lock the
//! caller holds. Every free of these blocks is a remote free (no thread's ways name the heap); a
//! purge pass collects it as it collects the heaps of exited threads (`purge.rs`).
//!
//! One heap, not several: each keeps partly used pages of its own (in a pinned pool, a step
//! each), and a hold lasts one allocation while a registration takes microseconds (`threads`,
//! 600 threads, pinned: eight heaps left 13 MiB registered 1.5 s after the run, one 5.6 MiB, and
//! they served as many blocks: the bootstrap region's share was blocks that needed a fresh page,
//! not a held heap).
//!
//! Invariant: the provisioning heap's owner is [`PROVISIONING`] only inside
//! [`Core::alloc_provisioning`], else 0 or the purge's token.

use crate::alloc::Core;
use crate::alloc::class::class_for;
use std::alloc::Layout;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

/// The owner token of the provisioning heap while an allocation holds it (no thread's token:
/// those are addresses; the purge's is `u64::MAX`).
pub(crate) const PROVISIONING: u64 = u64::MAX - 1;

/// The largest block served here: records are small, and a larger class's pages are larger.
pub(crate) const PROVISIONING_MAX: usize = 1024;

/// Swaps tried before the caller falls back.
const TRIES: usize = 16;

impl Core {
    /// A block for an allocation made under a provisioning mark, from the pool's provisioning
    /// heap (module contract); null when the layout is larger than [`PROVISIONING_MAX`] or
    /// aligned to more than 8, the heap stays held by someone else, or it has no memory without
    /// growing (a global allocator then serves the allocation from its bootstrap region).
    pub(crate) fn alloc_provisioning(&self, layout: Layout, zero: bool) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        let Some(c) = (align <= 8 && size <= PROVISIONING_MAX)
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
