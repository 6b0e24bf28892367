//! Time-slotted bandwidth ledger for shared links (NAND channel, PCIe), after NVMeVirt's
//! credit slots. A plain "busy until" would let a transfer reserved in the future (a program
//! waiting for its LUN, a read finishing late) block an earlier one; the ledger lets earlier
//! transfers use the idle capacity before it.

#[derive(Clone, Debug)]
pub struct Ledger {
    /// Bytes one slot can carry.
    cap: u32,
    base: u64,
    /// Absolute slots `dirty_lo..dirty_hi` may hold less than `cap`; all others hold full
    /// capacity, so `advance` resets only that span instead of every elapsed slot.
    dirty_lo: u64,
    dirty_hi: u64,
    mb_s: u32,
    /// Remaining bytes per slot, a ring indexed by absolute slot number modulo `SLOTS`;
    /// valid for slots `base..base + SLOTS`.
    free: Vec<u32>,
}

pub const SLOT_NS: u64 = 2_000;
pub const SLOTS: usize = 4096;

impl Ledger {
    pub fn new(mb_s: u32) -> Self {
        let cap = (mb_s as u64 * 1_048_576 * SLOT_NS / 1_000_000_000) as u32;
        assert!(cap > 0, "bandwidth too low for the slot size");
        Ledger {
            cap,
            base: 0,
            dirty_lo: 0,
            dirty_hi: 0,
            mb_s,
            free: vec![cap; SLOTS],
        }
    }

    /// Forget slots before `now` (time only moves forward in callers).
    fn advance(&mut self, now_ns: u64) {
        let target = now_ns / SLOT_NS;
        if target <= self.base {
            return;
        }
        // Touched elapsed slots go back to full capacity.
        let lo = self.dirty_lo.max(self.base);
        let hi = self.dirty_hi.min(target);
        if lo < hi {
            let (a, b) = (Self::idx(lo), Self::idx(hi - 1));
            if a <= b && hi - lo < SLOTS as u64 {
                self.free[a..=b].fill(self.cap);
            } else {
                self.free[a..].fill(self.cap);
                self.free[..=b].fill(self.cap);
            }
        }
        self.dirty_lo = self.dirty_lo.max(target);
        self.dirty_hi = self.dirty_hi.max(self.dirty_lo);
        self.base = target;
    }

    /// Reserve a transfer of `bytes` starting no earlier than `t`; returns its end time.
    /// Uncontended, this is exactly `t + xfer_ns(bytes)` (NVMeVirt's per-128 B rule).
    pub fn reserve(&mut self, now_ns: u64, t: u64, bytes: u64) -> u64 {
        self.advance(now_ns);
        let dur = crate::xfer_ns(bytes, self.mb_s);
        let mut slot = (t / SLOT_NS).max(self.base);
        // Start in the first slot with spare capacity.
        while slot - self.base < SLOTS as u64 && self.free[Self::idx(slot)] == 0 {
            slot += 1;
        }
        // Within a slot, transfers are served in reservation order.
        let used = (self.cap - self.free[Self::idx(slot)]) as u64;
        let used = if slot - self.base < SLOTS as u64 {
            used
        } else {
            0
        };
        let start = t.max(slot * SLOT_NS + used * SLOT_NS / self.cap as u64);
        let mut left = bytes;
        while left > 0 {
            if slot - self.base >= SLOTS as u64 {
                // Beyond the horizon: assume the link is free there.
                return start.max(slot * SLOT_NS) + crate::xfer_ns(left, self.mb_s);
            }
            let i = Self::idx(slot);
            let take = (self.free[i] as u64).min(left);
            if take > 0 {
                self.free[i] -= take as u32;
                if self.dirty_lo >= self.dirty_hi {
                    (self.dirty_lo, self.dirty_hi) = (slot, slot + 1);
                } else {
                    self.dirty_lo = self.dirty_lo.min(slot);
                    self.dirty_hi = self.dirty_hi.max(slot + 1);
                }
            }
            left -= take;
            if left > 0 {
                slot += 1;
            }
        }
        // Never faster than the link; later if the capacity was only found in later slots.
        let exact = start + dur;
        if (slot + 1) * SLOT_NS >= exact {
            return exact;
        }
        let filled = (self.cap - self.free[Self::idx(slot)]) as u64;
        exact.max(slot * SLOT_NS + SLOT_NS * filled / self.cap as u64)
    }

    #[inline]
    fn idx(slot: u64) -> usize {
        slot as usize % SLOTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncontended_transfer_takes_exact_time() {
        let mut l = Ledger::new(800);
        assert_eq!(l.reserve(0, 0, 4096), 32 * 152);
    }

    #[test]
    fn future_reservation_does_not_block_earlier_transfer() {
        let mut l = Ledger::new(800);
        // A program's transfer reserved 1 ms ahead...
        let late = l.reserve(0, 1_000_000, 32768);
        assert!(late >= 1_000_000 + 256 * 152);
        // ...leaves the link free now.
        assert_eq!(l.reserve(0, 10_000, 4096), 10_000 + 32 * 152);
    }

    #[test]
    fn contended_transfers_queue_by_capacity() {
        let mut l = Ledger::new(800);
        // 800 MiB/s × 2 µs = 1,677 B per slot: two 64 KiB transfers at t = 0 need ~78 slots.
        let a = l.reserve(0, 0, 65536);
        let b = l.reserve(0, 0, 65536);
        assert!(b > a, "{a} {b}");
        let both = 2 * 65536 / 1677 * 2_000;
        assert!((b as i64 - both as i64).abs() < 4_000, "{b} vs {both}");
    }

    /// Slots used one ring turn earlier are free again (the lazy reset of touched slots).
    #[test]
    fn elapsed_slots_are_free_again_after_a_turn() {
        let mut l = Ledger::new(800);
        let a = l.reserve(0, 0, 1 << 20);
        let b = l.reserve(0, 0, 1 << 20);
        assert!(b > a);
        for k in 1..4u64 {
            let t = k * SLOTS as u64 * SLOT_NS + 10_000;
            assert_eq!(l.reserve(t, t, 4096), t + 32 * 152);
            let t2 = t + 3_000 * SLOT_NS;
            assert_eq!(l.reserve(t2, t2, 4096), t2 + 32 * 152);
        }
    }
}
