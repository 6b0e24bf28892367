//! The write path and the FTL's mapping: write-buffer admission with early
//! completion, the host and GC write pointers, flash-page programs when a
//! page fills, invalidation, and opening lines.

use super::*;

impl Ssd {
    pub(crate) fn write(
        &mut self,
        first: u32,
        n_pages: u32,
        size_bytes: u32,
        now_ns: Nanos,
    ) -> u64 {
        self.stats.writes += 1;
        // At the floor the write first waits for the GC it triggers.
        let now_ns = self.gc_foreground(n_pages, now_ns);
        if self.p.write_buffer_bytes == 0 {
            let mut done = now_ns;
            for i in 0..n_pages {
                let e = self.write_page(Stream::Host, (first + i) % self.logical_pages, now_ns);
                done = done.max(e);
            }
            return done;
        }
        // A page occupies the buffer from admission until the program of its flash page
        // ends (NVMeVirt `conv_write`: `buffer_allocate` per write, and each one-shot
        // page program releases the whole page at its NAND completion).
        let pb = self.p.page_bytes as u64;
        let held_bytes = n_pages as u64 * pb;
        let t_admit = self.wbuf_admit(held_bytes, now_ns);
        let t1 = t_admit
            + self.p.fw_write_ns
            + self.p.fw_write_per_4k_ns * (size_bytes as u64).div_ceil(4096);
        let t1 = self.pcie_xfer(t1, size_bytes as u64);
        self.wbuf_used_bytes += held_bytes;
        let mut done = t1;
        for i in 0..n_pages {
            let e = self.write_page(Stream::Host, (first + i) % self.logical_pages, t1);
            done = done.max(e);
        }
        if self.p.early_completion {
            t1
        } else {
            done
        }
    }

    /// Wait until the shared write buffer can hold `bytes`; returns the admission time.
    /// With read priority, a full buffer starts the deferred program that would end
    /// first if it ends before every started one: the controller must drain its buffer.
    pub(crate) fn wbuf_admit(&mut self, bytes: u64, now_ns: Nanos) -> u64 {
        let cap = self.p.write_buffer_bytes;
        let bytes = bytes.min(cap);
        let mut t = now_ns;
        loop {
            self.wbuf_release_until(t);
            if self.wbuf_used_bytes + bytes <= cap {
                return t;
            }
            self.wbuf_skip_moved();
            let started = self.wbuf_pending.peek().map(|r| r.0 .0);
            let deferred = self.first_deferred_end();
            match (started, deferred) {
                // Nothing being or to be programmed: the held bytes are all in the open
                // flash page, which only this write can close; admit it.
                (None, None) => return t,
                (s, Some((l, end))) if s.is_none_or(|s| end < s) => self.start_deferred(l),
                (Some(s), _) => t = t.max(s),
                (None, Some(_)) => unreachable!("matched above"),
            }
            self.stats.write_buffer_stalls += 1;
        }
    }

    pub(crate) fn wbuf_release_until(&mut self, t: u64) {
        self.wbuf_released_ns = self.wbuf_released_ns.max(t);
        self.wbuf_skip_moved();
        while let Some(&std::cmp::Reverse((done, bytes))) = self.wbuf_pending.peek() {
            if done > t {
                break;
            }
            self.wbuf_used_bytes -= bytes as u64;
            self.wbuf_pending.pop();
            self.wbuf_skip_moved();
        }
    }

    /// Map `lpn` to the stream's write pointer and charge the program; returns when
    /// the page is durable.
    pub(crate) fn write_page(&mut self, stream: Stream, lpn: u32, t: u64) -> u64 {
        self.stats.pages_written += 1;
        let k = stream as usize;
        if self.p.static_map {
            // Log-structured placement without tables: writes fill flash pages in write-pointer
            // order (full-page programs, striped over channels), reads use the static home.
            let ppa = self.wp_index[k];
            self.wp_index[k] = (ppa + 1) % self.pages_per_line;
            return self.page_written(stream, ppa, t);
        }
        if self.wp_line[k] == gc::NO_LINE {
            self.open_next_line(stream);
        }
        self.invalidate(lpn);
        let ppa = self.wp_line[k] * self.pages_per_line + self.wp_index[k];
        self.map[lpn as usize] = ppa;
        self.rmap[ppa as usize] = lpn;
        self.lines[self.wp_line[k] as usize].vpc += 1;
        let done = self.page_written(stream, ppa, t);
        self.advance_wp(stream, t);
        done
    }

    /// A page was placed at `ppa` at `t`: if it closes its flash page, program that
    /// page; returns when the page is durable (`t` while its flash page is open, or
    /// while its program is deferred). A host page holds write-buffer space until the
    /// program of its flash page ends (NVMeVirt `conv_write`: `buffer_allocate` per
    /// write; each one-shot page program releases the whole page at its NAND end).
    pub(crate) fn page_written(&mut self, stream: Stream, ppa: u32, t: u64) -> u64 {
        let buffered = stream == Stream::Host && self.p.write_buffer_bytes > 0 && !self.filling;
        if buffered {
            self.wbuf_open_bytes += self.p.page_bytes as u64;
        }
        if ppa % self.subpages != self.subpages - 1 {
            return t;
        }
        if !buffered {
            return self.program(ppa, t);
        }
        let release_bytes = std::mem::take(&mut self.wbuf_open_bytes) as u32;
        if self.p.read_priority {
            let (_, lun, _) = self.locate(ppa);
            self.lun_deferred[lun as usize].push_back(Deferred {
                ready_ns: t,
                release_bytes,
            });
            self.deferred_programs += 1;
            return t;
        }
        let e = self.program(ppa, t);
        self.wbuf_pending
            .push(std::cmp::Reverse((e, release_bytes)));
        e
    }

    /// Whether a program ending at `end` already had its write-buffer bytes counted
    /// free by an admitted write: moving it later would free them twice.
    pub(crate) fn release_taken(&self, end: Nanos, release_bytes: u32) -> bool {
        release_bytes > 0 && end <= self.wbuf_released_ns
    }

    /// Drops stale releases (moved by a suspend) from the top of `wbuf_pending`.
    pub(crate) fn wbuf_skip_moved(&mut self) {
        while let Some(&std::cmp::Reverse(top)) = self.wbuf_pending.peek() {
            let Some(i) = self.wbuf_moved.iter().position(|&m| m == top) else {
                return;
            };
            self.wbuf_moved.swap_remove(i);
            self.wbuf_pending.pop();
        }
    }

    pub(crate) fn invalidate(&mut self, lpn: u32) {
        let old = self.map[lpn as usize];
        if old == UNMAPPED {
            return;
        }
        self.rmap[old as usize] = INVALID;
        let line = &mut self.lines[(old / self.pages_per_line) as usize];
        line.vpc -= 1;
        line.ipc += 1;
        self.map[lpn as usize] = UNMAPPED;
    }

    /// Move the stream's write pointer; a full line closes. The host opens its next
    /// line at once and never takes the last `gc::GC_RESERVE_LINES` free lines (they are
    /// the GC's, as NVMeVirt keeps two lines for "host write, gc"); the GC opens its next
    /// line lazily, at its next relocation.
    pub(crate) fn advance_wp(&mut self, stream: Stream, t: u64) {
        let k = stream as usize;
        self.wp_index[k] += 1;
        if self.wp_index[k] < self.pages_per_line {
            return;
        }
        self.lines[self.wp_line[k] as usize].state = LineState::Full;
        self.wp_line[k] = gc::NO_LINE;
        self.wp_index[k] = 0;
        if stream == Stream::Host {
            if self.free_lines() <= gc::GC_RESERVE_LINES {
                self.gc_emergency(t);
            }
            self.open_next_line(stream);
        }
    }

    /// Geometry guarantees a free line here: spare space is at least `gc_lo` + 2 lines,
    /// the host leaves the reserve to GC, and GC needs at most one new line per victim
    /// (a victim with an invalid page holds less than a line of valid data).
    pub(crate) fn open_next_line(&mut self, stream: Stream) {
        let next = self
            .free_lines
            .pop_front()
            .expect("SSD out of free lines: GC reserve exhausted");
        self.lines[next as usize].state = LineState::Open;
        self.wp_line[stream as usize] = next;
        self.wp_index[stream as usize] = 0;
    }
}
