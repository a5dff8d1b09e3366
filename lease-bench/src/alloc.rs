//! A counting global allocator: the bytes this process has allocated and
//! not yet freed, so the scale runs can say what each lease costs in heap
//! without the allocator's retained pages (which RSS includes) in the way,
//! and how many allocations it asked for, so they can say what each renewal
//! costs the allocator (whose slow paths dominate a client that allocates
//! much per request).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes and allocations.
pub struct Counting;

// SAFETY: every call is passed to the system allocator unchanged; the
// counter is only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { System.alloc(layout) };
        CALLS.fetch_add(1, Ordering::Relaxed);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        CALLS.fetch_add(1, Ordering::Relaxed);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        CALLS.fetch_add(1, Ordering::Relaxed);
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

/// Bytes allocated and not freed, now.
pub fn live() -> u64 {
    LIVE.load(Ordering::Relaxed) as u64
}

/// Allocations asked for so far (a reallocation counts as one).
pub fn calls() -> u64 {
    CALLS.load(Ordering::Relaxed) as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_what_is_held() {
        let before = super::live() / 2;
        let v: Vec<u8> = Vec::with_capacity(64 << 20);
        // Other test threads allocate and free too: only a rough bound holds.
        assert!(
            super::live() >= before.saturating_add(32 << 20),
            "{}",
            super::live()
        );
        drop(v);
    }

    #[test]
    fn counts_each_allocation() {
        let before = super::calls();
        let boxes: Vec<Box<u64>> = (0..1000).map(Box::new).collect();
        assert!(super::calls() >= before.saturating_add(1000));
        drop(boxes);
    }
}
