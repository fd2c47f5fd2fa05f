//! Checked frees: [`Core::try_free`] refuses, with a [`FreeError`], what [`Core::free`] would
//! ignore or be corrupted by — a pointer outside the pool, one into the middle of a block, a
//! block already free — wherever the pool can tell cheaply.
//!
//! Contract: the checks read the page table and, for a small block of the calling thread's
//! own page, walk that page's free lists and the thread's cache (bounded by the page's
//! capacity), and for a block of another thread's page read that thread's cache (racily: its
//! slots are atomics); they take no lock. What they cannot see
//! is reported as freeable: a block freed by *another* thread and not yet collected by the
//! page's owner, and a block of another thread's page back on that page's free list (the list
//! is the owner's, not read from here). A checked free costs more than [`Core::free`]: it is for boundaries where
//! pointers come from outside (FFI, a peer's message), not for the fast path.

use super::class::{CLASSES, class_of};
use super::page::{Block, LARGE, LARGE_FREE, SMALL};
use super::{Core, tls};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

/// Why [`Core::try_free`] refused a pointer (nothing was freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FreeError {
    /// The pointer is not inside the pool's reservation (or is null).
    #[error("the pointer is not memory of this pool")]
    Foreign,
    /// The pointer lies inside a block but is not its first byte.
    #[error("the pointer is {offset} bytes into a block, not its start")]
    Interior {
        /// Bytes from the block's first byte.
        offset: usize,
    },
    /// No live block starts there: it was freed already, or never handed out.
    #[error("no live block starts here: a double free, or memory never handed out")]
    NotLive,
}

impl Core {
    /// Free `p` after checking that a live block of this pool starts there.
    ///
    /// # Errors
    /// [`FreeError::Foreign`] for a pointer outside the pool (or null),
    /// [`FreeError::Interior`] for one into the middle of a block, [`FreeError::NotLive`] for
    /// a block already free (a double free) or memory never handed out. Nothing is freed on
    /// error.
    ///
    /// # Safety
    /// Nobody uses the block after the call (as for [`Core::free`]); unlike `free`, `p` may be
    /// any pointer.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::{Pool, alloc::FreeError};
    /// use std::alloc::Layout;
    /// let pool = Pool::new(&rdma_pool::nic::Nic::soft().alloc_pd()?)?;
    /// let p = pool.alloc(Layout::from_size_align(256, 8)?);
    /// // SAFETY: nobody uses the block afterwards.
    /// unsafe {
    ///     assert!(matches!(pool.try_free(p.add(8)), Err(FreeError::Interior { offset: 8 })));
    ///     assert_eq!(pool.try_free(std::ptr::null_mut()), Err(FreeError::Foreign));
    ///     pool.try_free(p)?;
    ///     assert_eq!(pool.try_free(p), Err(FreeError::NotLive)); // a double free, caught
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn try_free(&self, p: *mut u8) -> Result<(), FreeError> {
        self.check_live(p)?;
        // SAFETY: a live block of this pool starts at `p`; the caller gives it up.
        unsafe { self.free(p) };
        Ok(())
    }

    /// `Ok` when a live block of this pool starts at `p` (see [`Core::try_free`]).
    ///
    /// # Errors
    /// As [`Core::try_free`].
    pub fn check_live(&self, p: *const u8) -> Result<(), FreeError> {
        let page = self.inner().page_of(p).ok_or(FreeError::Foreign)?;
        let addr = p as usize;
        match page.kind.load(Acquire) {
            SMALL => {
                let (start, bs) = (page.start.load(Relaxed), page.block_size.load(Relaxed));
                let heap = page.heap.load(Relaxed);
                if heap.is_null() || bs == 0 {
                    return Err(FreeError::NotLive);
                }
                let off = addr - start;
                let i = off / bs as usize;
                if i >= page.capacity.load(Relaxed) as usize {
                    return Err(FreeError::NotLive);
                }
                if off % bs as usize != 0 {
                    return Err(FreeError::Interior {
                        offset: off % bs as usize,
                    });
                }
                if heap == tls::heap_of(self.id) && self.owner_holds_free(page, heap, p) {
                    return Err(FreeError::NotLive);
                }
                // Another thread's page: its free lists and its cache are read racily (links
                // and slots are atomics; every link is checked to be a block of the page
                // before it is followed), so a block that thread freed, or another thread
                // freed into the page, is seen in all but a race with the owner's own moves.
                if heap != tls::heap_of(self.id) && lists_hold(page, p) {
                    return Err(FreeError::NotLive);
                }
                // An abandoned page's blocks may sit in the cache of the heap that gave it up.
                let class = class_of(bs as usize).min(CLASSES - 1);
                let holder = if heap == super::heap::ABANDONED {
                    page.former.load(Relaxed)
                } else {
                    heap
                };
                // SAFETY: a page's heap (and its former one) lives as long as the pool.
                if super::heap::is_heap(holder)
                    && (holder != tls::heap_of(self.id) || heap == super::heap::ABANDONED)
                    && unsafe { (*holder).caches(class, p as *mut u8) }
                {
                    return Err(FreeError::NotLive);
                }
                Ok(())
            }
            LARGE if page.start.load(Relaxed) == addr => Ok(()),
            LARGE_FREE if page.start.load(Relaxed) == addr => Err(FreeError::NotLive),
            _ => match self.block_span(addr) {
                Some((start, _)) => Err(FreeError::Interior {
                    offset: addr - start,
                }),
                None => Err(FreeError::NotLive),
            },
        }
    }

    /// Whether `p`, a block of a page this thread's heap owns, is free: in the page's free
    /// list, its list of frees from other threads, or this thread's cache.
    fn owner_holds_free(
        &self,
        page: &super::page::Page,
        heap: *mut super::heap::Heap,
        p: *const u8,
    ) -> bool {
        let cap = page.capacity.load(Relaxed) as usize;
        let walk = |mut b: *mut Block| {
            // At most `capacity` links: a corrupted list cannot loop forever.
            for _ in 0..=cap {
                if b.is_null() {
                    return false;
                }
                if b as *const u8 == p {
                    return true;
                }
                // SAFETY: free blocks of the page, which only this thread (the owner) takes
                // out of these lists; their first word is the link.
                b = unsafe { (*b).next.load(Relaxed) };
            }
            false
        };
        let class = class_of(page.block_size.load(Relaxed) as usize).min(CLASSES - 1);
        walk(page.free.load(Relaxed))
            || walk(page.thread_free.load(Acquire))
            // SAFETY: this thread's own heap.
            || unsafe { (*heap).caches(class, p as *mut u8) }
    }
}

/// Whether `p` is on `page`'s free list or its list of frees from other threads, walked by
/// any thread: each link is loaded atomically and followed only if it is a block of the page
/// (a list the owner changes meanwhile may end the walk early, never lead outside the page).
fn lists_hold(page: &super::page::Page, p: *const u8) -> bool {
    let start = page.start.load(Relaxed);
    let bs = page.block_size.load(Relaxed) as usize;
    let cap = page.capacity.load(Relaxed) as usize;
    if bs == 0 {
        return false;
    }
    let end = start + cap * bs;
    let walk = |mut b: *mut Block| {
        for _ in 0..=cap {
            let a = b as usize;
            if a < start || a >= end || (a - start) % bs != 0 {
                return false;
            }
            if a == p as usize {
                return true;
            }
            // SAFETY: `b` is a block of this page (checked above): committed pool memory
            // while the page is in use; its link is read atomically.
            b = unsafe { (*b).next.load(Acquire) };
        }
        false
    };
    walk(page.free.load(Acquire)) || walk(page.thread_free.load(Acquire))
}
