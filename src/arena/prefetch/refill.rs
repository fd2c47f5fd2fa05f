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

use crate::arena::{Arena, SLAB};
use crate::sys::atfork::{self, ForkGuard, ForkLock};
use crate::sys::os::MmapArray;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// Most slabs kept in the reserve.
pub const RESERVE_MAX: usize = 64;

struct State {
    target: usize,
    /// The refill thread runs while its epoch is this one: stopping it moves the epoch on, so
    /// a thread started later is never stopped by an earlier stop, nor the other way round.
    epoch: u64,
    /// The refill thread that last waited: woken with `unpark` (no condition variable: its
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
                epoch: 0,
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

    /// Block until the reserve has room below its target (true) or the thread `me` of `epoch`
    /// is stopped (false).
    fn wait_for_room(&self, epoch: u64, me: &std::thread::Thread) -> bool {
        loop {
            {
                let mut st = self.lock();
                if st.epoch != epoch {
                    return false;
                }
                if self.len.load(Relaxed) < st.target {
                    return true;
                }
                if st.thread.as_ref().map(std::thread::Thread::id) != Some(me.id()) {
                    st.thread = Some(me.clone());
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

    /// Keep `target` runs ready; the epoch a thread started now runs in.
    fn configure(&self, target: usize) -> u64 {
        let mut st = self.lock();
        st.target = target.min(RESERVE_MAX);
        Self::wake(&st);
        st.epoch
    }

    /// Stop the thread of the current epoch (it returns from its next wait), target 0.
    fn retire(&self) {
        let mut st = self.lock();
        st.target = 0;
        st.epoch += 1;
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
    /// The thread, and the fork generation it was started in (`sys/atfork.rs`): a child
    /// of the process has no such thread, and must not join it.
    handle: ForkLock<Option<(std::thread::JoinHandle<()>, u64)>>,
}

impl Refill {
    /// Keep `slabs` ready slabs in `arena`'s reserve from now on (0, or an arena with NUMA
    /// `Local` placement, stops the thread). The handle's lock is never held while joining
    /// (a thread holding a pool lock must not wait for one that waits at the fork gate).
    ///
    /// # Safety
    /// `arena` stays valid until [`Refill::stop`] returned.
    pub(crate) unsafe fn start(&self, arena: &Arena, slabs: usize) -> std::io::Result<()> {
        let mut h = self.handle.lock();
        // Under NUMA `Local` placement runs are cut per node of the caller: slabs made ready
        // by this thread, on its node, would never be taken.
        if slabs == 0 || arena.numa_placement() == crate::arena::NumaPlacement::Local {
            let t = Self::take(&mut h, arena);
            drop(h);
            Self::join(t);
            return Ok(());
        }
        let epoch = arena.ahead().configure(slabs);
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
                refill(arena, epoch);
            });
        match spawned {
            Ok(t) => {
                // A parent's thread (in a child) is forgotten: it does not exist here.
                std::mem::forget(h.replace((t, atfork::generation())));
                Ok(())
            }
            Err(e) => {
                arena.ahead().configure(0);
                Err(e)
            }
        }
    }

    /// Stop the thread and wait for it.
    pub(crate) fn stop(&self, arena: &Arena) {
        let t = Self::take(&mut self.handle.lock(), arena);
        Self::join(t);
    }

    /// Stop the thread (under the handle's lock): the handle to join once the lock is let go.
    fn take(
        h: &mut Option<(std::thread::JoinHandle<()>, u64)>,
        arena: &Arena,
    ) -> Option<std::thread::JoinHandle<()>> {
        arena.ahead().retire();
        match h.take() {
            Some((t, g)) if g == atfork::generation() => Some(t),
            // Started by the parent of this process: the thread did not come along.
            Some((t, _)) => {
                std::mem::forget(t);
                None
            }
            None => None,
        }
    }

    fn join(t: Option<std::thread::JoinHandle<()>>) {
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// The thread: commit (and so register and prefetch) one-slab runs while the reserve is below
/// its target; pause after a failure.
fn refill(arena: &Arena, epoch: u64) {
    let me = std::thread::current();
    while arena.ahead().wait_for_room(epoch, &me) {
        match arena.alloc_fresh(SLAB, SLAB, crate::arena::commit::Backing::Dense) {
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
