//! The degradation report at process exit (`atexit`), for programs that never call a
//! [`GlobalPool`](super::GlobalPool) method after it degraded.
//!
//! Contract: each pool's counters (mapped for good) are registered when it initialises, with
//! its initialisation error kept as text in a fixed buffer (no allocation: this runs inside
//! the allocator); at most [`POOLS`] pools are remembered. Each report runs once per pool at
//! most (`Counters::report`), whichever comes first — a method call or the exit — and never
//! unwinds out of the exit hook.

use super::Error;
use super::stats::Counters;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Release,
};

/// Pools remembered for the exit report.
const POOLS: usize = 8;

/// UTF-8 text in a fixed buffer: what does not fit is cut.
struct Text {
    buf: [u8; 240],
    len: usize,
}

impl Write for Text {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for c in s.chars() {
            let mut b = [0u8; 4];
            let e = c.encode_utf8(&mut b).as_bytes();
            if self.len + e.len() > self.buf.len() {
                break;
            }
            self.buf[self.len..self.len + e.len()].copy_from_slice(e);
            self.len += e.len();
        }
        Ok(())
    }
}

static TEXTS: [Mutex<Text>; POOLS] = [const {
    Mutex::new(Text {
        buf: [0; 240],
        len: 0,
    })
}; POOLS];
static COUNTERS: [AtomicPtr<Counters>; POOLS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; POOLS];
static NEXT: AtomicUsize = AtomicUsize::new(0);
static HOOKED: AtomicBool = AtomicBool::new(false);

/// Remember a pool that finished initialising (with its error, if it failed) for the exit
/// report, and install the hook (once).
pub(super) fn register(counters: &'static Counters, error: Option<&Error>) {
    let i = NEXT.fetch_add(1, AcqRel);
    if i >= POOLS {
        return;
    }
    if let (Some(e), Ok(mut t)) = (error, TEXTS[i].lock()) {
        t.len = 0;
        let _ = write!(t, "{e}");
    }
    COUNTERS[i].store(counters as *const Counters as *mut Counters, Release);
    if !HOOKED.swap(true, AcqRel) {
        // SAFETY: `at_exit` is an `extern "C" fn()` that never unwinds.
        unsafe { libc::atexit(at_exit) };
    }
}

/// Report a remembered pool's degradation, with its initialisation error.
pub(super) fn report(counters: &Counters) {
    for (i, c) in COUNTERS.iter().enumerate() {
        if std::ptr::eq(c.load(Acquire), counters) {
            let Ok(t) = TEXTS[i].lock() else { return };
            let text = std::str::from_utf8(&t.buf[..t.len]).unwrap_or("");
            if text.is_empty() {
                counters.report(None);
            } else {
                counters.report(Some(&text));
            }
            return;
        }
    }
    counters.report(None);
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        for c in &COUNTERS {
            let p = c.load(Acquire);
            if !p.is_null() {
                // SAFETY: a registered pointer is a `&'static Counters` (mapped for good).
                report(unsafe { &*p });
            }
        }
    });
}
