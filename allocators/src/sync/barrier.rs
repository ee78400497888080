//! Asymmetric fences: a nearly free fence for a hot path that runs all the time, paired with an
//! expensive one for a rare path that must synchronise with it (the pattern of folly's
//! `asymmetric_thread_fence_light/heavy` and liburcu's membarrier flavour).
//!
//! On Linux the heavy side is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every
//! running thread of the process execute a full memory barrier before it returns; the light side
//! is then a compiler fence. Where membarrier is unavailable both sides are full fences.
//!
//! The guarantee the callers rely on (Dekker's pattern): if thread A does `store(x); light();
//! load(y)` and thread B does `store(y); heavy(); load(x)`, then A sees B's store to `y` or B
//! sees A's store to `x` (or both).

use core::sync::atomic::{AtomicU8, Ordering::Relaxed, Ordering::SeqCst, compiler_fence, fence};
use std::sync::Once;

const UNKNOWN: u8 = 0;
const MEMBARRIER: u8 = 1;
const FENCES: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNKNOWN);
static INIT: Once = Once::new();

#[cfg(target_os = "linux")]
mod sys {
    // From <linux/membarrier.h>.
    pub(super) const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    pub(super) const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    pub(super) fn membarrier(cmd: libc::c_int) -> bool {
        // SAFETY: the membarrier system call takes two integers and touches no memory of ours.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_uint, 0 as libc::c_int) == 0 }
    }
}

/// Sets up the heavy fence; call once before any thread relies on [`light`] being cheap (the
/// pool does it when it is built). Until then, and if membarrier is missing, [`light`] is a
/// full fence.
pub(crate) fn init() {
    INIT.call_once(|| {
        #[cfg(target_os = "linux")]
        let mode = if sys::membarrier(sys::CMD_REGISTER_PRIVATE_EXPEDITED) { MEMBARRIER } else { FENCES };
        #[cfg(not(target_os = "linux"))]
        let mode = FENCES;
        MODE.store(mode, SeqCst);
    });
}

/// The hot path's side: a compiler fence when the heavy side is membarrier, else a full fence.
#[inline(always)]
pub(crate) fn light() {
    if MODE.load(Relaxed) == MEMBARRIER {
        compiler_fence(SeqCst);
    } else {
        fence(SeqCst);
    }
}

/// The rare path's side: every running thread executes a full barrier before this returns.
pub(crate) fn heavy() {
    init();
    #[cfg(target_os = "linux")]
    if MODE.load(SeqCst) == MEMBARRIER {
        // Once registered, the command only fails on bad arguments, which these are not; the
        // light sides rely on it, so there is no falling back to a plain fence here.
        while !sys::membarrier(sys::CMD_PRIVATE_EXPEDITED) {
            std::thread::yield_now();
        }
        return;
    }
    // Every light side is a full fence.
    fence(SeqCst);
}
