//! Page-aligned data buffers: O_DIRECT needs alignment, and slot buffers are
//! reused for the connection's whole life so the data path never allocates
//! once warm.

pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
}

unsafe impl Send for AlignedBuf {}

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
        let layout = std::alloc::Layout::from_size_align(cap, ALIGN).expect("layout");
        let p = unsafe { std::alloc::alloc(layout) };
        assert!(!p.is_null(), "out of memory allocating {cap} bytes");
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
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
    pub fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.cap);
        if len == 0 {
            return &mut [];
        }
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
    fn free(&mut self) {
        if !self.ptr.is_null() {
            let layout = std::alloc::Layout::from_size_align(self.cap, ALIGN).unwrap();
            unsafe { std::alloc::dealloc(self.ptr, layout) };
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
