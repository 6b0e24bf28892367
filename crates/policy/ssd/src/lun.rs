//! LUN timelines: programs deferred behind host reads (read priority) and
//! started when the LUN frees, the program of a filled flash page, and the
//! program or erase a host read may still suspend.

use super::*;

impl Ssd {
    /// Start every deferred program whose LUN frees (or whose data arrives) before
    /// `before`: a read arriving then finds it running.
    pub(crate) fn start_deferred_before(&mut self, before: Nanos) {
        if self.deferred_programs == 0 {
            return;
        }
        for l in 0..self.luns as usize {
            self.start_deferred_on(l, before);
        }
    }

    pub(crate) fn start_deferred_on(&mut self, l: usize, before: Nanos) {
        while let Some(d) = self.lun_deferred[l].front() {
            if d.ready_ns.max(self.lun_avail_ns[l]) >= before {
                return;
            }
            self.start_deferred(l);
        }
    }

    /// Start LUN `l`'s first deferred program when the LUN frees.
    pub(crate) fn start_deferred(&mut self, l: usize) {
        let Some(d) = self.lun_deferred[l].pop_front() else {
            return;
        };
        self.deferred_programs -= 1;
        let ch = l as u32 / self.p.luns_per_channel;
        let start = d.ready_ns.max(self.lun_avail_ns[l]);
        let xfer_end = self.channel_xfer(ch, start, self.p.flash_page_bytes as u64);
        let e = xfer_end + self.p.program_ns;
        self.lun_avail_ns[l] = e;
        self.wbuf_pending
            .push(std::cmp::Reverse((e, d.release_bytes)));
        self.mark_suspendable(l, start, e, self.p.program_suspend_ns, d.release_bytes);
    }

    /// The deferred program that would end first if started now: (LUN, end).
    pub(crate) fn first_deferred_end(&self) -> Option<(usize, Nanos)> {
        if self.deferred_programs == 0 {
            return None;
        }
        let flash_xfer_ns = match self.p.channel_mb_s {
            0 => 0,
            mb_s => xfer_ns(self.p.flash_page_bytes as u64, mb_s),
        };
        (0..self.luns as usize)
            .filter_map(|l| {
                let d = self.lun_deferred[l].front()?;
                let start = d.ready_ns.max(self.lun_avail_ns[l]);
                Some((l, start + flash_xfer_ns + self.p.program_ns))
            })
            .min_by_key(|&(_, end)| end)
    }

    /// Whether LUN `l` has work at `now` (started, or deferred programs waiting).
    pub(crate) fn lun_busy_at(&self, l: usize, now: Nanos) -> bool {
        self.lun_avail_ns[l] > now || !self.lun_deferred[l].is_empty()
    }

    /// Start every deferred program now, in order (before foreground GC queues work).
    pub(crate) fn start_all_deferred(&mut self) {
        self.start_deferred_before(u64::MAX);
    }

    /// Program the flash page holding `ppa` (FEMU: per page; NVMeVirt: per one-shot page).
    pub(crate) fn program(&mut self, ppa: u32, t: u64) -> u64 {
        let (ch, lun, _) = self.locate(ppa);
        let bytes = self.p.flash_page_bytes as u64;
        let l = lun as usize;
        let start = t.max(self.lun_avail_ns[l]);
        let xfer_end = self.channel_xfer(ch, start, bytes);
        let e = xfer_end + self.p.program_ns;
        self.lun_avail_ns[l] = e;
        self.mark_suspendable(l, start, e, self.p.program_suspend_ns, 0);
        e
    }

    /// LUN `l`'s timeline now ends with a program or erase over [start, end).
    pub(crate) fn mark_suspendable(
        &mut self,
        l: usize,
        start: Nanos,
        end: Nanos,
        cost: Nanos,
        release_bytes: u32,
    ) {
        self.suspendable[l] = (cost > 0).then_some(Suspendable {
            start_ns: start,
            end_ns: end,
            suspend_ns: cost,
            reads_end_ns: 0,
            release_bytes,
        });
    }
}
