//! Provisioning marks: "this thread is inside code that calls the NIC".
//!
//! Contract: the arena holds a [`Provisioning`] mark for the whole of every operation that may
//! call into `nic` (creating the arena, growing it, dropping it), and a global allocator built
//! on the pool holds one while it opens its device. The NIC layer's Rust code allocates (handles,
//! errors, the soft NIC's tables); with the pool as global allocator those allocations re-enter
//! it. While a mark is held the arena refuses to grow
//! ([`Error::Reentrant`](crate::arena::Error::Reentrant)), so a re-entrant allocation never
//! recurses into another registration (no lock and no half-updated page state is held across a
//! NIC call — the only NIC calls are in `Arena::alloc_run`, reached from a heap's slow path
//! after its page loop, with no page pointer held, and from medium and large allocation with no
//! lock held); the global allocator serves such allocations outside the thread's heaps (below),
//! from its bootstrap region as it does when [`active`] while the pool is not ready yet.
//!
//! The first mark a thread takes (and the last it drops) tells the allocator through
//! `set_hook`: the allocator hides the thread's heaps meanwhile, and a global allocator built on
//! the pool serves the thread's allocations outside them — the NIC layer's bookkeeping (a
//! registration's handle, the soft NIC's tables) lives as long as what it registers, and in a
//! thread's pages one such block kept a page, and a pinned step, of a thread that exited.
//!
//! Invariant: `DEPTH` == number of live `Provisioning` values created on this thread. The
//! thread-local has a const initialiser and no destructor, so it is readable at any point of a
//! thread's life, including while other thread-locals are being destroyed.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

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
        let _ = DEPTH.try_with(|d| {
            let depth = d.get();
            d.set(depth + 1);
            if depth == 0 {
                call_hook(true);
            }
        });
        Provisioning {
            _not_send: PhantomData,
        }
    }
}

impl Drop for Provisioning {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| {
            let depth = d.get().saturating_sub(1);
            d.set(depth);
            if depth == 0 {
                call_hook(false);
            }
        });
    }
}

/// What a higher layer runs when a thread takes its first mark (`true`) and drops its last
/// (`false`): a plain function, no allocation (null: none).
static HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Install the hook (once per process, by the allocator; later calls replace it with the same).
pub(crate) fn set_hook(hook: fn(bool)) {
    HOOK.store(hook as *mut (), Ordering::Release);
}

#[inline]
fn call_hook(first: bool) {
    let h = HOOK.load(Ordering::Acquire);
    if !h.is_null() {
        // SAFETY: only `set_hook` stores here, a `fn(bool)`.
        let hook: fn(bool) = unsafe { std::mem::transmute::<*mut (), fn(bool)>(h) };
        hook(first);
    }
}

/// True while this thread holds a [`Provisioning`] mark.
#[inline(always)]
pub fn active() -> bool {
    DEPTH.try_with(|d| d.get() != 0).unwrap_or(false)
}
