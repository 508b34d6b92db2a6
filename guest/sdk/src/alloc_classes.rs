//! The `rt` feature's global allocator: small blocks from per-size free lists in front of
//! dlmalloc.
//!
//! A collector allocates and frees a handful of short strings and small vectors for every
//! point of every round (names, tags, the host's replies). dlmalloc's bookkeeping for each
//! of those is most of a small collector's own time in the component; here a block of a size
//! class is taken from and returned to a singly linked free list, and only larger blocks (or
//! over-aligned ones) go to dlmalloc. Freed small blocks stay on their list for the next
//! round rather than going back to dlmalloc: a plugin's small-block memory is what it held
//! at most at once. WebAssembly plugins run on one thread and an instance is never
//! re-entered, so the lists need no lock.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;

/// The block sizes, in bytes; every block is aligned to [`ALIGN`].
const CLASSES: [usize; 6] = [8, 16, 32, 48, 64, 128];

/// The alignment of every small block (enough for anything up to `u64`/`f64`).
const ALIGN: usize = 8;

/// A global allocator serving small blocks from free lists and the rest from `A`.
pub struct SizeClasses<A> {
    inner: A,
    /// The first free block of each class; each free block holds the next one's address.
    free: UnsafeCell<[*mut u8; CLASSES.len()]>,
}

// SAFETY: used only on single-threaded targets (wasm32 without threads), where no two
// threads can reach the lists; see the module documentation.
unsafe impl<A: Sync> Sync for SizeClasses<A> {}

impl<A> SizeClasses<A> {
    /// Puts the free lists in front of `inner`.
    pub const fn new(inner: A) -> Self {
        SizeClasses {
            inner,
            free: UnsafeCell::new([ptr::null_mut(); CLASSES.len()]),
        }
    }
}

/// The size class of a layout, if it is served from a free list.
fn class(layout: Layout) -> Option<usize> {
    if layout.align() > ALIGN {
        return None;
    }
    CLASSES.iter().position(|&size| layout.size() <= size)
}

unsafe impl<A: GlobalAlloc> GlobalAlloc for SizeClasses<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(index) = class(layout) else {
            // SAFETY: forwarded as received.
            return unsafe { self.inner.alloc(layout) };
        };
        // SAFETY: single-threaded (see the `Sync` impl) and not re-entered: `inner` never
        // calls back into this allocator.
        let free = unsafe { &mut *self.free.get() };
        let head = free[index];
        if head.is_null() {
            // SAFETY: a non-zero size and a power-of-two alignment.
            return unsafe {
                self.inner
                    .alloc(Layout::from_size_align_unchecked(CLASSES[index], ALIGN))
            };
        }
        // SAFETY: a free block of this class holds the address of the next one.
        free[index] = unsafe { head.cast::<*mut u8>().read() };
        head
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let Some(index) = class(layout) else {
            // SAFETY: forwarded as received.
            return unsafe { self.inner.dealloc(block, layout) };
        };
        // SAFETY: as in `alloc`; the block is at least 8 bytes and 8-aligned (it came from
        // this class), so it can hold the list's next address.
        unsafe {
            let free = &mut *self.free.get();
            block.cast::<*mut u8>().write(free[index]);
            free[index] = block;
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees a valid size for this alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new_layout)) {
            // The block already has room for the new size.
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: forwarded as received.
            (None, None) => unsafe { self.inner.realloc(block, layout, new_size) },
            _ => {
                // SAFETY: `new_layout` is valid; the old block is valid for its size and
                // distinct from the new one.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::vec::Vec;

    #[test]
    fn small_blocks_are_reused_and_keep_their_contents_through_realloc() {
        let heap = SizeClasses::new(std::alloc::System);
        let small = Layout::from_size_align(12, 4).unwrap();
        // SAFETY: valid layouts; every block is freed with the layout it was made with.
        unsafe {
            let a = heap.alloc(small);
            let b = heap.alloc(small);
            assert!(!a.is_null() && !b.is_null() && a != b);
            assert_eq!(a as usize % ALIGN, 0);
            heap.dealloc(a, small);
            // The freed block is the next one of its class.
            let c = heap.alloc(small);
            assert_eq!(c, a);
            // Growing within the class keeps the block; past it, moves with the contents.
            c.copy_from_nonoverlapping(b"twelve bytes".as_ptr(), 12);
            assert_eq!(heap.realloc(c, small, 16), c);
            let grown = heap.realloc(c, Layout::from_size_align(16, 4).unwrap(), 100);
            assert_ne!(grown, c);
            assert_eq!(core::slice::from_raw_parts(grown, 12), b"twelve bytes");
            // The old block went back to its list; a big block shrinking moves back.
            assert_eq!(heap.alloc(small), c);
            let shrunk = heap.realloc(grown, Layout::from_size_align(100, 4).unwrap(), 12);
            assert_eq!(core::slice::from_raw_parts(shrunk, 12), b"twelve bytes");
            heap.dealloc(shrunk, small);
            heap.dealloc(c, small);
            heap.dealloc(b, small);
            // Over-aligned and large blocks go to the backing allocator.
            let big = Layout::from_size_align(4096, 8).unwrap();
            let wide = Layout::from_size_align(16, 64).unwrap();
            for layout in [big, wide] {
                let p = heap.alloc(layout);
                assert_eq!(p as usize % layout.align(), 0);
                heap.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn many_mixed_allocations_hold_their_own_values() {
        let heap = SizeClasses::new(std::alloc::System);
        let mut blocks: Vec<(*mut u8, Layout, u8)> = Vec::new();
        for round in 0..4u8 {
            for size in [1usize, 7, 8, 9, 31, 48, 49, 64, 100, 128, 129, 500] {
                let layout = Layout::from_size_align(size, 1).unwrap();
                // SAFETY: a valid layout; the block is written within its size.
                let p = unsafe { heap.alloc(layout) };
                unsafe { p.write_bytes(round ^ size as u8, size) };
                blocks.push((p, layout, round ^ size as u8));
            }
            // Free every other block, so the next round reuses them.
            let mut kept = Vec::new();
            for (i, (p, layout, fill)) in blocks.drain(..).enumerate() {
                // SAFETY: reading the block's own bytes, then freeing it once.
                let bytes = unsafe { core::slice::from_raw_parts(p, layout.size()) };
                assert!(bytes.iter().all(|&b| b == fill));
                if i % 2 == 0 {
                    unsafe { heap.dealloc(p, layout) };
                } else {
                    kept.push((p, layout, fill));
                }
            }
            blocks = kept;
        }
        for (p, layout, _) in blocks {
            // SAFETY: each block is freed once.
            unsafe { heap.dealloc(p, layout) };
        }
    }
}
