//! The read path: firmware overhead, mapped (or striped-home) pages grouped
//! per flash page, tR on the LUN, channel and PCIe transfer, and a read
//! running inside a suspended program or erase.

use super::*;

impl Ssd {
    pub(crate) fn read(&mut self, first: u32, n_pages: u32, size_bytes: u32, now_ns: Nanos) -> u64 {
        self.stats.reads += 1;
        let fw = if size_bytes <= 4096 * self.p.fw_read_small_partitions {
            self.p.fw_read_small_ns
        } else {
            self.p.fw_read_large_ns
        };
        let t0 = now_ns + fw;
        let mut done = t0;
        let mut last_flash_page = u64::MAX;
        for i in 0..n_pages {
            let lpn = (first + i) % self.logical_pages;
            let ppa = self.ppa_for_read(lpn);
            // NVMeVirt groups the 4 KiB pages of one flash page into one NAND operation.
            let flash_page = ppa as u64 / self.subpages as u64;
            if flash_page == last_flash_page {
                continue;
            }
            last_flash_page = flash_page;
            let group = self.group_len(first, i, n_pages, ppa);
            done = done.max(self.read_flash(ppa, group, t0));
        }
        done
    }

    /// How many of the requested pages (from index i) live in the same flash page as `ppa`.
    pub(crate) fn group_len(&self, first: u32, i: u32, n_pages: u32, ppa: u32) -> u32 {
        if self.subpages == 1 {
            return 1;
        }
        let fp = ppa / self.subpages;
        let mut n = 1;
        while i + n < n_pages {
            let next = self.ppa_for_read((first + i + n) % self.logical_pages);
            if next / self.subpages != fp {
                break;
            }
            n += 1;
        }
        n
    }

    /// Unmapped pages are read from their striped home location: real drives
    /// answer them fast, but charging a read keeps an un-preconditioned device honest.
    pub(crate) fn ppa_for_read(&self, lpn: u32) -> u32 {
        if self.p.static_map {
            return lpn % self.pages_per_line;
        }
        let ppa = self.map[lpn as usize];
        if ppa != UNMAPPED {
            return ppa;
        }
        lpn % self.pages_per_line
    }

    pub(crate) fn read_flash(&mut self, ppa: u32, pages: u32, t0: u64) -> u64 {
        self.stats.pages_read += pages as u64;
        let (ch, lun, fpage) = self.locate(ppa);
        let t_r = self.t_read_ns(pages, fpage) * (1 + self.read_retries(lun, ppa) as u64);
        let l = lun as usize;
        // Programs whose LUN frees before the read arrives there have started.
        self.start_deferred_on(l, t0);
        let e = match self.suspend_for_read(l, t0, t_r) {
            Some(e) => e,
            None => {
                let e = t0.max(self.lun_avail_ns[l]) + t_r;
                self.lun_avail_ns[l] = e;
                self.suspendable[l] = None;
                e
            }
        };
        let bytes = pages as u64 * self.p.page_bytes as u64;
        let e = self.channel_xfer(ch, e, bytes);
        self.pcie_xfer(e, bytes)
    }

    /// Read-retry steps of a host read of `ppa` on `lun` (each one more tR on the LUN);
    /// an uncorrectable read took `read_retry_max` of them and flags the I/O.
    fn read_retries(&mut self, lun: u32, ppa: u32) -> u32 {
        let line = ppa / self.pages_per_line;
        let block = (lun * self.lines.len() as u32 + line) as usize;
        match self.wear.on_read(&self.p.wear, block, ppa) {
            Some(n) => n,
            None => {
                self.io_media_error = true;
                self.p.wear.read_retry_max
            }
        }
    }

    /// tR for `pages` 4 KiB pages of flash page `fpage` (LSB/MSB alternate by index).
    pub(crate) fn t_read_ns(&self, pages: u32, fpage: u32) -> u64 {
        let full = pages == self.subpages && self.subpages > 1;
        let lsb = fpage.is_multiple_of(2);
        match (full, lsb) {
            (false, true) => self.p.read_lsb_ns,
            (false, false) => self.p.read_msb_ns,
            (true, true) => self.p.read_full_lsb_ns,
            (true, false) => self.p.read_full_msb_ns,
        }
    }

    /// A host read of `t_r` reaching LUN `l` at `t`: if the program or erase running
    /// there can be suspended for it, the read runs in the suspension and the
    /// operation's end (and its write-buffer release) moves back; returns the read's
    /// end. Otherwise None, and the read queues as usual.
    pub(crate) fn suspend_for_read(&mut self, l: usize, t: Nanos, t_r: Nanos) -> Option<Nanos> {
        let mut s = self.suspendable[l]?;
        if t < s.start_ns
            || t >= s.end_ns
            || self.lun_avail_ns[l] != s.end_ns
            || self.release_taken(s.end_ns, s.release_bytes)
        {
            return None;
        }
        let (start, shift) = if s.reads_end_ns > t {
            // The suspension's reads are still running: this one follows them.
            (s.reads_end_ns, t_r)
        } else if s.reads_end_ns != 0 || s.end_ns - t <= s.suspend_ns {
            // Once per operation; and not when finishing is quicker than suspending.
            return None;
        } else {
            (t + s.suspend_ns, s.suspend_ns + t_r)
        };
        let old_end = s.end_ns;
        s.end_ns += shift;
        s.reads_end_ns = start + t_r;
        self.lun_avail_ns[l] = s.end_ns;
        if s.release_bytes > 0 {
            self.wbuf_moved.push((old_end, s.release_bytes));
            self.wbuf_pending
                .push(std::cmp::Reverse((s.end_ns, s.release_bytes)));
        }
        self.suspendable[l] = Some(s);
        self.stats.suspends += (start == t + s.suspend_ns) as u64;
        Some(start + t_r)
    }
}
