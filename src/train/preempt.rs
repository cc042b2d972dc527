//! Preemption: SIGTERM, SIGUSR1 (what Slurm sends before a time limit with `--signal`) or SIGINT
//! asks the run to stop at the next step boundary with a checkpoint. The handler only records
//! the signal; each rank reads it before the step's loss all-reduce and adds it to that
//! reduction, so every rank on every node sees the request at the same step and stops there
//! together. A checkpoint being written when the signal comes is finished first (nothing is
//! interrupted). A second SIGINT stops the process at once (exit 130).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// The exit code of a run that stopped because it was asked to (EX_TEMPFAIL: "try again
/// later"): its checkpoint is written and `kiln resume` continues it.
pub const EXIT_PREEMPTED: i32 = 75;

/// The exit code when a second SIGINT stops the process at once (128 + SIGINT, as shells do).
pub const EXIT_INTERRUPTED: i32 = 130;

static SIGNAL: AtomicI32 = AtomicI32::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The signals that ask for a stop.
pub const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGUSR1, libc::SIGINT];

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

fn say(msg: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; a failed write only loses the message.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    if SIGNAL
        .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        say(match sig {
            libc::SIGINT => b"\nkiln: interrupted: stopping at the next step boundary with a checkpoint (Ctrl-C again stops at once, losing the steps since the last checkpoint)\n",
            libc::SIGUSR1 => b"kiln: SIGUSR1: stopping at the next step boundary with a checkpoint\n",
            _ => b"kiln: SIGTERM: stopping at the next step boundary with a checkpoint\n",
        });
    } else if sig == libc::SIGINT {
        say(b"\nkiln: interrupted again: stopping now\n");
        // SAFETY: _exit is async-signal-safe. Checkpoints are written to a temporary directory
        // and renamed when complete, so one cut short is never taken for a finished one.
        unsafe { libc::_exit(EXIT_INTERRUPTED) };
    }
}

/// Installs the handlers (once per process). Until then the signals keep their default action.
pub fn install() {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    for sig in SIGNALS {
        // SAFETY: a zeroed sigaction with a valid handler and an empty mask is well formed; the
        // handler only touches atomics and calls async-signal-safe functions.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signal that asked this process to stop, if one did.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
