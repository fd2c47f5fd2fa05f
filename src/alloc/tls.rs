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
//! Invariant: `CACHE[i].id != 0 ⇒` the heap `CACHE[i].heap` of pool `id` is owned by this
//! thread; at most one way names a pool.

use super::heap::Heap;
use super::pool::{HEAPS, PoolInner};
use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Pools a thread keeps a heap in at once.
const WAYS: usize = 4;

/// Most pools alive at once in a process.
pub(crate) const MAX_POOLS: usize = 256;

struct Way {
    id: Cell<u64>,
    heap: Cell<*mut Heap>,
}

thread_local! {
    static CACHE: [Way; WAYS] = const {
        [const { Way { id: Cell::new(0), heap: Cell::new(null_mut()) } }; WAYS]
    };
    static GUARD: Guard = const { Guard };
}

/// Releases this thread's heaps when it exits.
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|ways| {
            for w in ways {
                release(w.id.replace(0), w.heap.replace(null_mut()));
            }
        });
    }
}

/// Live pools: `(id, pool)` pairs, under one lock.
struct Registry {
    live: [(u64, usize); MAX_POOLS],
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    live: [(0, 0); MAX_POOLS],
});

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh pool id.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Record a live pool; false when `MAX_POOLS` are alive.
pub(crate) fn register(id: u64, pool: *const PoolInner) -> bool {
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

/// Hand `heap` of pool `id` back, if the pool still lives.
fn release(id: u64, heap: *mut Heap) {
    if id == 0 || heap.is_null() {
        return;
    }
    let r = registry();
    if r.live.iter().any(|e| e.0 == id) {
        // SAFETY: the pool is alive (and cannot be dropped while we hold the registry lock),
        // and this thread owns `heap`.
        unsafe {
            (*heap).release();
            (*heap).owner.store(0, Ordering::Release);
        }
    }
}

/// This thread's token (the address of its cache: unique among live threads).
fn token() -> u64 {
    CACHE.with(|c| c.as_ptr() as u64)
}

/// This thread's heap in `pool`, if it has one (never claims).
#[inline(always)]
pub(crate) fn heap_of(id: u64) -> *mut Heap {
    CACHE
        .try_with(|ways| {
            for w in ways {
                if w.id.get() == id {
                    return w.heap.get();
                }
            }
            null_mut()
        })
        .unwrap_or(null_mut())
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
    let mut heap = null_mut();
    for i in 0..HEAPS {
        let Some(h) = pool.heaps.get(i) else { break };
        if h.owner.load(Ordering::Relaxed) == 0
            && h.owner
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            h.init(pool);
            heap = h as *const Heap as *mut Heap;
            break;
        }
    }
    if heap.is_null() {
        return heap;
    }
    // Arm the exit guard (registers the thread-exit destructor once).
    let _ = GUARD.try_with(|_| ());
    let placed = CACHE.try_with(|ways| {
        let way = ways
            .iter()
            .find(|w| w.id.get() == 0)
            .unwrap_or(&ways[WAYS - 1]);
        release(way.id.replace(pool.id), way.heap.replace(heap));
    });
    if placed.is_err() {
        release(pool.id, heap);
        return null_mut();
    }
    heap
}

/// Release this thread's heap in `pool` now (the pool is being dropped by this thread).
pub(crate) fn forget(pool: &PoolInner) {
    let _ = CACHE.try_with(|ways| {
        for w in ways {
            if w.id.get() == pool.id {
                w.id.set(0);
                w.heap.set(null_mut());
            }
        }
    });
}
