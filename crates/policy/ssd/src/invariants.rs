//! FTL and write-buffer invariants, checked by tests (O(capacity)).

use super::*;

impl Ssd {
    /// Check FTL invariants (used by tests; O(capacity)).
    pub fn check_invariants(&self) {
        self.check_write_buffer();
        if self.p.static_map {
            return;
        }
        let mut valid = 0u64;
        for (lpn, &ppa) in self.map.iter().enumerate() {
            if ppa != UNMAPPED {
                assert_eq!(self.rmap[ppa as usize], lpn as u32, "map/rmap disagree");
                valid += 1;
            }
        }
        let vpc: u64 = self.lines.iter().map(|l| l.vpc as u64).sum();
        assert_eq!(valid, vpc, "valid page count mismatch");
        for (i, l) in self.lines.iter().enumerate() {
            assert!(l.vpc + l.ipc <= self.pages_per_line, "line {i} over-full");
            let free = self.free_lines.contains(&(i as u32));
            assert_eq!(free, l.state == LineState::Free, "line {i} free list");
            assert!(
                l.state != LineState::Free || l.vpc + l.ipc == 0,
                "free line {i} used"
            );
        }
        for (k, &w) in self.wp_line.iter().enumerate() {
            assert!(
                w == gc::NO_LINE || self.lines[w as usize].state == LineState::Open,
                "wp {k}"
            );
        }
        let victims = self
            .lines
            .iter()
            .filter(|l| l.state == LineState::Victim)
            .count();
        assert!(victims <= 1, "{victims} victims");
    }

    /// Write-buffer accounting: every byte held is in the open flash page, in a
    /// started program not yet released, or in a deferred program; nothing is
    /// deferred without read priority; the count of deferred programs matches.
    pub(crate) fn check_write_buffer(&self) {
        let started: u64 = self.wbuf_pending.iter().map(|r| r.0 .1 as u64).sum::<u64>()
            - self.wbuf_moved.iter().map(|&(_, b)| b as u64).sum::<u64>();
        let deferred: u64 = self
            .lun_deferred
            .iter()
            .flatten()
            .map(|d| d.release_bytes as u64)
            .sum();
        assert_eq!(
            self.wbuf_used_bytes,
            self.wbuf_open_bytes + started + deferred,
            "write buffer bytes: held vs open + programming + deferred"
        );
        let n: usize = self.lun_deferred.iter().map(|q| q.len()).sum();
        assert_eq!(n, self.deferred_programs as usize, "deferred program count");
        assert!(
            self.p.read_priority || n == 0,
            "deferred without read priority"
        );
        assert!(
            self.wbuf_open_bytes < self.p.flash_page_bytes as u64,
            "open flash page holds a whole page"
        );
    }
}
