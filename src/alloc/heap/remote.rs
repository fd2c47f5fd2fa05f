//! Frees from other threads: a block freed by a thread that does not own its page goes onto the
//! page's `thread_free` list; a full page its owner keeps is then pushed on the owner's
//! `notify` stack (drained on the owner's slow path), and an abandoned page (its owner let it
//! go) is reclaimed by the heap that abandoned it, or collected by the free that brings its
//! count of remote frees to what it had out. See the contract of `heap.rs`.

use super::*;

impl Heap {
    /// Free from a thread whose heap in the pool is `me` (null for none) into a page `me` does
    /// not own: onto the page's `thread_free`; a full page kept by its owner is then pushed on
    /// the owner's `notify` stack, an abandoned one claimed.
    pub(crate) fn free_remote(pool: &PoolInner, page: &Page, p: *mut u8, me: *mut Heap) {
        if page.push_thread_free(p.cast()) {
            let heap = page.heap.load(Ordering::SeqCst);
            if is_heap(heap) {
                // SAFETY: a page's heap lives as long as the pool; the notified flag makes this
                // thread the only one pushing the page (onto its owner's stack now).
                unsafe { (*heap).push_notify(page) };
                return;
            }
            // The owner let the page go between this free's look at `in_full` and its flag:
            // nobody will drain a notification, so the flag is this thread's to lower (left
            // set, the page's next owner could never retire it nor be notified of it).
            page.notified.store(false, Ordering::Release);
        }
        if page.heap.load(Ordering::SeqCst) == ABANDONED {
            Heap::reclaim(pool, page, me);
        }
    }

    /// A block was just freed into an abandoned page by a thread whose heap in the pool is
    /// `me` (null for none). The heap that abandoned the page takes it back (its queue; the
    /// page then serves its allocations, or is retired when empty). Any other free only
    /// counts itself (`remote_frees`) until the count reaches the blocks the page had out when
    /// abandoned; that free claims the page just long enough to collect it: retired when
    /// empty, else abandoned again. Every free into an abandoned page after its abandoning
    /// check counts (Dekker), so the count is reached at the latest by the last block; a
    /// stale count from an earlier abandonment may reach it early, and the claim then finds
    /// blocks still out and abandons the page again.
    #[cold]
    #[inline(never)]
    pub(super) fn reclaim(pool: &PoolInner, page: &Page, me: *mut Heap) {
        // SAFETY: `me`, when a heap, is this thread's heap in the pool.
        let adopt =
            is_heap(me) && std::ptr::eq(page.former.load(R), me) && !unsafe { &*me }.orphaned();
        if !adopt {
            let counted = page.remote_frees.fetch_add(1, Ordering::AcqRel) + 1;
            // `used` is frozen while the page is abandoned (racy only against a claimer).
            if counted < page.used.load(R) {
                return;
            }
        }
        let token = if adopt { me } else { CLAIMED };
        loop {
            if page
                .heap
                .compare_exchange(ABANDONED, token, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                // Another thread claimed it: its blocks are that thread's business now.
                return;
            }
            // The page is this thread's: its owner-only fields were published by the
            // abandoning store, which the CAS read.
            page.collect();
            if page.used.load(R) == 0 {
                pool.retire_page(page);
                pool.maybe_purge();
                return;
            }
            if adopt {
                pool.set_owner(page, me);
                // SAFETY: `me` is this thread's heap.
                let heap = unsafe { &*me };
                heap.enqueue(
                    page.class.load(R) as usize,
                    page as *const Page as *mut Page,
                );
                return;
            }
            // Abandon it again; a block freed meanwhile saw `CLAIMED` and left it to us.
            page.remote_frees.store(0, Ordering::Relaxed);
            page.heap.store(ABANDONED, Ordering::SeqCst);
            if page.thread_free.load(Ordering::SeqCst).is_null() {
                return;
            }
        }
    }

    /// Give up a full page of class `c` (already out of the queue). False when a remote free
    /// raced in and the page stays (the caller requeues it).
    pub(super) fn abandon(&self, page: &Page) -> bool {
        page.former.store(self.me(), R);
        page.remote_frees.store(0, Ordering::Relaxed);
        self.pool().set_owner(page, ABANDONED);
        if page.thread_free.load(Ordering::SeqCst).is_null() {
            return true;
        }
        // A block came back while the page changed hands: take it back, unless the thread
        // that freed it already claimed the page.
        if page
            .heap
            .compare_exchange(ABANDONED, self.me(), Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            self.pool().set_owner(page, self.me());
            return false;
        }
        true
    }

    pub(super) fn push_notify(&self, page: &Page) {
        let pp = page as *const Page as *mut Page;
        let mut head = self.notify.load(R);
        loop {
            page.notify_next.store(head, R);
            match self
                .notify
                .compare_exchange_weak(head, pp, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Requeue the full pages other threads freed into.
    pub(super) fn drain_notify(&self) {
        if self.notify.load(R).is_null() {
            return;
        }
        let mut p = self.notify.swap(null_mut(), Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: pages on the stack are pages of the pool's page table (they live as long
            // as the pool), pushed while they were this heap's.
            let page = unsafe { &*p };
            p = page.notify_next.load(R);
            // This pop ends the notification: no other free could raise the flag while the
            // page was on this stack, so lowering it cannot make a second push.
            page.notified.store(false, Ordering::Release);
            if page.heap.load(Ordering::Acquire) != self.me() {
                // The page left this heap after its push (abandoned, reclaimed, taken by
                // another heap): its queues are its owner's now. Requeued here, two heaps
                // would count its blocks, and one could retire it with blocks live.
                continue;
            }
            if page.in_full.load(R) {
                let c = page.class.load(R) as usize;
                page.in_full.store(false, R);
                self.full[c].fetch_sub(1, R);
                self.enqueue(c, page as *const Page as *mut Page);
            }
        }
    }
}
