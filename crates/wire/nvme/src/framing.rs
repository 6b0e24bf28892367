//! The two buffers every NVMe/TCP endpoint needs, shared by host and node.
//!
//! - [`RxBuf`]: the receive buffer. The owner `recv`s into [`RxBuf::space`],
//!   [`RxBuf::commit`]s what arrived, parses PDUs in place from
//!   [`RxBuf::pending`] and [`RxBuf::consume`]s them. It compacts itself so
//!   that any unit of up to `max_unit` bytes (the largest PDU, or PDU part,
//!   the owner parses in place) fits contiguously.
//! - [`TxQueue`]: the output queue. PDU headers go into a bump arena; payloads
//!   are referenced by a source id (a command slot) and an offset, never
//!   copied; every entry may carry a release tag, reported once its last byte
//!   has been sent. [`TxQueue::fill_iovecs`] lists the unsent bytes for one
//!   gathered `sendmsg`.
//!
//! Both are sans-IO (no syscalls, no clock) and allocate only when created or
//! when they first grow: the data path reuses them without allocating.

use std::ops::Range;

// ---- receive buffer ---------------------------------------------------------

/// A compacting receive buffer with a largest-unit guarantee.
///
/// Positions returned by [`RxBuf::head`] index the buffer itself (see the
/// `Index` impl) and stay valid until the next [`RxBuf::space`] call, which
/// is the only method that moves bytes. So a parser may keep ranges of
/// consumed PDUs (in-capsule data, say) while it handles them.
pub struct RxBuf {
    buf: Box<[u8]>,
    head: usize,
    tail: usize,
    max_unit: usize,
}

impl RxBuf {
    /// A buffer of `capacity` bytes (at least `max_unit`) in which any unit
    /// of up to `max_unit` bytes starting at the head fits contiguously.
    pub fn new(capacity: usize, max_unit: usize) -> RxBuf {
        let max_unit = max_unit.max(1);
        RxBuf {
            buf: vec![0u8; capacity.max(max_unit)].into_boxed_slice(),
            head: 0,
            tail: 0,
            max_unit,
        }
    }

    /// Drops every unparsed byte: the buffer is as [`RxBuf::new`] left it,
    /// but for its (never read) old contents.
    pub fn clear(&mut self) {
        self.head = 0;
        self.tail = 0;
    }

    /// Whether this buffer is the one `RxBuf::new(capacity, max_unit)` would make.
    pub fn reusable_as(&self, capacity: usize, max_unit: usize) -> bool {
        self.buf.len() == capacity.max(max_unit.max(1)) && self.max_unit == max_unit.max(1)
    }

    /// Free space to receive into, after the unparsed bytes.
    ///
    /// Compacts (moves the unparsed bytes to the front) when fewer than
    /// `max_unit` bytes are left after them. Hence: if the unparsed bytes are
    /// an incomplete unit of at most `max_unit` bytes, the returned space is
    /// non-empty and the unit completes contiguously. It is empty only when
    /// the whole buffer holds unparsed bytes (the owner stopped parsing).
    #[inline]
    pub fn space(&mut self) -> &mut [u8] {
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        } else if self.buf.len() - self.tail < self.max_unit {
            self.buf.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
        }
        // tail <= buf.len() always (commit clamps it).
        self.buf.get_mut(self.tail..).unwrap_or_default()
    }

    /// Accounts `n` bytes written at the start of [`RxBuf::space`].
    #[inline]
    pub fn commit(&mut self, n: usize) {
        debug_assert!(self.tail + n <= self.buf.len(), "commit past the space");
        self.tail += n.min(self.buf.len() - self.tail);
    }

    /// Copies as much of `bytes` as fits into the space and commits it;
    /// returns how many bytes were taken (tests and fuzzing feed this way).
    pub fn fill_from(&mut self, bytes: &[u8]) -> usize {
        let n = crate::copy_prefix(self.space(), bytes);
        self.commit(n);
        n
    }

    /// The received bytes not yet consumed.
    #[inline]
    pub fn pending(&self) -> &[u8] {
        // head <= tail <= buf.len() always (consume and commit clamp).
        self.buf.get(self.head..self.tail).unwrap_or_default()
    }

    /// The received bytes in `r`, or None past them: the checked form of
    /// indexing an `RxBuf`.
    #[inline]
    pub fn get(&self, r: Range<usize>) -> Option<&[u8]> {
        self.buf.get(..self.tail)?.get(r)
    }

    /// Number of unconsumed bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.tail - self.head
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    /// Position of the first unconsumed byte (valid until the next `space`).
    #[inline]
    pub fn head(&self) -> usize {
        self.head
    }

    /// Marks `n` bytes (at most [`RxBuf::len`]) as parsed.
    #[inline]
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len(), "consume past the received bytes");
        self.head += n.min(self.len());
    }

    /// The largest unit guaranteed to fit contiguously.
    #[inline]
    pub fn max_unit(&self) -> usize {
        self.max_unit
    }

    #[inline]
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }
}

/// Bytes by position, for ranges of PDUs already consumed (see [`RxBuf`]).
/// Only received bytes can be named: a range past them panics like a slice.
impl std::ops::Index<Range<usize>> for RxBuf {
    type Output = [u8];
    #[inline]
    #[allow(
        clippy::indexing_slicing,
        reason = "Index's contract is to panic out of range, as a slice does; \
                  the node indexes only PDUs check_layout bounded within the \
                  received bytes, and RxBuf::get is the checked form"
    )]
    fn index(&self, r: Range<usize>) -> &[u8] {
        &self.buf[..self.tail][r]
    }
}

// ---- output queue -------------------------------------------------------------

/// Release tag (and source id) meaning "none" / "the header arena".
pub const NO_RELEASE: u16 = u16::MAX;
/// The most bytes one [`TxQueue::push_bytes`] closure may write: enough for
/// any PDU header with digest, an ICReq/ICResp (128) or a TermReq (152).
pub const PUSH_MAX: usize = 256;
/// Arena room [`TxQueue::has_room`] keeps for the response to one command:
/// up to three pushes (C2H header, data digest, CapsuleResp), each of which
/// reserves a [`PUSH_MAX`] window, so a response never needs a new chunk.
pub const ROOM_PER_COMMAND: usize = 3 * PUSH_MAX;
/// Entries [`TxQueue::has_room`] keeps for the response to one command.
pub const ENTRIES_PER_COMMAND: usize = 8;

/// One piece of the output stream.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// `NO_RELEASE` for arena bytes, else the id of the buffer holding them.
    src: u16,
    /// Tag reported to `advance`'s callback once this entry is fully sent.
    release: u16,
    /// Offset in the source (for the arena: chunk index · chunk size + offset).
    off: u32,
    len: u32,
}

/// The output queue: an arena for headers plus references to payload buffers.
///
/// The arena is a list of fixed-size chunks that are never moved or freed
/// while the queue lives, so pointers handed out by [`TxQueue::fill_iovecs`]
/// stay valid while later entries are pushed (an io_uring send may be in
/// flight meanwhile). It restarts at its first chunk whenever the queue
/// drains, and grows by a chunk only if a burst outruns it (the owner's
/// [`TxQueue::has_room`] check normally prevents that).
pub struct TxQueue {
    /// The first chunk, where everything lives unless a burst outruns it
    /// (kept apart so the common lookup is one range check).
    first: Box<[u8]>,
    /// Further chunks, allocated on demand and kept.
    more: Vec<Box<[u8]>>,
    chunk_shift: u32,
    /// Bump position over the chunks, and the end of the current chunk.
    used: usize,
    chunk_end: usize,
    /// Soft limits checked by `has_room`.
    arena_limit: usize,
    max_entries: usize,
    entries: Vec<Entry>,
    /// First unsent entry, and bytes of it already sent.
    head: usize,
    head_sent: usize,
}

impl Default for TxQueue {
    /// The node's sizing: a 64 KiB arena and up to 4096 entries.
    fn default() -> Self {
        TxQueue::new(64 << 10, 4096)
    }
}

impl TxQueue {
    /// `arena_bytes` of header arena (rounded up to a power of two, at least
    /// [`PUSH_MAX`]) and room for `max_entries` entries before `has_room`
    /// says no. Entry storage starts smaller and grows to what is used.
    pub fn new(arena_bytes: usize, max_entries: usize) -> TxQueue {
        let chunk = arena_bytes.max(PUSH_MAX).next_power_of_two();
        TxQueue {
            first: vec![0u8; chunk].into_boxed_slice(),
            more: Vec::new(),
            chunk_shift: chunk.trailing_zeros(),
            used: 0,
            chunk_end: chunk,
            arena_limit: chunk,
            max_entries: max_entries.max(ENTRIES_PER_COMMAND),
            entries: Vec::with_capacity(max_entries.clamp(16, 256)),
            head: 0,
            head_sent: 0,
        }
    }

    #[inline]
    fn chunk_bytes(&self) -> usize {
        1 << self.chunk_shift
    }

    /// Whether the response to one more command fits within the limits.
    #[inline]
    pub fn has_room(&self) -> bool {
        self.used + ROOM_PER_COMMAND <= self.arena_limit
            && self.entries.len() + ENTRIES_PER_COMMAND <= self.max_entries
    }

    /// Nothing left to send.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.head == self.entries.len()
    }

    /// Reserves `n` (≤ chunk size) contiguous arena bytes; returns their
    /// arena offset.
    #[inline]
    fn reserve(&mut self, n: usize) -> usize {
        if self.used + n > self.chunk_end {
            self.next_chunk();
        }
        let at = self.used;
        self.used += n;
        at
    }

    /// Moves the bump position to the next chunk, allocating it the first
    /// time (a burst beyond `has_room`; rare, so kept out of line).
    #[cold]
    #[inline(never)]
    fn next_chunk(&mut self) {
        let cb = self.chunk_bytes();
        // Chunk k spans [k·cb, (k+1)·cb); the current one ends at chunk_end.
        let next = self.chunk_end >> self.chunk_shift;
        if next == 1 + self.more.len() {
            self.more.push(vec![0u8; cb].into_boxed_slice());
        }
        self.used = self.chunk_end;
        self.chunk_end += cb;
    }

    /// `n` arena bytes at `at`. `reserve` hands out only ranges inside one
    /// allocated chunk, so the lookup always succeeds; were it not to (a bug
    /// here), a debug build asserts and a release build gets no bytes.
    #[inline]
    fn arena_mut(&mut self, at: usize, n: usize) -> &mut [u8] {
        let b = if at + n <= self.first.len() {
            self.first.get_mut(at..at + n)
        } else {
            let o = at & (self.chunk_bytes() - 1);
            (at >> self.chunk_shift)
                .checked_sub(1)
                .and_then(|k| self.more.get_mut(k))
                .and_then(|c| c.get_mut(o..o + n))
        };
        debug_assert!(b.is_some(), "arena range {at}+{n} outside the chunks");
        b.unwrap_or_default()
    }

    /// `n` arena bytes at `at` (see [`TxQueue::arena_mut`]).
    #[inline]
    fn arena(&self, at: usize, n: usize) -> &[u8] {
        if let Some(b) = self.first.get(at..at + n) {
            return b;
        }
        let o = at & (self.chunk_bytes() - 1);
        let b = (at >> self.chunk_shift)
            .checked_sub(1)
            .and_then(|k| self.more.get(k))
            .and_then(|c| c.get(o..o + n));
        debug_assert!(b.is_some(), "arena range {at}+{n} outside the chunks");
        b.unwrap_or_default()
    }

    /// The bytes of one entry past its first `skip` (the part already sent).
    #[inline]
    fn unsent_of<'a>(
        &'a self,
        e: &Entry,
        skip: usize,
        resolve: &impl Fn(u16) -> &'a [u8],
    ) -> &'a [u8] {
        self.bytes(e, resolve).get(skip..).unwrap_or_default()
    }

    /// The entries not yet fully sent (head <= entries.len() always).
    #[inline]
    fn unsent_entries(&self) -> &[Entry] {
        self.entries.get(self.head..).unwrap_or_default()
    }

    /// The bytes of one entry; `resolve` maps a source id to its buffer.
    #[inline]
    fn bytes<'a>(&'a self, e: &Entry, resolve: &impl Fn(u16) -> &'a [u8]) -> &'a [u8] {
        let (off, len) = (e.off as usize, e.len as usize);
        if e.src == NO_RELEASE {
            self.arena(off, len)
        } else {
            // Entries are pushed by the owner for its own buffers: a short
            // buffer is a bug in the owner, not peer input (a debug build
            // asserts; a release build sends none of it).
            let b = resolve(e.src).get(off..off + len);
            debug_assert!(b.is_some(), "entry {off}+{len} past its buffer");
            b.unwrap_or_default()
        }
    }

    /// Appends header bytes written by `f` into a [`PUSH_MAX`]-byte window;
    /// `f` returns how many it wrote (0 appends nothing).
    #[inline]
    pub fn push_bytes(&mut self, release: u16, f: impl FnOnce(&mut [u8]) -> usize) {
        let at = self.reserve(PUSH_MAX);
        let n = f(self.arena_mut(at, PUSH_MAX));
        debug_assert!(n <= PUSH_MAX, "push_bytes closure overran its window");
        let n = n.min(PUSH_MAX);
        // Give back what the closure did not use.
        self.used = at + n;
        if n > 0 {
            self.push_entry(NO_RELEASE, off32(at), off32(n), release);
        }
    }

    /// Appends a copy of `bytes` (split over chunks if it is that large).
    #[inline]
    pub fn push_slice(&mut self, bytes: &[u8], release: u16) {
        let pieces = bytes.chunks(self.chunk_bytes());
        let last = pieces.len().saturating_sub(1);
        for (i, p) in pieces.enumerate() {
            let at = self.reserve(p.len());
            self.arena_mut(at, p.len()).copy_from_slice(p);
            let tag = if i == last { release } else { NO_RELEASE };
            self.push_entry(NO_RELEASE, off32(at), off32(p.len()), tag);
        }
    }

    /// Appends `len` bytes at `off` of buffer `src` (any id but `NO_RELEASE`),
    /// which the caller keeps unchanged until they are sent.
    #[inline]
    pub fn push_data(&mut self, src: u16, off: u32, len: u32, release: u16) {
        debug_assert!(src != NO_RELEASE && len > 0);
        if len > 0 {
            self.push_entry(src, off, len, release);
        }
    }

    #[inline]
    fn push_entry(&mut self, src: u16, off: u32, len: u32, release: u16) {
        self.entries.push(Entry {
            src,
            release,
            off,
            len,
        });
    }

    /// The unsent bytes in order, as slices; `resolve` maps a source id to
    /// its buffer. Allocates nothing.
    pub fn unsent<'a, F>(&'a self, resolve: F) -> impl Iterator<Item = &'a [u8]> + 'a
    where
        F: Fn(u16) -> &'a [u8] + 'a,
    {
        self.unsent_entries().iter().enumerate().map(move |(i, e)| {
            let skip = if i == 0 { self.head_sent } else { 0 };
            self.unsent_of(e, skip, &resolve)
        })
    }

    /// Fills `out` (cleared first) with up to `max` iovecs for the unsent
    /// bytes, for one gathered `sendmsg`. The pointers stay valid until the
    /// bytes are [`TxQueue::advance`]d past, while the referenced buffers
    /// are left alone.
    #[cfg(unix)]
    pub fn fill_iovecs<'a, F>(&'a self, out: &mut Vec<libc::iovec>, max: usize, resolve: F)
    where
        F: Fn(u16) -> &'a [u8] + 'a,
    {
        // A plain loop rather than `unsent()`: this runs once per send.
        out.clear();
        let mut skip = self.head_sent;
        for e in self.unsent_entries().iter().take(max) {
            let b = self.unsent_of(e, skip, &resolve);
            skip = 0;
            out.push(libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            });
        }
    }

    /// Marks `n` bytes as sent; calls `release` with the tag of every entry
    /// whose last byte went. `n` beyond what is queued is ignored.
    pub fn advance(&mut self, mut n: usize, mut release: impl FnMut(u16)) {
        while n > 0 {
            let Some(e) = self.entries.get(self.head) else {
                debug_assert!(false, "advance past the queued bytes");
                break;
            };
            let left = e.len as usize - self.head_sent;
            if n < left {
                self.head_sent += n;
                return;
            }
            n -= left;
            let tag = e.release;
            self.head += 1;
            self.head_sent = 0;
            if tag != NO_RELEASE {
                release(tag);
            }
        }
        if self.is_empty() {
            self.reset();
        }
    }

    fn reset(&mut self) {
        self.entries.clear();
        self.head = 0;
        self.head_sent = 0;
        self.used = 0;
        self.chunk_end = self.chunk_bytes();
    }

    /// Unsent bytes (for limits, diagnostics and tests; walks the entries).
    pub fn pending_bytes(&self) -> usize {
        self.unsent_entries()
            .iter()
            .map(|e| e.len as usize)
            .sum::<usize>()
            - self.head_sent
    }

    /// Drops everything unsent (the socket failed), calling `release` for
    /// every tag it carried.
    pub fn drain_releases(&mut self, mut release: impl FnMut(u16)) {
        for e in self.unsent_entries() {
            if e.release != NO_RELEASE {
                release(e.release);
            }
        }
        self.reset();
    }
}

/// An arena offset or length as an entry stores it. Arena offsets stay
/// below the chunks allocated (a 64 KiB arena by default, growing a chunk
/// per burst that outruns `has_room`), far below 4 GiB; were one not to fit,
/// it saturates to an offset no chunk holds (a debug build asserts).
#[inline]
fn off32(v: usize) -> u32 {
    debug_assert!(u32::try_from(v).is_ok(), "arena offset {v} past 4 GiB");
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
