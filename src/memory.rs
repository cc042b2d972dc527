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

/// Blocks of at least this many bytes (64 KiB) are mapped from the OS for themselves and kept
/// for reuse within a bound (`Cache`), so the resident set follows the most the ranks held:
/// an allocator that keeps whatever was freed keeps the high-water mark of a step's short-lived
/// large buffers (fsdp's gathered units and their gradients) and its fragments resident for the
/// rest of the run, and mimalloc, which returns them, faults them in again every step (blocks
/// of 64 KiB to 1 MiB cost the baby GPT 3,500 page faults a step there).
#[cfg(target_os = "linux")]
const MAPPED: usize = 1 << 16;
#[cfg(target_os = "linux")]
const PAGE: usize = 4096;
/// Mapped blocks of at least this size ask for transparent huge pages (fewer page faults).
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

#[cfg(target_os = "linux")]
fn mapped(layout: Layout) -> bool {
    layout.size() >= MAPPED && layout.align() <= PAGE && pages_of_4k()
}

/// Whether the kernel's pages are 4 KiB, which the mappings' arithmetic assumes (on a kernel
/// with 16 or 64 KiB pages every block stays with the inner allocator). Asked once.
#[cfg(target_os = "linux")]
fn pages_of_4k() -> bool {
    // 0: not asked yet; 1: yes; 2: no
    static KNOWN: AtomicUsize = AtomicUsize::new(0);
    match KNOWN.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // SAFETY: sysconf reads a constant of the system
            let ok = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } == PAGE as libc::c_long;
            KNOWN.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            ok
        }
    }
}

#[cfg(target_os = "linux")]
fn map(size: usize) -> *mut u8 {
    let huge = size >= HUGE;
    // huge blocks start on a huge page: mapped with room to spare, the ends cut off
    let len = if huge { size + HUGE } else { size };
    let anon = |len: usize| {
        // SAFETY: an anonymous private mapping of `len` bytes; nothing else is touched
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(p)
    };
    let p = match anon(len) {
        Some(p) => p,
        // without the room to align it, a plain mapping
        None if huge => return anon(size).map_or(std::ptr::null_mut(), |p| p.cast()),
        None => return std::ptr::null_mut(),
    };
    if !huge {
        return p.cast();
    }
    let start = p as usize;
    let aligned = (start + HUGE - 1) & !(HUGE - 1);
    let end = aligned + pages(size);
    // SAFETY: both ranges lie inside the mapping just made, outside the block handed out
    unsafe {
        if aligned > start {
            libc::munmap(p, aligned - start);
        }
        if start + len > end {
            libc::munmap(end as *mut libc::c_void, start + len - end);
        }
        // a kernel without transparent huge pages ignores the advice
        libc::madvise(aligned as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
    }
    aligned as *mut u8
}

#[cfg(target_os = "linux")]
fn unmap(ptr: *mut u8, size: usize) {
    // SAFETY: `ptr` is a mapping of `size` bytes made by `map` (or `mremap`)
    unsafe { libc::munmap(ptr.cast(), size) };
}

/// Freed mappings kept for the next block of the same length, newest last: the same shapes
/// come back every step (a forward's activations, a unit's gradient), and a kept mapping is
/// reused without the kernel zeroing it again. A fresh mapping costs a page fault for every
/// 4 KiB touched (a third of the CPU time of the baby GPT's step went to the kernel).
///
/// What is kept is bounded by the high-water mark: kept + handed-out bytes never exceed the
/// most the mapped blocks ever held at once (`peak`) by more than a half, so the resident set
/// stays within 1.5x the peak that the ranks' blocks reached anyway. A block freed can always
/// be kept (handed-out bytes fall by as much); a new block that no kept one fits evicts the
/// oldest kept ones until the bound holds again. (Without the half, every kept block must go
/// by the step's peak and the next forward finds few of its shapes: on the baby GPT of
/// `experiments/bench-baby-gpt.toml` that was 11,000 page faults a step, with it 200.)
#[cfg(target_os = "linux")]
struct Cache {
    blocks: [(usize, usize); CACHE_SLOTS],
    len: usize,
    /// Bytes kept.
    bytes: usize,
    /// Bytes of the mapped blocks handed out now, and the most they ever were.
    live: usize,
    peak: usize,
}

#[cfg(target_os = "linux")]
const CACHE_SLOTS: usize = 512;

#[cfg(target_os = "linux")]
static CACHE: std::sync::Mutex<Cache> = std::sync::Mutex::new(Cache {
    blocks: [(0, 0); CACHE_SLOTS],
    len: 0,
    bytes: 0,
    live: 0,
    peak: 0,
});

#[cfg(target_os = "linux")]
fn cache() -> std::sync::MutexGuard<'static, Cache> {
    // (nothing panics while holding it)
    CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(target_os = "linux")]
impl Cache {
    /// Takes kept block `i` out.
    fn remove(&mut self, i: usize) -> (usize, usize) {
        let b = self.blocks[i];
        let n = self.len;
        self.blocks.copy_within(i + 1..n, i);
        self.len -= 1;
        self.bytes -= b.1;
        b
    }

    /// `len` more bytes handed out: the peak follows, and the oldest kept blocks go (into
    /// `evicted`, unmapped by the caller outside the lock) until kept + handed out fit in it.
    fn hand_out(&mut self, len: usize, evicted: &mut Evicted) {
        self.live += len;
        self.peak = self.peak.max(self.live);
        while self.len > 0 && self.bytes + self.live > self.peak + self.peak / 2 {
            evicted.push(self.remove(0));
        }
    }
}

/// Blocks evicted from the cache, to unmap once its lock is released.
#[cfg(target_os = "linux")]
struct Evicted {
    blocks: [(usize, usize); CACHE_SLOTS],
    len: usize,
}

#[cfg(target_os = "linux")]
impl Evicted {
    fn new() -> Self {
        Evicted {
            blocks: [(0, 0); CACHE_SLOTS],
            len: 0,
        }
    }
    fn push(&mut self, b: (usize, usize)) {
        if self.len == CACHE_SLOTS {
            // (cannot happen: at most CACHE_SLOTS are kept) unmapped at once rather than lost
            unmap(b.0 as *mut u8, b.1);
            return;
        }
        self.blocks[self.len] = b;
        self.len += 1;
    }
    fn unmap_all(&self) {
        for &(p, l) in &self.blocks[..self.len] {
            unmap(p as *mut u8, l);
        }
    }
}

/// The mapping's length: whole pages.
#[cfg(target_os = "linux")]
fn pages(size: usize) -> usize {
    (size + PAGE - 1) & !(PAGE - 1)
}

/// A block of `size` bytes: a kept mapping of the same length (`zeroed`: cleared), or a new one.
#[cfg(target_os = "linux")]
fn take(size: usize, zeroed: bool) -> *mut u8 {
    let len = pages(size);
    let mut evicted = Evicted::new();
    let kept = {
        let mut c = cache();
        let found = (0..c.len).rev().find(|&i| c.blocks[i].1 == len);
        let kept = found.map(|i| c.remove(i).0 as *mut u8);
        c.hand_out(len, &mut evicted);
        kept
    };
    evicted.unmap_all();
    match kept {
        Some(p) => {
            if zeroed {
                // SAFETY: a mapping of `len >= size` bytes that nothing else holds
                unsafe { std::ptr::write_bytes(p, 0, size) };
            }
            p
        }
        None => {
            let p = map(size);
            if p.is_null() {
                cache().live -= len;
            }
            p
        }
    }
}

/// Frees mapped block `ptr` of `size` bytes: kept for reuse (the oldest kept one unmapped when
/// every slot is taken).
#[cfg(target_os = "linux")]
fn give(ptr: *mut u8, size: usize) {
    let len = pages(size);
    let oldest = {
        let mut c = cache();
        c.live -= len;
        let oldest = (c.len == CACHE_SLOTS).then(|| c.remove(0));
        let n = c.len;
        c.blocks[n] = (ptr as usize, len);
        c.len += 1;
        c.bytes += len;
        oldest
    };
    // unmapped outside the lock
    if let Some((p, l)) = oldest {
        unmap(p as *mut u8, l);
    }
}

/// A handed-out mapped block resized in place or moved by the kernel (`remap`) from `old` to
/// `new` bytes.
#[cfg(target_os = "linux")]
fn resized(old: usize, new: usize) {
    let mut evicted = Evicted::new();
    {
        let mut c = cache();
        c.live -= pages(old);
        c.hand_out(pages(new), &mut evicted);
    }
    evicted.unmap_all();
}

/// Mapping `ptr` of `old` bytes (made by `map`) grown or shrunk to `new` bytes, moved if need
/// be (the kernel moves the pages, nothing is copied); null when the kernel refuses.
#[cfg(target_os = "linux")]
fn remap(ptr: *mut u8, old: usize, new: usize) -> *mut u8 {
    // SAFETY: `ptr` is a mapping of `old` bytes
    let q = unsafe { libc::mremap(ptr.cast(), old, new, libc::MREMAP_MAYMOVE) };
    if q == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        q.cast()
    }
}

// SAFETY: every call goes to the inner allocator unchanged, or (large blocks, Linux) to a
// mapping of its own that is page-aligned, zeroed and at least `layout.size()` long; the counting
// only reads sizes and addresses.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.alloc_inner(layout, false) };
        if !p.is_null() {
            allocated(p, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.alloc_inner(layout, true) };
        if !p.is_null() {
            allocated(p, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(ptr, layout.size());
        unsafe { self.dealloc_inner(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `realloc`'s contract gives a valid size for the alignment
            let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            if mapped(layout) && mapped(new_layout) {
                // forgotten before the move: once the old block is gone, another thread may
                // get `ptr`
                freed(ptr, layout.size());
                let p = remap(ptr, layout.size(), new_size);
                if !p.is_null() {
                    resized(layout.size(), new_size);
                    allocated(p, new_size);
                    return p;
                }
                // the kernel would not move it: the old block stays, copied below
                allocated(ptr, layout.size());
            }
            if mapped(layout) || mapped(new_layout) {
                let q = unsafe { self.alloc_inner(new_layout, false) };
                if q.is_null() {
                    // the old block stays
                    return q;
                }
                // both blocks count while both exist
                allocated(q, new_size);
                // SAFETY: both blocks hold at least the smaller size and do not overlap
                unsafe { std::ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size)) };
                freed(ptr, layout.size());
                unsafe { self.dealloc_inner(ptr, layout) };
                return q;
            }
        }
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

impl<A: GlobalAlloc> Counting<A> {
    /// A block from its own mapping (large ones, Linux) or the inner allocator (`zeroed`:
    /// cleared), uncounted.
    unsafe fn alloc_inner(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if mapped(layout) {
            return take(layout.size(), zeroed);
        }
        if zeroed {
            unsafe { self.0.alloc_zeroed(layout) }
        } else {
            unsafe { self.0.alloc(layout) }
        }
    }

    /// Frees a block of `alloc_inner`, uncounted.
    unsafe fn dealloc_inner(&self, ptr: *mut u8, layout: Layout) {
        #[cfg(target_os = "linux")]
        if mapped(layout) {
            give(ptr, layout.size());
            return;
        }
        unsafe { self.0.dealloc(ptr, layout) }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn mapped_blocks_are_zeroed_aligned_and_keep_their_bytes_when_resized() {
        for size in [MAPPED, MAPPED + 3, HUGE - 1, HUGE, 3 * HUGE + 12_345] {
            let p = map(size);
            assert!(!p.is_null());
            assert_eq!(p as usize % PAGE, 0, "{size}");
            if size >= HUGE {
                assert_eq!(p as usize % HUGE, 0, "{size}: starts on a huge page");
            }
            // SAFETY: `p` is a fresh mapping of `size` bytes
            let block = unsafe { std::slice::from_raw_parts_mut(p, size) };
            assert!(block.iter().all(|&b| b == 0), "{size}: zeroed");
            for (i, b) in block.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let grown = remap(p, size, 2 * size + 1);
            assert!(!grown.is_null());
            // SAFETY: the grown mapping holds the old bytes first
            let kept = unsafe { std::slice::from_raw_parts(grown, size) };
            assert!(kept.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            let shrunk = remap(grown, 2 * size + 1, MAPPED);
            assert!(!shrunk.is_null());
            // SAFETY: the shrunk mapping holds the first MAPPED bytes
            let kept = unsafe { std::slice::from_raw_parts(shrunk, MAPPED) };
            assert!(kept.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            unmap(shrunk, MAPPED);
        }
    }

    #[test]
    fn freed_mappings_are_reused_and_kept_bytes_stay_under_the_high_water_mark() {
        let bound = || {
            let c = cache();
            assert!(
                c.bytes + c.live <= c.peak + c.peak / 2,
                "{} kept + {} live > 1.5 x {} peak",
                c.bytes,
                c.live,
                c.peak
            );
        };
        let a = take(3 * MAPPED, false);
        let b = take(5 * MAPPED + 1, false);
        // SAFETY: fresh blocks of these sizes
        unsafe {
            std::ptr::write_bytes(a, 7, 3 * MAPPED);
            std::ptr::write_bytes(b, 9, 5 * MAPPED + 1);
        }
        give(a, 3 * MAPPED);
        bound();
        // the same length again: the kept mapping, cleared when asked
        let a2 = take(3 * MAPPED, true);
        assert_eq!(
            a2, a,
            "a kept mapping of the same length is handed out again"
        );
        // SAFETY: a block of 3 * MAPPED bytes
        assert!(unsafe { std::slice::from_raw_parts(a2, 3 * MAPPED) }
            .iter()
            .all(|&x| x == 0));
        bound();
        give(a2, 3 * MAPPED);
        give(b, 5 * MAPPED + 1);
        bound();
        // a length nothing kept fits: the oldest kept blocks go until the bound holds
        let big = take(20 * MAPPED, false);
        bound();
        give(big, 20 * MAPPED);
        bound();
    }

    #[test]
    fn only_large_page_aligned_blocks_are_mapped() {
        let at = |size, align| Layout::from_size_align(size, align).unwrap();
        assert!(mapped(at(MAPPED, 8)));
        assert!(mapped(at(MAPPED, PAGE)));
        assert!(!mapped(at(MAPPED - 1, 8)));
        assert!(!mapped(at(MAPPED, 2 * PAGE)));
    }
}

/// Bytes of memory the machine has available (`MemAvailable`), when it says.
pub fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}
