//! A switch's shared packet buffer with dynamic thresholds (Choudhury & Hahne, "Dynamic
//! queue length thresholds for shared-memory packet switches", IEEE/ACM ToN 1998).
//!
//! All egress queues of a switch draw on one pool of `total_bytes`. A queue may grow only
//! while its length stays within `alpha × (total − used)`: the threshold falls as the pool
//! fills, so one congested port cannot take the whole buffer and a few congested ports
//! share it (n queues congested at once settle at `alpha·B / (1 + n·alpha)` each).
//! `alpha = 2^alpha_log2`, the way Broadcom-based SONiC switches configure it
//! (`dynamic_th`; docs/sim.md). Sans-IO and integer-only, so runs replay bit-identically.

/// One switch's buffer pool.
#[derive(Clone, Debug)]
pub struct SharedBuffer {
    total_bytes: u64,
    alpha_log2: i8,
    used_bytes: u64,
}

impl SharedBuffer {
    /// `alpha_log2` may be negative (alpha = 1/2, 1/4 …).
    pub fn new(total_bytes: u64, alpha_log2: i8) -> Self {
        SharedBuffer {
            total_bytes,
            alpha_log2,
            used_bytes: 0,
        }
    }

    /// The current dynamic threshold for any one queue: alpha × free bytes.
    pub fn threshold_bytes(&self) -> u64 {
        let free = self.total_bytes - self.used_bytes;
        if self.alpha_log2 >= 0 {
            free.saturating_mul(1 << self.alpha_log2)
        } else {
            free >> (-self.alpha_log2)
        }
    }

    /// May a packet of `bytes` join a queue that holds `queue_bytes` now? Admitted
    /// packets must be `add`ed; a refused one is dropped by the caller.
    pub fn admits(&self, queue_bytes: u64, bytes: u64) -> bool {
        self.used_bytes + bytes <= self.total_bytes && queue_bytes + bytes <= self.threshold_bytes()
    }

    pub fn add(&mut self, bytes: u64) {
        self.used_bytes += bytes;
        debug_assert!(self.used_bytes <= self.total_bytes);
    }

    /// Bytes leave the pool (sent, or flushed by a link failure).
    pub fn remove(&mut self, bytes: u64) {
        self.used_bytes -= bytes;
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fill queues packet by packet until the pool refuses; returns each queue's length.
    fn fill(pool: &mut SharedBuffer, n_queues: usize, pkt: u64) -> Vec<u64> {
        let mut q = vec![0u64; n_queues];
        loop {
            let mut any = false;
            for len in q.iter_mut() {
                if pool.admits(*len, pkt) {
                    pool.add(pkt);
                    *len += pkt;
                    any = true;
                }
            }
            if !any {
                return q;
            }
        }
    }

    #[test]
    fn one_congested_queue_takes_alpha_over_one_plus_alpha_of_the_pool() {
        // alpha = 8: Q = 8 (B - Q) -> Q = 8/9 B. B = 16 MiB, 1 KiB packets.
        let b = 16 << 20;
        let mut pool = SharedBuffer::new(b, 3);
        let q = fill(&mut pool, 1, 1024);
        // Admission tests the threshold before the packet joins, so the fixed point is
        // met within one packet.
        let want = b * 8 / 9;
        assert!(q[0].abs_diff(want) < 1024, "{} vs {want}", q[0]);
    }

    #[test]
    fn several_congested_queues_share_alpha_b_over_one_plus_n_alpha() {
        // alpha = 1, 3 queues: each settles at B / 4 and a quarter stays free.
        let b = 1 << 20;
        let mut pool = SharedBuffer::new(b, 0);
        let q = fill(&mut pool, 3, 512);
        for len in &q {
            assert!(len.abs_diff(b / 4) <= 512, "{q:?}");
        }
        assert!(pool.used_bytes() <= 3 * b / 4 + 3 * 512);
        // alpha = 1/2 is stricter: one queue settles at B / 3.
        let mut half = SharedBuffer::new(b, -1);
        let q = fill(&mut half, 1, 512);
        assert!(q[0].abs_diff(b / 3) <= 512, "{q:?}");
    }

    #[test]
    fn draining_raises_the_threshold_again() {
        let mut pool = SharedBuffer::new(1000, 0);
        assert!(pool.admits(0, 500));
        pool.add(500);
        assert_eq!(pool.threshold_bytes(), 500);
        assert!(!pool.admits(500, 1), "the queue is at its threshold");
        pool.remove(200);
        assert!(pool.admits(300, 100));
    }
}
