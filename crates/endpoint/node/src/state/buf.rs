//! Page-aligned data buffers: O_DIRECT needs alignment, and slot buffers are
//! reused for the connection's whole life so the data path never allocates
//! once warm.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
    /// Set while this buffer is counted in a [`BufferBudget`].
    charged: Option<Arc<BufferBudget>>,
}

/// Bytes of large command buffers (above `slot_buffer_keep`) that finished
/// commands may keep for reuse, across the node (`large_buffer_budget`).
/// Within it, large transfers reuse buffers as small ones do; beyond it,
/// their buffers are freed after each command.
pub struct BufferBudget {
    limit: u64,
    used: AtomicU64,
}

impl BufferBudget {
    pub fn new(limit: u64) -> BufferBudget {
        BufferBudget {
            limit,
            used: AtomicU64::new(0),
        }
    }
    /// Bytes currently kept under this budget.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }
    fn try_charge(&self, n: u64) -> bool {
        self.used
            .fetch_update(Relaxed, Relaxed, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }
}

/// Node-wide bytes that commands with large transfers (above
/// `slot_buffer_keep`) may hold in flight, from admission to completion
/// (`target.transfer_pool`), as SPDK's shared data-buffer pool. A command
/// that finds no room waits before its buffer is allocated and before its
/// R2T goes out, so no peer, however many writes it parks after R2T, makes
/// the node allocate past this. Smaller transfers use the buffer their slot
/// keeps (bounded per queue pair by its depth × `slot_buffer_keep`).
pub struct TransferPool {
    limit: u64,
    used: AtomicU64,
    /// Commands that found no room (they waited), for `/metrics`.
    waits: AtomicU64,
}

/// Bytes of a [`TransferPool`] held by one command; returned when dropped.
pub struct PoolGrant {
    pool: Arc<TransferPool>,
    bytes: u64,
}

impl TransferPool {
    pub fn new(limit: u64) -> TransferPool {
        TransferPool {
            limit,
            used: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Bytes held by commands now.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }
    /// Commands that have had to wait for room.
    pub fn waits(&self) -> u64 {
        self.waits.load(Relaxed)
    }
    /// `bytes` for one command, or None (and a wait counted) when the pool
    /// has no room for them.
    pub fn try_take(self: &Arc<Self>, bytes: u64) -> Option<PoolGrant> {
        let ok = self
            .used
            .fetch_update(Relaxed, Relaxed, |u| {
                u.checked_add(bytes).filter(|&t| t <= self.limit)
            })
            .is_ok();
        if !ok {
            self.waits.fetch_add(1, Relaxed);
            return None;
        }
        Some(PoolGrant {
            pool: self.clone(),
            bytes,
        })
    }
}

impl PoolGrant {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for PoolGrant {
    fn drop(&mut self) {
        self.pool.used.fetch_sub(self.bytes, Relaxed);
    }
}

// SAFETY: the buffer is uniquely owned heap memory (no aliasing handles are
// kept), so moving it to another thread is as sound as moving a Vec<u8>.
unsafe impl Send for AlignedBuf {}

/// O_DIRECT needs offsets and buffers aligned to the device's logical block;
/// a page covers every block size we accept.
const ALIGN: usize = 4096;

impl AlignedBuf {
    pub const fn empty() -> AlignedBuf {
        AlignedBuf {
            ptr: std::ptr::null_mut(),
            cap: 0,
            charged: None,
        }
    }
    /// Makes room for `len` bytes, reallocating (without keeping contents)
    /// only when the buffer is too small.
    #[inline]
    pub fn ensure(&mut self, len: usize) {
        if len > self.cap {
            self.grow(len);
        }
    }

    #[cold]
    fn grow(&mut self, len: usize) {
        self.free();
        let cap = len.next_power_of_two().max(ALIGN);
        let Ok(layout) = std::alloc::Layout::from_size_align(cap, ALIGN) else {
            // Only for sizes near usize::MAX, which transfer limits exclude.
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<u8>());
        };
        // SAFETY: the layout has a non-zero size (cap >= ALIGN).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        self.ptr = p;
        self.cap = cap;
    }
    /// After a command: keeps the buffer if it holds at most `keep` bytes,
    /// or if `budget` has room for it (counted until freed); frees it
    /// otherwise, so a burst of large transfers cannot pin memory for the
    /// connection's life.
    pub fn shrink_to(&mut self, keep: usize, budget: &Arc<BufferBudget>) {
        if self.cap <= keep || self.charged.is_some() {
            return;
        }
        if budget.try_charge(self.cap as u64) {
            self.charged = Some(budget.clone());
        } else {
            self.free();
        }
    }
    pub fn capacity(&self) -> usize {
        self.cap
    }
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    pub fn slice(&self, len: usize) -> &[u8] {
        assert!(len <= self.cap);
        if len == 0 {
            return &[];
        }
        // SAFETY: ptr is a live allocation of cap >= len bytes, and the
        // shared borrow of self keeps it from being freed or written meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
    pub fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.cap);
        if len == 0 {
            return &mut [];
        }
        // SAFETY: ptr is a live allocation of cap >= len bytes, borrowed
        // exclusively through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
    fn free(&mut self) {
        if !self.ptr.is_null() {
            // The same layout was valid when the buffer was allocated.
            if let Ok(layout) = std::alloc::Layout::from_size_align(self.cap, ALIGN) {
                // SAFETY: ptr came from alloc with exactly this layout and is
                // freed once (it is nulled right after).
                unsafe { std::alloc::dealloc(self.ptr, layout) };
            }
            self.ptr = std::ptr::null_mut();
            if let Some(b) = self.charged.take() {
                b.used.fetch_sub(self.cap as u64, Relaxed);
            }
            self.cap = 0;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_kept_within_the_budget_and_freed_beyond_it() {
        let budget = Arc::new(BufferBudget::new(2 << 20));
        let mut bufs: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::empty()).collect();
        for b in &mut bufs {
            b.ensure(1 << 20);
            b.shrink_to(128 << 10, &budget);
        }
        let kept: Vec<usize> = bufs.iter().map(|b| b.capacity()).collect();
        assert_eq!(
            kept,
            [1 << 20, 1 << 20, 0],
            "two fit the budget, the third is freed"
        );
        assert_eq!(budget.used(), 2 << 20);
        bufs[0].shrink_to(128 << 10, &budget);
        assert_eq!(budget.used(), 2 << 20, "a kept buffer is counted once");
        let mut small = AlignedBuf::empty();
        small.ensure(64 << 10);
        small.shrink_to(128 << 10, &budget);
        assert_eq!(small.capacity(), 64 << 10, "ordinary sizes are always kept");
        bufs.truncate(1);
        assert_eq!(
            budget.used(),
            1 << 20,
            "dropping a kept buffer returns its bytes"
        );
        bufs[0].ensure(2 << 20);
        assert_eq!(
            budget.used(),
            0,
            "growing reallocates: the old charge is returned"
        );
    }
}
