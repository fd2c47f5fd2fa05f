//! Fork safety of the pool's own state: a gate that `fork()` closes (`pthread_atfork`).
//!
//! Contract: every lock of the pool is a [`ForkLock`] (or [`ForkRwLock`]); a thread holding
//! one, or running a slow path that spans several steps between locks (arena growth, purge, a
//! rail's attach or detach; in the allocator, a page or large run changing hands: taken,
//! carved, stolen, retired, freed) under an [`Inside`] token, is *inside*. The prepare handler
//! (installed with the first arena) closes the gate and waits until no other thread is inside;
//! a thread reaching the closed gate waits outside it, holding no pool lock. So when the
//! process forks, no pool lock is held and no slow path is half done: in the child every lock
//! is free, every structure consistent, and the child allocates (`KernelCopies` policy). The
//! parent and child handlers reopen the gate.
//!
//! The wait is bounded ([`DRAIN`]): a thread inside may wait on something a thread outside
//! holds — a provider's or the soft NIC's lock, taken by a thread whose allocation now waits at
//! the gate. Then `fork()` goes ahead after `DRAIN` (counted in [`ForkStats::drain_timeouts`]):
//! the parent never deadlocks, and the child may find a pool lock held (only then).
//!
//! Invariants (`depth` is the thread's nesting of locks and tokens):
//! - `Σ INSIDE[stripe] == |{threads with depth > 0}|` (a thread counts in its own stripe, so
//!   threads on different cores do not contend on one counter);
//! - gate closed and drained ⇒ `Σ INSIDE == [the forking thread's depth > 0]`;
//! - a thread with `depth > 0` never waits at the gate (it may take further locks), and the
//!   forking thread never does (other prepare handlers may allocate).

use crossbeam::utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, Once, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The longest `fork()` waits for the threads inside the pool to leave.
pub const DRAIN: Duration = Duration::from_secs(2);

static CLOSED: AtomicBool = AtomicBool::new(false);
/// Threads inside, counted in stripes (a thread always uses the same one) so that threads on
/// different cores do not share one contended counter: `INSIDE` in the contract is their sum.
static INSIDE: [CachePadded<AtomicUsize>; STRIPES] =
    [const { CachePadded::new(AtomicUsize::new(0)) }; STRIPES];
const STRIPES: usize = 16;
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);
static FORKS: AtomicU64 = AtomicU64::new(0);
static WAITED: AtomicU64 = AtomicU64::new(0);
static LONGEST_NS: AtomicU64 = AtomicU64::new(0);
static TIMEOUTS: AtomicU64 = AtomicU64::new(0);
static GENERATION: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    static FORKER: Cell<bool> = const { Cell::new(false) };
}

/// What the fork gate did, process-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ForkStats {
    /// `fork()` calls the gate saw (prepare handler runs).
    pub forks: u64,
    /// Of those, forks that waited for a thread inside the pool to leave.
    pub waited: u64,
    /// The longest such wait, in nanoseconds.
    pub longest_wait_ns: u64,
    /// Forks that went ahead after [`DRAIN`] with a thread still inside.
    pub drain_timeouts: u64,
    /// How many forks this process is away from the first process (0 in the original, +1 in
    /// each child generation): a child tells its parent's threads from its own by it.
    pub generation: u64,
}

/// The process-wide [`ForkStats`].
///
/// # Examples
/// ```
/// let s = rdma_pool::arena::fork_stats();
/// assert_eq!(s.drain_timeouts, 0);
/// ```
pub fn fork_stats() -> ForkStats {
    ForkStats {
        forks: FORKS.load(SeqCst),
        waited: WAITED.load(SeqCst),
        longest_wait_ns: LONGEST_NS.load(SeqCst),
        drain_timeouts: TIMEOUTS.load(SeqCst),
        generation: GENERATION.load(SeqCst),
    }
}

/// The fork generation of this process (see [`ForkStats::generation`]).
pub(crate) fn generation() -> u64 {
    GENERATION.load(SeqCst)
}

/// Install the `pthread_atfork` handlers (once per process; the arena calls it).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions that touch only atomics and this
        // thread's thread-locals (no allocation, no lock).
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            tracing::warn!(rc, "rdma_pool: pthread_atfork failed; a child forked while threads are inside the pool may find its locks held");
        }
    });
}

/// A thread inside the gate: leaves it when dropped. Not `Send`: it counts its thread.
#[derive(Debug)]
pub(crate) struct Inside {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// This thread's stripe of the count of threads inside.
fn stripe() -> &'static AtomicUsize {
    let mut i = STRIPE.with(Cell::get);
    if i == usize::MAX {
        i = NEXT_STRIPE.fetch_add(1, SeqCst) % STRIPES;
        STRIPE.with(|s| s.set(i));
    }
    &INSIDE[i]
}

/// Threads inside now (the sum of the stripes).
fn inside_now() -> usize {
    INSIDE.iter().map(|c| c.load(SeqCst)).sum()
}

/// Whether this thread is inside the gate now (holds a pool lock, or runs a slow path that
/// spans several steps).
pub(crate) fn is_inside() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// Enter the gate (waiting while a fork is draining it, unless this thread is inside already
/// or is the forking thread).
pub(crate) fn inside() -> Inside {
    let depth = DEPTH.with(Cell::get);
    if depth == 0 {
        let count = stripe();
        loop {
            count.fetch_add(1, SeqCst);
            if !CLOSED.load(SeqCst) || FORKER.with(Cell::get) {
                break;
            }
            // Closed: step back out and wait for the fork to finish.
            count.fetch_sub(1, SeqCst);
            while CLOSED.load(SeqCst) {
                std::thread::yield_now();
            }
        }
    }
    DEPTH.with(|d| d.set(depth + 1));
    Inside {
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let depth = DEPTH.with(Cell::get).saturating_sub(1);
        DEPTH.with(|d| d.set(depth));
        if depth == 0 {
            stripe().fetch_sub(1, SeqCst);
        }
    }
}

extern "C" fn prepare() {
    FORKER.with(|f| f.set(true));
    FORKS.fetch_add(1, SeqCst);
    CLOSED.store(true, SeqCst);
    let mine = usize::from(DEPTH.with(Cell::get) > 0);
    if inside_now() <= mine {
        return;
    }
    let t = Instant::now();
    while inside_now() > mine {
        if t.elapsed() >= DRAIN {
            TIMEOUTS.fetch_add(1, SeqCst);
            break;
        }
        std::thread::yield_now();
    }
    WAITED.fetch_add(1, SeqCst);
    LONGEST_NS.fetch_max(t.elapsed().as_nanos() as u64, SeqCst);
}

extern "C" fn parent() {
    CLOSED.store(false, SeqCst);
    FORKER.with(|f| f.set(false));
}

extern "C" fn child() {
    // Only this thread exists now: the others' counts went with them.
    for c in &INSIDE {
        c.store(0, SeqCst);
    }
    if DEPTH.with(Cell::get) > 0 {
        stripe().store(1, SeqCst);
    }
    GENERATION.fetch_add(1, SeqCst);
    CLOSED.store(false, SeqCst);
    FORKER.with(|f| f.set(false));
}

/// A mutex of the pool: taking it enters the fork gate (module contract). A poisoned lock is
/// taken all the same (the pool's structures are updated so that a panic leaves them valid).
#[derive(Debug, Default)]
pub(crate) struct ForkLock<T>(Mutex<T>);

/// A guard of a [`ForkLock`] or [`ForkRwLock`] (`G` the std guard): the lock is released
/// before the gate is left (fields drop in order).
#[derive(Debug)]
pub(crate) struct Gated<G> {
    guard: G,
    _inside: Inside,
}

/// The guard of a [`ForkLock`].
pub(crate) type ForkGuard<'a, T> = Gated<MutexGuard<'a, T>>;

/// Enter the gate, then take a lock with `take`.
fn gated<G>(take: impl FnOnce() -> G) -> Gated<G> {
    let inside = inside();
    Gated {
        guard: take(),
        _inside: inside,
    }
}

impl<T> ForkLock<T> {
    pub(crate) const fn new(value: T) -> ForkLock<T> {
        ForkLock(Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> ForkGuard<'_, T> {
        gated(|| self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The lock if it is free now (`None` otherwise, without waiting for it).
    pub(crate) fn try_lock(&self) -> Option<ForkGuard<'_, T>> {
        let g = gated(|| match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        });
        Some(Gated {
            guard: g.guard?,
            _inside: g._inside,
        })
    }
}

impl<G: std::ops::Deref> std::ops::Deref for Gated<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: std::ops::DerefMut> std::ops::DerefMut for Gated<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

/// A readers-writer lock of the pool: taking it either way enters the fork gate.
#[derive(Debug, Default)]
pub(crate) struct ForkRwLock<T>(RwLock<T>);

impl<T> ForkRwLock<T> {
    pub(crate) const fn new(value: T) -> ForkRwLock<T> {
        ForkRwLock(RwLock::new(value))
    }

    pub(crate) fn read(&self) -> Gated<RwLockReadGuard<'_, T>> {
        gated(|| self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn write(&self) -> Gated<RwLockWriteGuard<'_, T>> {
        gated(|| self.0.write().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_nest_and_leave_in_order() {
        let a = inside();
        let b = inside();
        assert_eq!(DEPTH.with(Cell::get), 2);
        drop(b);
        assert_eq!(DEPTH.with(Cell::get), 1);
        drop(a);
        assert_eq!(DEPTH.with(Cell::get), 0);
        let l = ForkLock::new(5);
        {
            let mut g = l.lock();
            *g += 1;
            assert_eq!(DEPTH.with(Cell::get), 1);
            let rw = ForkRwLock::new(());
            let _r = rw.read();
            assert_eq!(DEPTH.with(Cell::get), 2);
        }
        assert_eq!(*l.lock(), 6);
        assert_eq!(DEPTH.with(Cell::get), 0);
    }
}
