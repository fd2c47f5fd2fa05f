//! Initialisation of a [`GlobalPool`]: the one thread that takes the UNINIT → BUSY transition
//! opens the NIC, a PD and the pool under a provisioning mark and publishes the result; the
//! others wait for it (bounded), and a call from inside the initialisation answers
//! `Err(Reentrant)` instead of waiting for itself. See the module contract (`mod.rs`).

use super::*;
use crate::PoolError;

/// What [`GlobalPool::init`] answers when called from inside the pool's own initialisation.
static REENTRANT: Error = Error::Reentrant;

thread_local! {
    /// The `GlobalPool` this thread is initialising (its address), 0 for none.
    static INIT_OWNER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as the one initialising a pool, until dropped.
struct InitOwner(usize);

impl InitOwner {
    fn enter(pool: &GlobalPool) -> InitOwner {
        let prev = INIT_OWNER
            .try_with(|o| o.replace(pool as *const GlobalPool as usize))
            .unwrap_or(0);
        InitOwner(prev)
    }

    fn is(pool: &GlobalPool) -> bool {
        INIT_OWNER
            .try_with(|o| o.get() == pool as *const GlobalPool as usize)
            .unwrap_or(false)
    }
}

impl Drop for InitOwner {
    fn drop(&mut self) {
        let _ = INIT_OWNER.try_with(|o| o.set(self.0));
    }
}

impl GlobalPool {
    /// The published initialisation, initialising first if nobody did: waits for another
    /// initialising thread (up to `limit`, if given: then `Err(Reentrant)` too), and answers
    /// `Err(Reentrant)` at once when called from inside this pool's own initialisation.
    pub(super) fn published(&self, limit: Option<Duration>) -> Result<&'static Ready, &Error> {
        let start = Instant::now();
        loop {
            if let Some(slot) = self.slot() {
                return slot.as_ref().map(|r| *r);
            }
            if InitOwner::is(self) {
                // Called from inside this pool's own initialisation (say, by the opener).
                return Err(&REENTRANT);
            }
            if !self.try_init() {
                if limit.is_some_and(|l| start.elapsed() > l) {
                    return Err(&REENTRANT);
                }
                std::thread::yield_now();
            }
        }
    }

    /// The pool, initialising it first if needed; `None` while another thread initialises it
    /// (after waiting up to [`INIT_WAIT`]), when this thread is itself initialising or
    /// provisioning, or when initialisation failed.
    #[cold]
    pub(super) fn get_cold(&self) -> Option<&Pool> {
        if provision::active() {
            return self.ready();
        }
        self.published(Some(INIT_WAIT)).ok().map(|r| &r.pool)
    }

    /// Take the UNINIT → BUSY transition and initialise; false when another thread has it.
    #[cold]
    #[inline(never)]
    pub(super) fn try_init(&self) -> bool {
        if self
            .state
            .compare_exchange(UNINIT, BUSY, Acquire, Relaxed)
            .is_err()
        {
            return self.state.load(Acquire) >= READY;
        }
        // Everything from here to the publication allocates under the mark: those allocations
        // (the NIC's, `tracing`'s) go to the bootstrap region, never back into this function.
        let _mark = Provisioning::enter();
        let _owner = InitOwner::enter(self);
        let counters = self.counters() as *const Counters as *mut Counters;
        let first = !FIRST_CLAIMED.swap(true, Relaxed);
        if first {
            FIRST_COUNTERS.store(counters, Release);
            FIRST_STATE.store(BUSY, Release);
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.open()))
            .unwrap_or(Err(Error::Config("initialisation panicked")));
        // A failure is logged outside the allocation path (`report`), with the degradations
        // it causes, or at exit.
        // SAFETY: `counters` came from `self.counters()`: a `&'static Counters`.
        exit_report::register(unsafe { &*counters }, result.as_ref().err());
        let state = if result.is_ok() { READY } else { FAILED };
        if let Ok(ready) = &result {
            // SAFETY: `ready.pool` is never dropped (it is mapped for good), and neither is the
            // copy; nobody reads `hot` before READY is published below.
            unsafe { (*self.hot.get()).write(ready.pool.core().alias()) };
            let (base, reserve) = ready.pool.span();
            self.base.store(base, Relaxed);
            self.reserve.store(reserve, Release);
            self.fast_id.store(ready.pool.id, Release);
            let _ = INSTANCE.compare_exchange(
                null_mut(),
                *ready as *const Ready as *mut Ready,
                Release,
                Relaxed,
            );
        }
        // SAFETY: this thread won UNINIT → BUSY: nobody else writes or reads the slot yet.
        unsafe { (*self.slot.get()).write(result) };
        self.state.store(state, Release);
        if first {
            FIRST_STATE.store(state, Release);
        }
        true
    }

    /// Open the NIC, a PD and the pool (on the initialising thread, under a provisioning mark).
    pub(super) fn open(&self) -> Result<&'static Ready, Error> {
        let (mut cfg, ignored) = self.config.with_env();
        self.counters()
            .env_ignored
            .fetch_add(u64::from(ignored), Relaxed);
        let nic = match cfg.open {
            Some(open) => open()?,
            None => Nic::open_default()?,
        };
        let pd = nic.alloc_pd()?;
        // An address-space limit (`ulimit -v`, a container's) refuses the reservation: halve it
        // down to `MIN_RESERVE` rather than degrade every allocation.
        let pool = loop {
            let arena = cfg.arena();
            let made = if self.remote_rights {
                // SAFETY: the caller of `with_remote_rights` took on its contract.
                unsafe { Pool::with_remote_rights(&pd, arena) }
            } else {
                Pool::with_config(&pd, arena)
            };
            match made {
                Err(PoolError::Arena(Error::Os {
                    errno: libc::ENOMEM,
                    what,
                })) if cfg.arena.reserve / 2 >= MIN_RESERVE => {
                    tracing::info!(
                        what,
                        reserve = cfg.arena.reserve,
                        "rdma_pool: reservation refused, halving it"
                    );
                    cfg.arena.reserve /= 2;
                    cfg.arena.chunk = cfg.arena.chunk.min(cfg.arena.reserve);
                }
                made => break made.map_err(Error::from)?,
            }
        };
        tracing::info!(nic = %nic.caps().name, ?cfg.arena.registration, ?cfg.arena.hugepages,
            "rdma_pool: GlobalPool ready");
        MmapBox::new(Ready { cfg, nic, pd, pool })
            .map(MmapBox::into_static)
            .map_err(|(_, errno)| Error::Os {
                what: "mmap of the global pool's handles",
                errno,
            })
    }
}
