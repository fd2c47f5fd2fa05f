//! Provisioning marks: "this thread is inside code that calls the NIC".
//!
//! Contract: the arena holds a [`Provisioning`] mark for the whole of every operation that may
//! call into `nic` (creating the arena, growing it, dropping it), and a global allocator built
//! on the pool holds one while it opens its device. The NIC layer's Rust code allocates (handles,
//! errors, the soft NIC's tables); with the pool as global allocator those allocations re-enter
//! it. While a mark is held the arena refuses to grow
//! ([`Error::Reentrant`](crate::arena::Error::Reentrant)), so a re-entrant allocation never
//! recurses into another registration: the pool serves it from what it has (its fast paths
//! hold no lock and no half-updated state across a NIC call — the only NIC calls are in
//! `Arena::alloc_run`, reached from a heap's slow path after its page loop, with no page
//! pointer held, and from medium and large allocation with no lock held), and what
//! would need growth the global allocator serves from its bootstrap region, as it does when
//! [`active`] while the pool is not ready yet.
//!
//! Invariant: `DEPTH` == number of live `Provisioning` values created on this thread. The
//! thread-local has a const initialiser and no destructor, so it is readable at any point of a
//! thread's life, including while other thread-locals are being destroyed.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// A mark held while this thread provisions memory (calls into the NIC). Not `Send`.
#[derive(Debug)]
pub struct Provisioning {
    _not_send: PhantomData<*const ()>,
}

impl Provisioning {
    /// Mark this thread as provisioning until the value is dropped (nests).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::arena::provision::{Provisioning, active};
    /// assert!(!active());
    /// let mark = Provisioning::enter();
    /// assert!(active());
    /// drop(mark);
    /// assert!(!active());
    /// ```
    #[inline]
    pub fn enter() -> Provisioning {
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        Provisioning {
            _not_send: PhantomData,
        }
    }
}

impl Drop for Provisioning {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// True while this thread holds a [`Provisioning`] mark.
#[inline(always)]
pub fn active() -> bool {
    DEPTH.try_with(|d| d.get() != 0).unwrap_or(false)
}
