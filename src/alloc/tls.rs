//! Thread caches: which heap this thread uses in each pool, found in a small thread-local
//! table; claiming a heap on first use and handing it back when the thread exits.
//!
//! Contract: a thread claims a free heap of a pool (CAS of its owner token) the first time it
//! allocates there and keeps it in the first free way of `WAYS`; a pool evicted from a full
//! table releases its heap. When the thread exits, its heaps are released — their empty pages
//! go back to the pool, the rest wait in the heap for the next thread that claims it. A pool
//! id is never reused, so a stale entry can never match a later pool. Pools register in
//! `REGISTRY` while alive; releases check it under its lock, so a thread exiting after a pool
//! was dropped touches nothing.
//!
//! Thread-locals done so that the pool can be the global allocator on stable Rust:
//! - the ways (`ways()`) are thread-local storage without a destructor — initial-exec TLS
//!   on x86-64 Linux (see there), elsewhere a const `thread_local!` read with `try_with`:
//!   it stays readable while other thread-locals are destroyed and after, so allocation and
//!   free work at every point of a thread's life;
//! - the thread-exit hand-back is a pthread key destructor, not a Rust TLS destructor: the key
//!   is created when a pool is created (outside the allocation path) and armed per thread with
//!   `pthread_setspecific`, which neither allocates through Rust nor registers anything with
//!   std. glibc runs key destructors after every C++/Rust TLS destructor, so blocks freed by
//!   those still go to a live heap; a thread allocating again after the hand-back claims a heap
//!   again (re-arming the key) for `EXIT_ROUNDS` rounds, then gets none (the caller falls
//!   back) so that no heap stays owned by a dead thread;
//! - nothing relies on the main thread's destructors running: its heaps stay owned at exit.
//!
//! - while the thread provisions memory (`sys/provision.rs`: it calls the NIC) its ways are
//!   hidden ([`HIDDEN`] set in their ids): no fast path finds a heap, no heap is claimed, and the
//!   NIC layer's allocations are served outside this thread's pages, which they would outlive
//!   (`heap/provisioning.rs`).
//!
//! Invariant: `ways()[i].id & !HIDDEN != 0 ⇒` the heap `ways()[i].heap` of pool
//! `id & !HIDDEN` is owned by this thread; at most one way names a pool; `HIDDEN` is set in
//! the ids of a thread's ways iff it holds a provisioning mark (pool ids stay below it).

use super::heap::Heap;
use super::pool::PoolInner;
use crate::sys::atfork::{ForkGuard, ForkLock};
use std::cell::Cell;
use std::ptr::{NonNull, null_mut};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Pools a thread keeps a heap in at once: eight pools of its own beside `GlobalPool`, and one
/// more.
const WAYS: usize = 10;

/// Most pools alive at once in a process.
pub(crate) const MAX_POOLS: usize = 256;

struct Way {
    id: Cell<u64>,
    heap: Cell<*mut Heap>,
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
thread_local! {
    static CACHE: [Way; WAYS] = const {
        [const { Way { id: Cell::new(0), heap: Cell::new(null_mut()) } }; WAYS]
    };
}

thread_local! {
    /// Times this thread's heaps were handed back at exit.
    static EXITS: Cell<u8> = const { Cell::new(0) };
}

/// This thread's ways (`None` only where a `thread_local!` may be gone: thread exit).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline(always)]
fn ways() -> Option<&'static [Way; WAYS]> {
    // SAFETY: used within the caller's call only, on this thread, while the thread-local
    // lives (it has no destructor: it lives as long as the thread).
    CACHE
        .try_with(|w| unsafe { &*(w as *const [Way; WAYS]) })
        .ok()
}

// On x86-64 Linux the ways live in static TLS, reached with the initial-exec model: one load
// of the thread pointer and one of the variable's offset. A `thread_local!` compiled into a
// shared object (the C library, `capi/`) takes the general-dynamic model — a call of
// `__tls_get_addr` on every allocation and free, 16% of a tight C malloc/free loop — and
// stable Rust cannot choose the model. Initial-exec in a shared object needs static TLS:
// there for a library loaded at start-up (linked, `LD_PRELOAD`), and for one `dlopen`ed later
// while the C library's reserve lasts (glibc keeps a few hundred bytes for this; the ways are
// 160). Zero bytes are valid ways (`.tbss`), and there is no destructor: the ways live as long
// as the thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 4",
    ".globl __rdma_pool_tls_ways_v1",
    ".hidden __rdma_pool_tls_ways_v1",
    ".type __rdma_pool_tls_ways_v1, @object",
    ".size __rdma_pool_tls_ways_v1, 160",
    "__rdma_pool_tls_ways_v1:",
    ".zero 160",
    ".popsection",
);

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
const _: () =
    assert!(std::mem::size_of::<[Way; WAYS]>() == 160 && std::mem::align_of::<[Way; WAYS]>() <= 16);

/// This thread's ways (initial-exec TLS, see above).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn ways() -> Option<&'static [Way; WAYS]> {
    let p: *const [Way; WAYS];
    // SAFETY: `fs:0` is the thread pointer (the TCB's self-pointer, x86-64 ELF TLS ABI), and
    // the GOT entry the initial-exec relocation fills holds the variable's offset from it.
    unsafe {
        std::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + __rdma_pool_tls_ways_v1@GOTTPOFF]",
            p = out(reg) p,
            // It reads memory (the thread pointer, the GOT) and is not `pure`: a value the
            // compiler kept across a point where the code may move to another thread (an async
            // task's resumption) would be another thread's ways.
            options(readonly, nostack),
        );
    }
    // SAFETY: this thread's copy, zero-initialised (valid ways), living as long as the
    // thread; used within the caller's call only, on this thread.
    Some(unsafe { &*p })
}

/// The bit a hidden way's id carries (never a pool's: ids count up from 1).
const HIDDEN: u64 = 1 << 63;

/// The provisioning hook (`sys/provision.rs`): hide this thread's ways when it takes its first
/// mark, show them again when it drops its last.
fn hide_ways(hide: bool) {
    if let Some(ways) = ways() {
        for w in ways {
            let id = w.id.get();
            if id != 0 {
                w.id.set(if hide { id | HIDDEN } else { id & !HIDDEN });
            }
        }
    }
}

/// Rounds of claim-and-release allowed during thread exit (glibc runs key destructors up to
/// `PTHREAD_DESTRUCTOR_ITERATIONS` = 4 times).
const EXIT_ROUNDS: u8 = 3;

/// The pthread key whose destructor hands heaps back, plus one; 0 until created.
static EXIT_KEY: AtomicUsize = AtomicUsize::new(0);
static EXIT_KEY_ONCE: Once = Once::new();

/// Create the thread-exit key (once per process; called when a pool is created).
fn create_exit_key() {
    EXIT_KEY_ONCE.call_once(|| {
        crate::sys::provision::set_hook(hide_ways);
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is a valid out-pointer; `on_thread_exit` has the destructor signature.
        if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
            EXIT_KEY.store(key as usize + 1, Ordering::Release);
        } else {
            tracing::warn!(
                "rdma_pool: no pthread key left; heaps of exiting threads are not handed back"
            );
        }
    });
}

/// Arm this thread's exit hand-back (idempotent, allocation-free).
fn arm_exit() {
    let key = EXIT_KEY.load(Ordering::Acquire);
    if key != 0 {
        // SAFETY: a key created by `create_exit_key`, never deleted; the value is a non-null
        // marker, never dereferenced.
        unsafe {
            libc::pthread_setspecific(
                (key - 1) as libc::pthread_key_t,
                std::ptr::dangling::<libc::c_void>(),
            )
        };
    }
}

/// The key destructor: hand every heap of this thread back.
extern "C" fn on_thread_exit(_: *mut libc::c_void) {
    let _ = EXITS.try_with(|e| e.set(e.get().saturating_add(1)));
    let mut clock = false;
    if let Some(ways) = ways() {
        for w in ways {
            // A mark leaked with `mem::forget` leaves the ways hidden: their heaps go back too.
            clock |= release(w.id.replace(0) & !HIDDEN, w.heap.replace(null_mut()));
        }
    }
    // What the heaps still hold is looked at again after the delay, by the purge clock
    // (started here, with no lock held, if it does not run yet).
    if clock {
        super::purger::ensure();
    }
}

/// Live pools: `(id, pool)` pairs, under one lock.
struct Registry {
    live: [(u64, usize); MAX_POOLS],
}

static REGISTRY: ForkLock<Registry> = ForkLock::new(Registry {
    live: [(0, 0); MAX_POOLS],
});

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn registry() -> ForkGuard<'static, Registry> {
    REGISTRY.lock()
}

/// A fresh pool id.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Record a live pool; false when `MAX_POOLS` are alive.
pub(crate) fn register(id: u64, pool: *const PoolInner) -> bool {
    create_exit_key();
    let mut r = registry();
    match r.live.iter_mut().find(|e| e.0 == 0) {
        Some(e) => {
            *e = (id, pool as usize);
            true
        }
        None => false,
    }
}

/// Forget a pool (it is being dropped); after this no thread releases into it.
pub(crate) fn unregister(id: u64) {
    let mut r = registry();
    if let Some(e) = r.live.iter_mut().find(|e| e.0 == id) {
        *e = (0, 0);
    }
}

/// Hand `heap` of pool `id` back, if the pool still lives; true when the pool's purge clock
/// should look at it later.
fn release(id: u64, heap: *mut Heap) -> bool {
    if id == 0 || heap.is_null() {
        return false;
    }
    let r = registry();
    let mut clock = false;
    if r.live.iter().any(|e| e.0 == id) {
        // SAFETY: the pool is alive (and cannot be dropped while we hold the registry lock),
        // and this thread owns `heap`.
        let heap = unsafe { &*heap };
        heap.release();
        // SAFETY: as above: a heap lives inside its live pool.
        let pool = unsafe { &*heap.pool.load(Ordering::Relaxed) };
        let holds = heap.holds_pages();
        // SeqCst, with the request's update of the due time and the pass's reset of it and
        // its look at the owners (Dekker): the pass either sees the heap unowned or keeps the
        // request.
        heap.owner.store(0, Ordering::SeqCst);
        pool.heaps.give_back(heap);
        // The look for its pages is asked for once the heap is no thread's: asked before, a
        // pass starting in between (it resets the due time, then walks the heaps) could
        // overwrite the request and skip the heap as still owned; its pages then waited for
        // the look's back-off (a delay and more) instead of a quarter of a delay.
        if holds {
            pool.idle.thread_left();
            clock = pool.idle.on_clock();
        }
    }
    clock
}

/// This thread's token (the address of its cache: unique among live threads).
pub(crate) fn token() -> u64 {
    ways().map_or(0, |c| c.as_ptr() as u64)
}

/// This thread's heap in `pool`, if it has one (never claims).
#[inline(always)]
pub(crate) fn heap_of(id: u64) -> *mut Heap {
    heap_in(id).map_or(null_mut(), NonNull::as_ptr)
}

/// [`heap_of`] for the fast paths: a hit is never null (a way is filled with its pool's id
/// and a claimed heap together), so the caller tests the hit alone.
#[inline(always)]
pub(crate) fn heap_in(id: u64) -> Option<NonNull<Heap>> {
    for w in ways()? {
        if w.id.get() == id {
            // SAFETY: `id` is a pool's (never 0), and a way naming a pool holds the heap
            // claimed with it (the invariant above), which is not null.
            return Some(unsafe { NonNull::new_unchecked(w.heap.get()) });
        }
    }
    None
}

/// This thread's heap in `pool`, claiming one on first use. Null when every heap of the pool
/// is taken or the thread is exiting.
#[inline(always)]
pub(crate) fn heap_for(id: u64, pool: &PoolInner) -> *mut Heap {
    let h = heap_of(id);
    if !h.is_null() {
        return h;
    }
    claim(pool)
}

#[cold]
#[inline(never)]
fn claim(pool: &PoolInner) -> *mut Heap {
    let me = token();
    if me == 0
        || EXITS.try_with(|e| e.get()).unwrap_or(EXIT_ROUNDS) >= EXIT_ROUNDS
        || crate::sys::provision::active()
    {
        // Exiting for good, or provisioning (its heap is hidden, not gone: see above).
        return null_mut();
    }
    let Some(heap) = pool.heaps.claim(me, pool) else {
        return null_mut();
    };
    let heap = heap as *const Heap as *mut Heap;
    arm_exit();
    let placed = ways().map(|ways| {
        let way = ways
            .iter()
            .find(|w| w.id.get() == 0)
            .unwrap_or(&ways[WAYS - 1]);
        release(way.id.replace(pool.id), way.heap.replace(heap));
    });
    if placed.is_none() {
        let _ = release(pool.id, heap);
        return null_mut();
    }
    heap
}

/// Release this thread's heap in `pool` now (the pool is being dropped by this thread).
pub(crate) fn forget(pool: &PoolInner) {
    if let Some(ways) = ways() {
        for w in ways {
            if w.id.get() & !HIDDEN == pool.id {
                w.id.set(0);
                w.heap.set(null_mut());
            }
        }
    }
}

/// Run `f` under the registry lock: what [`any_live_pool`] sees is from before or after it.
pub(crate) fn with_registry<T>(f: impl FnOnce() -> T) -> T {
    let _r = registry();
    f()
}

/// Call `f` on each live pool under the registry lock (which keeps them alive) until it
/// returns true.
pub(crate) fn any_live_pool(mut f: impl FnMut(&PoolInner) -> bool) -> bool {
    let r = registry();
    r.live.iter().filter(|e| e.0 != 0).any(|&(_, inner)| {
        // SAFETY: a registered pool is alive while the registry lock is held.
        f(unsafe { &*(inner as *const PoolInner) })
    })
}

/// The SGE of `buf` on `nic` in whichever live pool holds it: `None` unless `buf` lies wholly
/// inside one registration of that pool on `nic` (under the registry lock, as
/// [`keys_of_any`]).
pub(crate) fn sge_of_any_on(buf: &[u8], nic: &crate::nic::Nic) -> Option<crate::nic::Sge> {
    let r = registry();
    r.live.iter().filter(|e| e.0 != 0).find_map(|&(_, inner)| {
        // SAFETY: a registered pool is alive while the registry lock is held.
        let arena = &unsafe { &*(inner as *const PoolInner) }.arena;
        arena
            .contains(buf.as_ptr())
            .then(|| arena.sge_of_on(buf, nic).ok())?
    })
}

/// The keys of `p` in whichever live pool holds it (one range check per pool, under the
/// registry lock, which keeps every listed pool alive while it is read).
pub(crate) fn keys_of_any(p: *const u8) -> Option<crate::arena::Keys> {
    keys_of_any_on(p, None)
}

/// As [`keys_of_any`], on `nic` (`None`: each pool's own device).
pub(crate) fn keys_of_any_on(
    p: *const u8,
    nic: Option<&crate::nic::Nic>,
) -> Option<crate::arena::Keys> {
    let r = registry();
    r.live.iter().filter(|e| e.0 != 0).find_map(|&(_, inner)| {
        // SAFETY: a registered pool is alive while the registry lock is held.
        let arena = &unsafe { &*(inner as *const PoolInner) }.arena;
        match nic {
            None => arena.keys_of(p),
            Some(nic) => arena.contains(p).then(|| arena.keys_of_on(p, nic))?,
        }
    })
}
