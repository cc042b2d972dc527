//! Measured memory: a counting wrapper around the global allocator that attributes every byte
//! to the rank whose thread allocated it, and the process's peak resident set.
//!
//! Each allocation carries a small header with the slot of the thread that made it, so a block
//! freed on another thread (a buffer handed between ranks, a loader's batch) is taken off the
//! rank that allocated it. A thread joins a rank with `attribute(rank)` (the rank's worker, its
//! data loader threads); anything else counts as unattributed. The binary installs it
//! (`main.rs`); a program that does not (a test linking the library) reports no peak.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

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

/// Header bytes in front of a block of alignment `align`: room for the slot, keeping the
/// block's alignment.
fn header(align: usize) -> usize {
    align.max(16)
}

fn count(slot: usize, bytes: i64) {
    let s = &SLOTS[slot];
    let live = s.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if bytes > 0 {
        s.peak.fetch_max(live, Ordering::Relaxed);
    }
}

fn current_slot() -> usize {
    CURRENT.try_with(|c| c.get()).unwrap_or(0)
}

// SAFETY: every block handed out is `header(align)` bytes into a block of the inner allocator
// made with the header's size and the same (or larger) alignment; the slot is stored in the
// 8 bytes before the returned pointer, inside the header. `dealloc`/`realloc` undo exactly that.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        let h = header(layout.align());
        let Ok(outer) = Layout::from_size_align(layout.size() + h, h) else {
            return std::ptr::null_mut();
        };
        let base = unsafe { self.0.alloc(outer) };
        if base.is_null() {
            return base;
        }
        let slot = current_slot();
        unsafe {
            let p = base.add(h);
            (p.sub(8) as *mut u64).write(slot as u64);
            count(slot, layout.size() as i64);
            p
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        let h = header(layout.align());
        let Ok(outer) = Layout::from_size_align(layout.size() + h, h) else {
            return std::ptr::null_mut();
        };
        let base = unsafe { self.0.alloc_zeroed(outer) };
        if base.is_null() {
            return base;
        }
        let slot = current_slot();
        unsafe {
            let p = base.add(h);
            (p.sub(8) as *mut u64).write(slot as u64);
            count(slot, layout.size() as i64);
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout.align());
        unsafe {
            let slot = (ptr.sub(8) as *const u64).read() as usize;
            count(slot.min(MAX_RANKS), -(layout.size() as i64));
            let outer = Layout::from_size_align_unchecked(layout.size() + h, h);
            self.0.dealloc(ptr.sub(h), outer);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let h = header(layout.align());
        unsafe {
            let old_slot = (ptr.sub(8) as *const u64).read() as usize;
            let outer = Layout::from_size_align_unchecked(layout.size() + h, h);
            let base = self.0.realloc(ptr.sub(h), outer, new_size + h);
            if base.is_null() {
                return base;
            }
            let slot = current_slot();
            let p = base.add(h);
            (p.sub(8) as *mut u64).write(slot as u64);
            count(old_slot.min(MAX_RANKS), -(layout.size() as i64));
            count(slot, new_size as i64);
            p
        }
    }
}
