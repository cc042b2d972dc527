//! Measured memory: a counting wrapper around the global allocator that attributes every byte
//! to the rank whose thread allocated it, and the process's peak resident set.
//!
//! Every block of 64 KiB or more is remembered (in a fixed table, no allocation) with the slot
//! of the thread that made it, so a large block freed on another thread (the shared initial
//! parameters, a buffer handed between ranks) is taken off the rank that allocated it; smaller
//! blocks count for the thread that frees them. A thread joins a rank with `attribute(rank)` (the rank's worker, its
//! data loader threads); anything else counts as unattributed. The binary installs it
//! (`main.rs`); a program that does not (a test linking the library) reports no peak.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

/// Ranks that are counted one by one; ranks above share the unattributed slot.
pub const MAX_RANKS: usize = 63;

/// One slot's live and peak bytes, on its own cache line.
#[repr(align(64))]
struct Slot {
    live: AtomicI64,
    peak: AtomicI64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    live: AtomicI64::new(0),
    peak: AtomicI64::new(0),
};

/// Slot 0: unattributed; slot r + 1: rank r.
static SLOTS: [Slot; MAX_RANKS + 1] = [EMPTY; MAX_RANKS + 1];
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// Counts this thread's allocations as rank `rank`'s from now on.
pub fn attribute(rank: usize) {
    let slot = if rank < MAX_RANKS { rank + 1 } else { 0 };
    // (a thread being torn down has no slot left: its frees count where they were allocated)
    let _ = CURRENT.try_with(|c| c.set(slot));
}

/// The rank this thread's allocations count for (`attribute`), if any.
pub fn attributed() -> Option<usize> {
    CURRENT
        .try_with(|c| c.get())
        .ok()
        .filter(|&s| s > 0)
        .map(|s| s - 1)
}

/// The most bytes rank `rank`'s threads held at once since the process started, when the
/// counting allocator is installed.
pub fn peak_bytes(rank: usize) -> Option<u64> {
    (INSTALLED.load(Ordering::Relaxed) && rank < MAX_RANKS)
        .then(|| SLOTS[rank + 1].peak.load(Ordering::Relaxed).max(0) as u64)
}

/// Bytes rank `rank`'s threads hold now, when the counting allocator is installed.
pub fn live_bytes(rank: usize) -> Option<u64> {
    (INSTALLED.load(Ordering::Relaxed) && rank < MAX_RANKS)
        .then(|| SLOTS[rank + 1].live.load(Ordering::Relaxed).max(0) as u64)
}

/// Bytes held now by threads of no rank.
pub fn unattributed_live() -> u64 {
    SLOTS[0].live.load(Ordering::Relaxed).max(0) as u64
}

/// Starts rank `rank`'s peak again from what it holds now (a new run in the same process).
pub fn reset_peak(rank: usize) {
    if rank < MAX_RANKS {
        let s = &SLOTS[rank + 1];
        s.peak
            .store(s.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The process's peak resident set size in bytes (`VmHWM`, Linux), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The counting wrapper around allocator `A`.
pub struct Counting<A>(pub A);

/// Blocks of at least this many bytes are remembered with the rank that allocated them, so
/// that freeing one on another thread (the shared initial parameters, a collective's buffer)
/// takes it off the right rank; smaller blocks count where they are freed. (A header in front
/// of every block would do it for all, but a block of 4 MiB + 16 bytes falls into a worse size
/// class of mimalloc: a third of a step went to page faults.)
const LARGE: usize = 64 * 1024;
/// Slots of the table of large blocks (a power of two), and how far an insert or a lookup
/// probes before it gives up (the block then counts like a small one).
const TABLE: usize = 1 << 16;
const PROBES: usize = 128;
/// `key` 0: empty; 1: a removed entry (probes go on past it).
const EMPTY_KEY: usize = 0;
const REMOVED: usize = 1;

struct Entry {
    key: AtomicUsize,
    slot: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const NO_ENTRY: Entry = Entry {
    key: AtomicUsize::new(EMPTY_KEY),
    slot: AtomicUsize::new(0),
};
static LARGE_BLOCKS: [Entry; TABLE] = [NO_ENTRY; TABLE];

fn home(ptr: usize) -> usize {
    // blocks are at least 16-byte aligned: mix the address bits
    (ptr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - 16)
}

/// Remembers that large block `ptr` counts for `slot`; false when the table is too crowded.
fn remember(ptr: usize, slot: usize) -> bool {
    let h = home(ptr);
    for i in 0..PROBES {
        let e = &LARGE_BLOCKS[(h + i) & (TABLE - 1)];
        let k = e.key.load(Ordering::Acquire);
        if (k == EMPTY_KEY || k == REMOVED)
            && e.key
                .compare_exchange(k, ptr, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            e.slot.store(slot, Ordering::Release);
            return true;
        }
    }
    false
}

/// The slot large block `ptr` was remembered with, forgetting it.
fn forget(ptr: usize) -> Option<usize> {
    let h = home(ptr);
    for i in 0..PROBES {
        let e = &LARGE_BLOCKS[(h + i) & (TABLE - 1)];
        let k = e.key.load(Ordering::Acquire);
        if k == ptr {
            let slot = e.slot.load(Ordering::Acquire);
            e.key.store(REMOVED, Ordering::Release);
            return Some(slot);
        }
        if k == EMPTY_KEY {
            return None;
        }
    }
    None
}

fn count(slot: usize, bytes: i64) {
    let s = &SLOTS[slot.min(MAX_RANKS)];
    let live = s.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if bytes > 0 {
        s.peak.fetch_max(live, Ordering::Relaxed);
    }
}

fn current_slot() -> usize {
    CURRENT.try_with(|c| c.get()).unwrap_or(0)
}

/// Counts a new block for this thread's rank.
fn allocated(ptr: *mut u8, size: usize) {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let slot = current_slot();
    if size >= LARGE {
        remember(ptr as usize, slot);
    }
    count(slot, size as i64);
}

/// Takes a freed block off the rank that allocated it (large blocks) or this thread's.
fn freed(ptr: *mut u8, size: usize) {
    let slot = if size >= LARGE {
        forget(ptr as usize)
    } else {
        None
    };
    count(slot.unwrap_or_else(current_slot), -(size as i64));
}

// SAFETY: every call goes to the inner allocator unchanged; the counting only reads sizes and
// addresses.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            allocated(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            allocated(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(ptr, layout.size());
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // forgotten before the inner call: once it returns, another thread may get `ptr`
        freed(ptr, layout.size());
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // the old block stays
            allocated(ptr, layout.size());
        } else {
            allocated(p, new_size);
        }
        p
    }
}
