//! ODP prefetch on the soft NIC: `advise_mr`'s work, done now (`FLUSH`) or by the device's
//! prefetch thread.
//!
//! Contract: a prefetch makes the pages of a live ODP region resident in the NIC (readable, and
//! writable for `PrefetchWrite`) when the process can access them, and fails with `EFAULT` at
//! the first page it cannot; a postponed prefetch re-checks its region when it runs (it may
//! have gone or changed meanwhile) and its errors are dropped, as `ibv_advise_mr(3)` allows.
//! `PrefetchNoFault` maps only pages the CPU already has (`mincore`) and never faults. The
//! thread is started by the first postponed prefetch (`advise_mr` without `FLUSH`) and ends
//! when the device is dropped; if it cannot be started, prefetches run synchronously.

use super::counters::{AtomicCounters, bump};
use super::keys::{KeyObj, KeyTable, MrObj};
use super::mem;
use crate::nic::types::Sge;

/// A postponed prefetch.
#[derive(Debug, Clone, Copy)]
pub(super) struct PrefetchJob {
    pub(super) lkey: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) write: bool,
}

/// What the prefetch thread runs on each job (false: stop).
type Runner = dyn Fn(PrefetchJob) -> bool + Send + Sync + 'static;

/// The device's prefetch thread (its channel), started by the first postponed prefetch: a
/// process that never asks for one (a program whose `malloc` is the pool, say — the pool's
/// own prefetches run now, with `FLUSH`) stays single-threaded, so that it can still
/// `unshare(CLONE_NEWUSER)` and the like.
pub(super) struct Prefetcher {
    run: std::sync::Arc<Runner>,
    tx: std::sync::OnceLock<Option<crossbeam::channel::Sender<PrefetchJob>>>,
}

impl Prefetcher {
    /// A prefetcher that will run `run` on every job, on its thread, until `run` returns false
    /// or the `Prefetcher` is dropped. No thread yet.
    pub(super) fn start(run: impl Fn(PrefetchJob) -> bool + Send + Sync + 'static) -> Prefetcher {
        Prefetcher {
            run: std::sync::Arc::new(run),
            tx: std::sync::OnceLock::new(),
        }
    }

    /// Start the thread (once); its channel, or `None` when it could not be started.
    #[cold]
    fn spawn(&self) -> Option<crossbeam::channel::Sender<PrefetchJob>> {
        let (tx, rx) = crossbeam::channel::unbounded::<PrefetchJob>();
        let run = self.run.clone();
        let spawned = std::thread::Builder::new()
            .name("soft-nic-prefetch".into())
            .spawn(move || {
                for job in rx {
                    if !run(job) {
                        break;
                    }
                }
            });
        if spawned.is_err() {
            tracing::warn!(
                "could not start the soft NIC prefetch thread; prefetching synchronously"
            );
        }
        spawned.is_ok().then_some(tx)
    }

    /// Hand `job` to the thread (starting it the first time); gives it back when there is no
    /// thread to run it.
    pub(super) fn submit(&self, job: PrefetchJob) -> Result<(), PrefetchJob> {
        match self.tx.get_or_init(|| self.spawn()) {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

/// Make `[addr, addr + len)` of region `lkey` resident; returns pages made resident.
pub(super) fn prefetch_now(
    keys: &KeyTable,
    counters: &AtomicCounters,
    job: &PrefetchJob,
) -> Result<u64, i32> {
    let slot = keys.read(job.lkey >> 8);
    // Re-checked here: a postponed prefetch runs after the region may have gone or changed.
    let Some(KeyObj::Mr(mr)) = slot.obj.as_ref().filter(|_| slot.variant == job.lkey as u8) else {
        return Err(libc::EFAULT);
    };
    let Some(res) = mr.odp.as_ref() else {
        return Err(libc::EINVAL);
    };
    if !mr.contains(job.addr, job.len) {
        return Err(libc::EFAULT);
    }
    if job.len == 0 {
        return Ok(0);
    }
    let ps = mem::page_size() as u64;
    let mut made = 0;
    let pages = job.addr / ps..=(job.addr + job.len - 1) / ps;
    // One look at the mappings for the whole range (the common case: all accessible); page
    // by page only to find where an inaccessible one starts.
    if let Some(p) = mem::range_prot(job.addr as usize, job.len as usize) {
        if p.read && (p.write || !job.write) {
            for page in pages {
                made += res.insert(page as usize, job.write) as u64;
            }
            bump(&counters.prefetched_pages, made);
            return Ok(made);
        }
    }
    for page in pages {
        match mem::range_prot((page * ps) as usize, ps as usize) {
            Some(p) if p.read && (p.write || !job.write) => {
                if res.insert(page as usize, job.write) {
                    made += 1;
                }
            }
            _ => return Err(libc::EFAULT),
        }
    }
    bump(&counters.prefetched_pages, made);
    Ok(made)
}

/// `PrefetchNoFault`: map the pages of `sge` the CPU already has; never fault.
pub(super) fn map_cpu_resident(keys: &KeyTable, counters: &AtomicCounters, sge: &Sge) {
    let slot = keys.read(sge.lkey.index());
    let same = slot.variant == sge.lkey.variant();
    let Some(KeyObj::Mr(MrObj { odp: Some(res), .. })) = slot.obj.as_ref().filter(|_| same) else {
        return;
    };
    let ps = mem::page_size();
    let (a, l) = (sge.addr as usize, sge.length as usize);
    if l == 0 {
        return;
    }
    let made = (a / ps..=(a + l - 1) / ps)
        .filter(|&page| mem::cpu_resident(page * ps) && res.insert(page, false))
        .count();
    bump(&counters.prefetched_pages, made as u64);
}
