//! A connection's output queue: PDU headers in a bump arena, payloads as
//! references into slot buffers, gathered into one `sendmsg` per loop.
//!
//! A slot is released only once every byte that references it has been
//! handed to the kernel, which is when `sendmsg` returns (no zero-copy).

pub const ARENA_BYTES: usize = 64 << 10;
pub const MAX_ENTRIES: usize = 4096;
/// Room kept free before a new PDU is parsed: the largest response one
/// command produces (C2H header + digest + CapsuleResp, or a TermReq).
pub const ROOM_PER_COMMAND: usize = 256;
pub const NO_RELEASE: u16 = u16::MAX;

#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// `NO_RELEASE` for arena bytes, else the slot whose buffer holds them.
    pub data_slot: u16,
    pub off: u32,
    pub len: u32,
    /// Slot to free once this entry is fully sent.
    pub release: u16,
}

pub struct Tx {
    arena: Box<[u8]>,
    used: usize,
    entries: Vec<Entry>,
    head: usize,
    head_sent: usize,
}

impl Default for Tx {
    fn default() -> Self {
        Tx {
            arena: vec![0u8; ARENA_BYTES].into_boxed_slice(),
            used: 0,
            entries: Vec::with_capacity(256),
            head: 0,
            head_sent: 0,
        }
    }
}

impl Tx {
    pub fn has_room(&self) -> bool {
        self.used + ROOM_PER_COMMAND <= ARENA_BYTES && self.entries.len() + 8 <= MAX_ENTRIES
    }
    pub fn is_empty(&self) -> bool {
        self.head == self.entries.len()
    }
    /// Appends header bytes written by `f` (which returns their length).
    pub fn push_bytes(&mut self, release: u16, f: impl FnOnce(&mut [u8]) -> usize) {
        let start = self.used;
        let n = f(&mut self.arena[start..]);
        assert!(n > 0 && start + n <= ARENA_BYTES, "tx arena overflow");
        self.used += n;
        self.entries.push(Entry {
            data_slot: NO_RELEASE,
            off: start as u32,
            len: n as u32,
            release,
        });
    }
    /// Appends `len` bytes of slot `slot`'s buffer.
    pub fn push_slot_data(&mut self, slot: u16, len: u32, release: u16) {
        debug_assert!(len > 0);
        self.entries.push(Entry {
            data_slot: slot,
            off: 0,
            len,
            release,
        });
    }
    /// Fills `out` with iovecs for unsent bytes; `slot_ptr` maps a slot to its buffer.
    pub fn iovecs(
        &self,
        out: &mut Vec<libc::iovec>,
        max: usize,
        slot_ptr: impl Fn(u16) -> *const u8,
    ) {
        out.clear();
        for (i, e) in self.entries[self.head..].iter().enumerate().take(max) {
            let skip = if i == 0 { self.head_sent } else { 0 };
            let base = if e.data_slot == NO_RELEASE {
                self.arena.as_ptr()
            } else {
                slot_ptr(e.data_slot)
            };
            // SAFETY: entries only describe bytes inside their source (the
            // arena, or a slot buffer of at least off + len bytes), and skip < len.
            let p = unsafe { base.add(e.off as usize + skip) };
            out.push(libc::iovec {
                iov_base: p as *mut _,
                iov_len: e.len as usize - skip,
            });
        }
    }
    /// Marks `n` bytes as sent; calls `release` for every slot whose last byte went.
    pub fn advance(&mut self, mut n: usize, mut release: impl FnMut(u16)) {
        while n > 0 {
            let e = self.entries[self.head];
            let left = e.len as usize - self.head_sent;
            if n < left {
                self.head_sent += n;
                return;
            }
            n -= left;
            self.head += 1;
            self.head_sent = 0;
            if e.release != NO_RELEASE {
                release(e.release);
            }
        }
        if self.is_empty() {
            self.entries.clear();
            self.head = 0;
            self.used = 0;
        }
    }
    /// Pending bytes (for limits and diagnostics).
    pub fn pending_bytes(&self) -> usize {
        self.entries[self.head..]
            .iter()
            .map(|e| e.len as usize)
            .sum::<usize>()
            - self.head_sent
    }
    /// Slots referenced by unsent entries (to release them on close).
    pub fn drain_releases(&mut self, mut release: impl FnMut(u16)) {
        for e in &self.entries[self.head..] {
            if e.release != NO_RELEASE {
                release(e.release);
            }
        }
        self.entries.clear();
        self.head = 0;
        self.head_sent = 0;
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_sends_release_slots_only_when_fully_sent() {
        let mut tx = Tx::default();
        tx.push_bytes(NO_RELEASE, |b| {
            b[..24].fill(1);
            24
        });
        tx.push_slot_data(3, 100, NO_RELEASE);
        tx.push_bytes(3, |b| {
            b[..24].fill(2);
            24
        });
        let mut released = vec![];
        tx.advance(24 + 99, |s| released.push(s));
        assert!(released.is_empty());
        let mut iov = vec![];
        tx.iovecs(&mut iov, 64, |_| [0u8; 128].as_ptr());
        assert_eq!(iov.len(), 2);
        assert_eq!(iov[0].iov_len, 1, "one byte of the payload is left");
        tx.advance(1 + 24, |s| released.push(s));
        assert_eq!(released, vec![3]);
        assert!(tx.is_empty());
        assert!(tx.has_room(), "arena is recycled once drained");
    }
}
