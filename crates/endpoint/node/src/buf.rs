//! Page-aligned data buffers: O_DIRECT needs alignment, and slot buffers are
//! reused for the connection's whole life so the data path never allocates
//! once warm.

pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
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
        }
    }
    /// Makes room for `len` bytes, reallocating (without keeping contents)
    /// only when the buffer is too small.
    pub fn ensure(&mut self, len: usize) {
        if len <= self.cap {
            return;
        }
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
            self.cap = 0;
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        self.free();
    }
}
