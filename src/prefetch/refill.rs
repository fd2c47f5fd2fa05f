//! The reserve: one-slab runs committed, registered and prefetched ahead of demand by a
//! background thread, so an allocation that needs a fresh slab takes a ready one instead of
//! committing, registering and faulting it in on its own slow path.
//!
//! Contract: the reserve holds at most [`RESERVE_MAX`] runs (their addresses in memory mapped
//! from the kernel; no allocation on `take`, which runs inside `GlobalAlloc`). A `take` that
//! leaves fewer than the target wakes the thread. The thread is started by
//! `Pool::start_refill` (never from inside the allocator), and stopped and joined by
//! `Pool::stop_refill` or the pool's drop; it reaches the arena through a pointer that stays
//! valid until then (the pool's shared state is dropped only after the join, or never).
//! Runs in the reserve are neither handed out twice nor purged; they go with the arena.
//!
//! Invariant: `len <= target <= RESERVE_MAX`, except right after the target was lowered.

use crate::arena::atfork::{self, ForkGuard, ForkLock};
use crate::arena::os::MmapArray;
use crate::arena::{Arena, SLAB};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// Most slabs kept in the reserve.
pub const RESERVE_MAX: usize = 64;

struct State {
    target: usize,
    stop: bool,
    /// The refill thread, once it waited: woken with `unpark` (no condition variable: its
    /// mutex would be held across a wait, which the fork gate must not see).
    thread: Option<std::thread::Thread>,
}

/// See the module contract.
pub(crate) struct Reserve {
    state: ForkLock<State>,
    runs: MmapArray<AtomicUsize>,
    /// Runs held (`runs[..len]`), changed under `state`; read without it to skip the lock.
    len: AtomicUsize,
    refilled: AtomicU64,
    hits: AtomicU64,
}

impl Reserve {
    pub(crate) fn new() -> Result<Reserve, i32> {
        Ok(Reserve {
            state: ForkLock::new(State {
                target: 0,
                stop: false,
                thread: None,
            }),
            // SAFETY: zero is a valid AtomicUsize.
            runs: unsafe { MmapArray::zeroed(RESERVE_MAX)? },
            len: AtomicUsize::new(0),
            refilled: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> ForkGuard<'_, State> {
        self.state.lock()
    }

    fn wake(st: &State) {
        if let Some(t) = &st.thread {
            t.unpark();
        }
    }

    fn slot(&self, i: usize) -> &AtomicUsize {
        self.runs.get(i).expect("i < RESERVE_MAX")
    }

    /// A ready one-slab run, if the reserve holds one.
    pub(crate) fn take(&self) -> Option<usize> {
        if self.len.load(Relaxed) == 0 {
            return None;
        }
        let st = self.lock();
        let n = self.len.load(Relaxed);
        let n = n.checked_sub(1)?;
        let run = self.slot(n).load(Relaxed);
        self.len.store(n, Relaxed);
        self.hits.fetch_add(1, Relaxed);
        if n < st.target {
            Self::wake(&st);
        }
        Some(run)
    }

    /// Block until the reserve has room below its target (true) or the refill stops (false).
    fn wait_for_room(&self) -> bool {
        loop {
            {
                let mut st = self.lock();
                if st.stop {
                    return false;
                }
                if self.len.load(Relaxed) < st.target {
                    return true;
                }
                if st.thread.is_none() {
                    st.thread = Some(std::thread::current());
                }
            }
            // An `unpark` since the check above makes this return at once.
            std::thread::park_timeout(Duration::from_millis(200));
        }
    }

    /// Add a ready run; false (the caller keeps it) when the reserve is full.
    fn put(&self, run: usize) -> bool {
        let _st = self.lock();
        let n = self.len.load(Relaxed);
        if n >= RESERVE_MAX {
            return false;
        }
        self.slot(n).store(run, Relaxed);
        self.len.store(n + 1, Relaxed);
        self.refilled.fetch_add(1, Relaxed);
        true
    }

    fn configure(&self, target: usize, stop: bool) {
        let mut st = self.lock();
        st.target = target.min(RESERVE_MAX);
        st.stop = stop;
        Self::wake(&st);
    }

    /// `(held, target, refilled, hits)`.
    pub(crate) fn counts(&self) -> (u64, u64, u64, u64) {
        let target = self.lock().target as u64;
        (
            self.len.load(Relaxed) as u64,
            target,
            self.refilled.load(Relaxed),
            self.hits.load(Relaxed),
        )
    }
}

/// The arena, sent to the refill thread (see the module contract for why it stays valid).
struct ArenaPtr(*const Arena);
// SAFETY: `Arena` is `Sync`; the pointer is only dereferenced while the arena lives.
unsafe impl Send for ArenaPtr {}

/// The refill thread of one pool.
#[derive(Default)]
pub(crate) struct Refill {
    /// The thread, and the fork generation it was started in (`arena/atfork.rs`): a child
    /// of the process has no such thread, and must not join it.
    handle: ForkLock<Option<(std::thread::JoinHandle<()>, u64)>>,
}

impl Refill {
    /// Keep `slabs` ready slabs in `arena`'s reserve from now on (0, or an arena with NUMA
    /// `Local` placement, stops the thread). Start
    /// and stop hold the handle's lock throughout, so they never interleave.
    ///
    /// # Safety
    /// `arena` stays valid until [`Refill::stop`] returned.
    pub(crate) unsafe fn start(&self, arena: &Arena, slabs: usize) -> std::io::Result<()> {
        let mut h = self.handle.lock();
        // Under NUMA `Local` placement runs are cut per node of the caller: slabs made ready
        // by this thread, on its node, would never be taken.
        if slabs == 0 || arena.numa_placement() == crate::arena::NumaPlacement::Local {
            Self::stop_locked(&mut h, arena);
            return Ok(());
        }
        arena.ahead().configure(slabs, false);
        if h.as_ref().is_some_and(|(_, g)| *g == atfork::generation()) {
            return Ok(());
        }
        let ptr = ArenaPtr(arena);
        let spawned = std::thread::Builder::new()
            .name("rdma-pool-refill".into())
            .spawn(move || {
                let ptr = ptr;
                // SAFETY: valid until `stop` joined this thread (the caller's contract).
                let arena = unsafe { &*ptr.0 };
                refill(arena);
            });
        match spawned {
            Ok(t) => {
                // A parent's thread (in a child) is forgotten: it does not exist here.
                std::mem::forget(h.replace((t, atfork::generation())));
                Ok(())
            }
            Err(e) => {
                arena.ahead().configure(0, false);
                Err(e)
            }
        }
    }

    /// Stop the thread and wait for it.
    pub(crate) fn stop(&self, arena: &Arena) {
        let mut h = self.handle.lock();
        Self::stop_locked(&mut h, arena);
    }

    fn stop_locked(h: &mut Option<(std::thread::JoinHandle<()>, u64)>, arena: &Arena) {
        match h.take() {
            Some((t, g)) if g == atfork::generation() => {
                arena.ahead().configure(0, true);
                // The thread never takes the handle's lock: joining under it cannot deadlock.
                let _ = t.join();
            }
            // Started by the parent of this process: the thread did not come along.
            Some((t, _)) => std::mem::forget(t),
            None => {}
        }
        arena.ahead().configure(0, false);
    }
}

/// The thread: commit (and so register and prefetch) one-slab runs while the reserve is below
/// its target; pause after a failure.
fn refill(arena: &Arena) {
    while arena.ahead().wait_for_room() {
        match arena.alloc_fresh(SLAB, SLAB) {
            Ok(run) => {
                if !arena.ahead().put(run.as_ptr() as usize) {
                    // Full meanwhile: the run stays committed and unused until the arena
                    // goes (a slab at most per lowered target).
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Err(e) => {
                tracing::debug!(target: "rdma_pool::prefetch", error = %e, "refill failed; pausing");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
