//! The purge clock: one background thread per process that runs every live pool's due purge on
//! time — also while the program is idle — and collects the pages of exited threads without
//! waiting for another allocator call (jemalloc's `background_thread` over `decay.c`).
//!
//! Contract:
//! - the thread is started lazily by the first slow path that finds a purge pending in a pool
//!   whose configuration wants the clock ([`ArenaConfig::purge_thread`]), never by the first
//!   allocation (nothing is idle then). It is created with `pthread_create` on a static entry,
//!   detached, with every signal blocked, under a provisioning mark: nothing of ours is
//!   allocated, and an allocation the C library makes meanwhile is served like any re-entrant
//!   one (`sys/provision.rs`). A failed start is not retried in the same fork generation: the
//!   slow paths then purge inline, as without the clock;
//! - in a child of `fork` the thread does not exist (it was started in another generation): the
//!   child's next pending purge starts its own;
//! - it sleeps on a futex word until the earliest due time of any pool (`PLANNED`); a pool whose
//!   due time moves earlier than that wakes it ([`nudge`]: one compare, a syscall only then);
//! - it reaches a pool through the registry: under the registry lock it counts itself into the
//!   pool's `clock_users` (tagged with the fork generation), and leaves the count after the
//!   pass; a pool being dropped unregisters, then waits until the count of its generation is 0.
//!   The whole pass is inside the fork gate, so a fork never sees a count half taken.
//!
//! Invariant: `STARTED == generation + 1` ⇔ a purge thread runs in this process; then every
//! pool with a pending purge has `next_due >= PLANNED` or has bumped `SEQ` since the thread
//! last read it.
//!
//! [`ArenaConfig::purge_thread`]: crate::arena::ArenaConfig::purge_thread

use super::pool::PoolInner;
use super::purge::now_ns;
use super::tls;
use crate::sys::{atfork, futex};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const R: Ordering = Ordering::Relaxed;

/// `generation + 1` of the fork generation whose purge thread runs; 0: none.
static STARTED: AtomicU64 = AtomicU64::new(0);
/// `generation + 1` of the generation whose start failed (no retry in it).
static FAILED: AtomicU64 = AtomicU64::new(0);
/// When the thread wakes next (`u64::MAX`: only when nudged).
static PLANNED: AtomicU64 = AtomicU64::new(u64::MAX);
/// The futex word: bumped by every nudge.
static SEQ: AtomicU32 = AtomicU32::new(0);
/// Passes the thread ran (statistics).
static PASSES: AtomicU64 = AtomicU64::new(0);

/// The shortest sleep between two passes (a pool whose purge lock was busy is retried then).
const MIN_SLEEP_NS: u64 = 1_000_000;

/// Whether the purge thread runs in this process (this fork generation).
pub(crate) fn running() -> bool {
    STARTED.load(R) == atfork::generation() + 1
}

/// Passes the purge thread ran in this process.
pub(crate) fn passes() -> u64 {
    PASSES.load(R)
}

/// A pool's purge became due at `due`: wake the thread if it sleeps past it.
pub(crate) fn nudge(due: u64) {
    if due < PLANNED.load(Ordering::SeqCst) && running() {
        PLANNED.fetch_min(due, R);
        SEQ.fetch_add(1, Ordering::SeqCst);
        futex::wake(&SEQ, 1);
    }
}

/// The purge thread runs, or was started now; false when it does not run (the caller purges
/// inline). Call only where a purge may run. It is not started by a thread inside the fork
/// gate (holding a pool lock, e.g. the registry's): `pthread_create` may allocate, and that
/// allocation must not need a lock this thread holds.
pub(crate) fn ensure() -> bool {
    if running() {
        return true;
    }
    !atfork::is_inside() && start()
}

#[cold]
#[inline(never)]
fn start() -> bool {
    let generation = atfork::generation() + 1;
    if FAILED.load(R) == generation {
        return false;
    }
    // One starter: the others purge inline meanwhile.
    let prev = STARTED.load(R);
    if prev == generation
        || STARTED
            .compare_exchange(prev, generation, Ordering::AcqRel, R)
            .is_err()
    {
        return STARTED.load(R) == generation;
    }
    PLANNED.store(0, R); // the first pass looks at once
    let _mark = crate::sys::provision::Provisioning::enter();
    if spawn() {
        true
    } else {
        FAILED.store(generation, R);
        STARTED.store(0, R);
        false
    }
}

/// Create the detached thread with every signal blocked (so none of the program's handlers
/// runs on it); true when it runs.
fn spawn() -> bool {
    // SAFETY: plain libc calls on local, initialised values; `entry` has the start routine's
    // signature and takes no argument.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return false;
        }
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        // The NIC layer's deregistration runs on this stack.
        libc::pthread_attr_setstacksize(&mut attr, 1 << 20);
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let mut t: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut t, &attr, entry, std::ptr::null_mut());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        rc == 0
    }
}

extern "C" fn entry(_: *mut libc::c_void) -> *mut libc::c_void {
    // Named from inside: the handle of a detached thread may be gone by the time its creator
    // would name it.
    // SAFETY: this thread's own handle and a NUL-terminated name of at most 15 bytes.
    unsafe { libc::pthread_setname_np(libc::pthread_self(), c"rdma-pool-purge".as_ptr()) };
    let generation = atfork::generation() + 1;
    // A panic (none is expected) ends the clock: the slow paths purge inline from then on.
    let _ = std::panic::catch_unwind(|| run(generation));
    FAILED.store(generation, R);
    let _ = STARTED.compare_exchange(generation, 0, R, R);
    std::ptr::null_mut()
}

/// Sleep until the earliest due time, purge what is due, repeat (until a fork leaves this
/// thread behind: a child's thread is its own).
///
/// No nudge is lost (Dekker, `SeqCst`): a pool stores its due time, then reads `PLANNED`;
/// the thread stores `PLANNED`, then reads every pool's due time again. One of them sees the
/// other's store, so a due time earlier than the plan either wakes the thread or is in its
/// second look.
fn run(generation: u64) {
    while STARTED.load(R) == generation {
        let seq = SEQ.load(Ordering::SeqCst);
        let next = pass(now_ns(), true);
        PLANNED.store(next, Ordering::SeqCst);
        if pass(now_ns(), false) < next || SEQ.load(Ordering::SeqCst) != seq {
            continue;
        }
        sleep(seq, next.saturating_sub(now_ns()).max(MIN_SLEEP_NS));
    }
}

/// Wait on the futex word for `ns` (or forever when the plan is `u64::MAX`).
fn sleep(seq: u32, ns: u64) {
    futex::wait(&SEQ, seq, ns);
}

/// How long a pool whose purge lock was busy (a `purge()` running, say) waits for the next
/// look.
const BUSY_BACKOFF_NS: u64 = 100_000_000;

/// Leaves the counts of the pools a pass entered, from `done` on, also when a purge panics
/// (each pool's drop waits for its count).
struct Leaving<'a> {
    pools: &'a [usize],
    done: usize,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        for &p in &self.pools[self.done..] {
            // SAFETY: entered and not yet left: the pool lives (see `pass`).
            unsafe { &*(p as *const PoolInner) }.idle.clock_leave();
        }
    }
}

/// One pass over the live pools: purge each one that is due (`purge`), or only look; the
/// earliest due time left. The counts are taken under the registry lock (inside the fork
/// gate); the purges take the gate themselves, so a fork waits for one purge at most.
fn pass(now: u64, purge: bool) -> u64 {
    let generation = atfork::generation();
    let mut due = [0usize; tls::MAX_POOLS];
    let mut n = 0;
    let mut next = u64::MAX;
    tls::any_live_pool(|p| {
        if p.idle.on_clock() {
            let d = p.idle.due();
            if purge && d <= now && n < due.len() {
                p.idle.clock_enter(generation);
                due[n] = p as *const PoolInner as usize;
                n += 1;
            } else {
                next = next.min(d);
            }
        }
        false
    });
    if !purge {
        return next;
    }
    PASSES.fetch_add(1, R);
    let mut leaving = Leaving {
        pools: &due[..n],
        done: 0,
    };
    for (i, &p) in due[..n].iter().enumerate() {
        // SAFETY: counted into the pool's `clock_users` under the registry lock while it was
        // registered: its drop waits for the count (see the module contract).
        let pool = unsafe { &*(p as *const PoolInner) };
        pool.purge_idle(false);
        let d = pool.idle.due();
        // Still due: its purge lock was busy. Look again a little later, not at once.
        next = next.min(if d <= now { now + BUSY_BACKOFF_NS } else { d });
        leaving.done = i + 1;
        pool.idle.clock_leave();
    }
    next
}
