//! Waiting on a 32-bit word until another thread changes it (Linux `futex`, process-private).
//!
//! Contract: [`wait`] returns when the word no longer holds `expected` (at once if it did not
//! when called), when [`wake`] names it, after `ns` nanoseconds, or spuriously; callers look
//! again at what they wait for. Nothing here allocates. A waker changes the word *before* it
//! wakes, and a waiter reads the word *before* it looks at what it waits for: then no wake is
//! lost.

use std::sync::atomic::AtomicU32;

/// Sleep while `word` holds `expected`, for at most `ns` nanoseconds (`u64::MAX`: no bound).
pub(crate) fn wait(word: &AtomicU32, expected: u32, ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let timeout: *const libc::timespec = if ns >= u64::MAX / 2 {
        std::ptr::null()
    } else {
        &ts
    };
    // SAFETY: a futex wait on a live word, with a valid (or null) relative timeout; the
    // kernel only compares the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            timeout,
            0usize,
            0u32,
        )
    };
}

/// Wake up to `n` threads waiting on `word` (`i32::MAX`: all of them).
pub(crate) fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: a futex wake on a live word; no memory is read through it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
            0usize,
            0usize,
            0u32,
        )
    };
}
