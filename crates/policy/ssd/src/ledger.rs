//! Time-slotted bandwidth ledger for shared links (NAND channel, PCIe), after NVMeVirt's
//! credit slots. A plain "busy until" would let a transfer reserved in the future (a program
//! waiting for its LUN, a read finishing late) block an earlier one; the ledger lets earlier
//! transfers use the idle capacity before it.

use trellis_units::Nanos;

#[derive(Clone, Debug)]
pub struct Ledger {
    /// Bytes one slot can carry.
    cap: u32,
    base: u64,
    mb_s: u32,
    /// Remaining bytes per slot in the window `base..base + SLOTS`: a ring of `RING`
    /// blocks of `BLOCK` slots (one cache line), block `b` at ring block `b % RING`.
    free: Vec<u32>,
    /// Per ring block: the absolute block number its contents belong to. A block last
    /// written in an earlier turn of the ring reads as full capacity, so elapsed slots
    /// never need resetting. One block more than the window spans, so two blocks that
    /// share a ring block are never both in the window.
    stamp: Vec<u64>,
    /// Every slot in `base..full_until` has no capacity left, so the search for the
    /// first slot with spare capacity may start here: under a backlog of milliseconds
    /// the search would step through hundreds of full slots on every reservation.
    /// Exact: a slot in the window only loses capacity (its ring block cannot be reused
    /// while it is in the window), so a full one stays full.
    full_until: u64,
}

pub const SLOT_NS: u64 = 2_000;
pub const SLOTS: usize = 4096;
const BLOCK: usize = 16;
const RING: usize = SLOTS / BLOCK + 1;

impl Ledger {
    pub fn new(mb_s: u32) -> Self {
        let cap = (mb_s as u64 * 1_048_576 * SLOT_NS / 1_000_000_000) as u32;
        assert!(cap > 0, "bandwidth too low for the slot size");
        Ledger {
            cap,
            base: 0,
            mb_s,
            free: vec![cap; RING * BLOCK],
            stamp: vec![0; RING],
            full_until: 0,
        }
    }

    /// Forget slots before `now` (time only moves forward in callers).
    fn advance(&mut self, now_ns: Nanos) {
        self.base = self.base.max(now_ns / SLOT_NS);
        self.full_until = self.full_until.max(self.base);
    }

    /// Remaining bytes of `slot` (which must lie in the window).
    #[inline]
    fn get(&self, slot: u64) -> u32 {
        let b = slot / BLOCK as u64;
        if self.stamp[b as usize % RING] == b {
            self.free[Self::idx(slot)]
        } else {
            self.cap
        }
    }

    #[inline]
    fn set(&mut self, slot: u64, v: u32) {
        let b = slot / BLOCK as u64;
        let k = b as usize % RING;
        if self.stamp[k] != b {
            self.free[k * BLOCK..(k + 1) * BLOCK].fill(self.cap);
            self.stamp[k] = b;
        }
        self.free[Self::idx(slot)] = v;
    }

    /// Reserve a transfer of `bytes` starting no earlier than `t`; returns its end time.
    /// Uncontended, this is exactly `t + xfer_ns(bytes)` (NVMeVirt's per-128 B rule).
    pub fn reserve(&mut self, now_ns: Nanos, t: u64, bytes: u64) -> u64 {
        self.reserve_from(now_ns, t, bytes, true)
    }

    /// `reserve`; `skip_full`: start the search at `full_until` where that is later
    /// (false only in the test that checks both searches agree).
    #[inline(always)]
    fn reserve_from(&mut self, now_ns: Nanos, t: u64, bytes: u64, skip_full: bool) -> u64 {
        self.advance(now_ns);
        let dur = crate::xfer_ns(bytes, self.mb_s);
        let mut slot = (t / SLOT_NS).max(self.base);
        // Start in the first slot with spare capacity.
        let from_known = skip_full && slot <= self.full_until;
        if from_known {
            slot = self.full_until;
        }
        while slot - self.base < SLOTS as u64 && self.get(slot) == 0 {
            slot += 1;
        }
        if from_known {
            self.full_until = slot;
        }
        // Within a slot, transfers are served in reservation order.
        let used = if slot - self.base < SLOTS as u64 {
            (self.cap - self.get(slot)) as u64
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
            let f = self.get(slot);
            let take = (f as u64).min(left);
            if take > 0 {
                self.set(slot, f - take as u32);
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
        let filled = (self.cap - self.get(slot)) as u64;
        exact.max(slot * SLOT_NS + SLOT_NS * filled / self.cap as u64)
    }

    #[inline]
    fn idx(slot: u64) -> usize {
        (slot as usize / BLOCK) % RING * BLOCK + slot as usize % BLOCK
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

    /// Starting the search for spare capacity after the slots known to be full gives
    /// exactly the answers of the plain search, over random reservations that build
    /// and drain backlogs, reach past the horizon, and move time on by up to a ring turn.
    #[test]
    fn skipping_known_full_slots_changes_no_answer() {
        let (mut x, mut skipped) = (0x2545_f491_4f6c_dd1du64, 0u64);
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for mb_s in [800u32, 3_200, 8_000] {
            let (mut fast, mut plain) = (Ledger::new(mb_s), Ledger::new(mb_s));
            let mut now = 0u64;
            for _ in 0..20_000 {
                let r = next();
                now += match r % 16 {
                    0 => r >> 40 & 0xff_ffff, // up to ~17 ms: past the window at times
                    1..=5 => r >> 44 & 0xffff,
                    _ => 0,
                };
                let t = now + (r >> 20) % 3_000_000 * (r % 3 == 0) as u64;
                let bytes = 512 << ((r >> 8) % 10);
                let before = fast.full_until;
                assert_eq!(
                    fast.reserve_from(now, t, bytes, true),
                    plain.reserve_from(now, t, bytes, false),
                    "{mb_s} MiB/s: reserve({now}, {t}, {bytes})"
                );
                skipped += fast.full_until.saturating_sub(before.max(t / SLOT_NS));
            }
        }
        assert!(
            skipped > 10_000,
            "the known-full start was used for only {skipped} slots"
        );
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

    /// A window not aligned to blocks: the slots at its start keep their reservations
    /// while slots one turn later (same ring neighbourhood) are reserved.
    #[test]
    fn unaligned_window_keeps_its_first_slots() {
        let mut l = Ledger::new(800);
        let cap = l.cap as u64;
        // Fill slots 8..=15 completely, then move the window start to slot 8.
        let now = 8 * SLOT_NS;
        l.reserve(now, now, 8 * cap);
        // Reserve at the far end of the window (slots 4096.. are one turn after 0..).
        let far = (SLOTS as u64 + 2) * SLOT_NS;
        l.reserve(now, far, cap);
        // Slots 8..=15 are still full: a transfer at slot 8 starts at slot 16.
        let e = l.reserve(now, now, 128);
        assert!(e >= 16 * SLOT_NS, "{e}");
    }
}
