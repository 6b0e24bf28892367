//! The send window of one direction of one NVMe/TCP connection: a congestion window
//! clocked by the receiver's ACKs, capped by the receive window (docs/sim.md,
//! "NVMe/TCP transport"; [RFC 5681], [RFC 6928], [Linux tcp]).
//!
//! Granularity is the NVMe/TCP PDU (a "message": a command capsule, H2CData, R2T or a
//! completion with its C2HData), not the segment: a message is sent once it fits in
//! the window whole, or alone when nothing is in flight (TCP would send its first
//! segments and the rest as ACKs return; the PDU's last byte arrives no earlier).
//!
//! - Initial window 10 segments (RFC 6928; Linux `TCP_INIT_CWND`), ssthresh unbounded
//!   (RFC 5681 §3.1: "arbitrarily high").
//! - Slow start (cwnd < ssthresh): cwnd grows by the bytes each ACK covers (RFC 3465's
//!   byte counting; Linux `tcp_slow_start` adds the packets acked), up to ssthresh; the
//!   rest of that ACK counts as congestion avoidance (as `tcp_slow_start` returns it).
//! - Congestion avoidance: cwnd grows by SMSS × acked / cwnd (RFC 5681 eq. 3, in bytes),
//!   about one segment per window of ACKs (Reno; Linux's default CUBIC grows faster
//!   far from its last loss, which a µs-RTT fabric reaches within a few RTTs anyway).
//! - Retransmission timeout: ssthresh = max(FlightSize / 2, 2 SMSS), cwnd = 1 SMSS, the
//!   loss window (RFC 5681 eq. 4 and §3.1), and the lost bytes leave the flight. The PDUs
//!   of one flight that time out together are one expiry of TCP's one timer: a PDU sent
//!   before the last timeout's cut only leaves the flight. A fast-recovery cut does not
//!   shield the window from a later timeout.
//! - A loss detected from later deliveries (RACK, RFC 8985; the caller decides when):
//!   ssthresh = max(FlightSize / 2, 2 SMSS) and cwnd = ssthresh, once per recovery episode
//!   (RFC 6675's recovery point: losses of PDUs sent before the first reduction's point do
//!   not reduce again), and the lost bytes leave the flight.
//! - The window never exceeds the receiver's advertised window (`rwnd_bytes`).
//!
//! ACKs are data, not packets: the caller reports when a message's last byte reached the
//! receiver and when its ACK will be back at the sender ([`on_delivered`]); [`poll`]
//! applies those that are due, and [`next_ack_ns`] is the timer a blocked sender
//! waits on. Sans-IO, integer-only, time in ns.
//!
//! [`on_delivered`]: SendWindow::on_delivered
//! [`poll`]: SendWindow::poll
//! [`next_ack_ns`]: SendWindow::next_ack_ns

use std::collections::VecDeque;

/// Linux `TCP_INIT_CWND` (RFC 6928).
pub const INIT_CWND_SEGMENTS: u32 = 10;

#[derive(Clone, Debug)]
pub struct SendWindow {
    mss_bytes: u64,
    rwnd_bytes: u64,
    cwnd_bytes: u64,
    ssthresh_bytes: u64,
    inflight_bytes: u64,
    /// Sequence number of the next PDU sent (counts PDUs, not bytes).
    next_seq: u64,
    /// PDUs sent before this one belong to the current fast-recovery episode.
    recovery_point: u64,
    /// PDUs sent before this one timed out with the last timeout's cut.
    timeout_point: u64,
    /// ACKs on their way back: (arrival at the sender, bytes acked), in arrival order.
    acks: VecDeque<(u64, u32)>,
}

impl SendWindow {
    pub fn new(mss_bytes: u32, init_cwnd_segments: u32, rwnd_bytes: u64) -> Self {
        assert!(mss_bytes > 0 && init_cwnd_segments > 0);
        assert!(
            rwnd_bytes >= mss_bytes as u64,
            "the receive window holds a segment"
        );
        let mss = mss_bytes as u64;
        SendWindow {
            mss_bytes: mss,
            rwnd_bytes,
            cwnd_bytes: (init_cwnd_segments as u64 * mss).min(rwnd_bytes),
            ssthresh_bytes: u64::MAX,
            inflight_bytes: 0,
            next_seq: 0,
            recovery_point: 0,
            timeout_point: 0,
            acks: VecDeque::new(),
        }
    }

    /// May a message of `bytes` leave now? Whole within the window, or alone.
    pub fn fits(&self, bytes: u32) -> bool {
        self.inflight_bytes == 0 || self.inflight_bytes + bytes as u64 <= self.window_bytes()
    }

    /// A message of `bytes` left; returns its sequence number.
    pub fn on_send(&mut self, bytes: u32) -> u64 {
        self.inflight_bytes += bytes as u64;
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// The message's last byte reached the receiver; its ACK is back at `ack_at_ns`.
    /// ACKs are cumulative: they take effect in the order the messages were delivered,
    /// so one due earlier than the one before it waits for that one (`poll` is FIFO).
    pub fn on_delivered(&mut self, ack_at_ns: u64, bytes: u32) {
        self.acks.push_back((ack_at_ns, bytes));
    }

    /// Apply the ACKs that are back by `now_ns`.
    pub fn poll(&mut self, now_ns: u64) {
        while let Some(&(t, bytes)) = self.acks.front() {
            if t > now_ns {
                break;
            }
            self.acks.pop_front();
            self.on_ack(bytes as u64);
        }
    }

    /// When the next ACK in flight comes back (the timer of a blocked sender).
    pub fn next_ack_ns(&self) -> Option<u64> {
        self.acks.front().map(|&(t, _)| t)
    }

    fn on_ack(&mut self, acked_bytes: u64) {
        debug_assert!(
            acked_bytes <= self.inflight_bytes,
            "an ACK for bytes never sent"
        );
        self.inflight_bytes = self.inflight_bytes.saturating_sub(acked_bytes);
        let mut rest_bytes = acked_bytes;
        if self.cwnd_bytes < self.ssthresh_bytes {
            let step = rest_bytes.min(self.ssthresh_bytes - self.cwnd_bytes);
            self.cwnd_bytes += step;
            rest_bytes -= step;
        }
        if rest_bytes > 0 {
            self.cwnd_bytes += (self.mss_bytes * rest_bytes / self.cwnd_bytes).max(1);
        }
        // The sender can use no more than the receiver advertises; a cwnd grown past it
        // would make congestion avoidance after a loss slower than Reno's.
        self.cwnd_bytes = self.cwnd_bytes.min(self.rwnd_bytes);
    }

    /// The retransmission timer of PDU `seq` expired; its `lost_bytes` will never be acked.
    pub fn on_timeout(&mut self, seq: u64, lost_bytes: u32) {
        if seq >= self.timeout_point {
            self.ssthresh_bytes = (self.inflight_bytes / 2).max(2 * self.mss_bytes);
            self.cwnd_bytes = self.mss_bytes;
            self.timeout_point = self.next_seq;
            // Losses found later among what was sent before are this same event.
            self.recovery_point = self.next_seq;
        }
        self.inflight_bytes = self.inflight_bytes.saturating_sub(lost_bytes as u64);
    }

    /// PDU `seq` of `lost_bytes` was found lost from later deliveries (fast recovery).
    pub fn on_loss_detected(&mut self, seq: u64, lost_bytes: u32) {
        if seq >= self.recovery_point {
            self.ssthresh_bytes = (self.inflight_bytes / 2).max(2 * self.mss_bytes);
            self.cwnd_bytes = self.ssthresh_bytes.min(self.rwnd_bytes);
            self.recovery_point = self.next_seq;
        }
        self.inflight_bytes = self.inflight_bytes.saturating_sub(lost_bytes as u64);
    }

    pub fn window_bytes(&self) -> u64 {
        self.cwnd_bytes.min(self.rwnd_bytes)
    }

    pub fn inflight_bytes(&self) -> u64 {
        self.inflight_bytes
    }

    pub fn ssthresh_bytes(&self) -> u64 {
        self.ssthresh_bytes
    }

    pub fn cwnd_bytes(&self) -> u64 {
        self.cwnd_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u32 = 8922;
    const RWND: u64 = 3 << 20;

    fn w() -> SendWindow {
        SendWindow::new(MSS, INIT_CWND_SEGMENTS, RWND)
    }

    #[test]
    fn the_initial_window_is_ten_segments() {
        let mut w = w();
        assert_eq!(w.window_bytes(), 10 * MSS as u64);
        for _ in 0..10 {
            assert!(w.fits(MSS));
            w.on_send(MSS);
        }
        assert!(!w.fits(1), "an eleventh segment waits for an ACK");
    }

    #[test]
    fn a_message_goes_only_if_it_fits_whole() {
        let mut w = w();
        w.on_send(9 * MSS + MSS / 2);
        assert!(w.fits(MSS / 2), "exactly fills the window");
        assert!(!w.fits(MSS / 2 + 1), "one byte over: it waits");
    }

    #[test]
    fn a_message_larger_than_the_window_leaves_alone() {
        let mut w = w();
        assert!(w.fits(1 << 20), "nothing in flight: it goes");
        w.on_send(1 << 20);
        assert!(!w.fits(72), "and then nothing else until it is acked");
    }

    #[test]
    fn slow_start_doubles_the_window_per_round_trip() {
        let mut w = w();
        let mut t = 0;
        for round in 0..4 {
            let win = w.window_bytes();
            let n = win / MSS as u64;
            for _ in 0..n {
                w.on_send(MSS);
            }
            t += 10_000;
            for _ in 0..n {
                w.on_delivered(t, MSS);
            }
            w.poll(t);
            assert_eq!(w.window_bytes(), 2 * win, "round {round}");
            assert_eq!(w.inflight_bytes(), 0);
        }
    }

    #[test]
    fn acks_take_effect_only_when_they_are_back() {
        let mut w = w();
        w.on_send(10 * MSS);
        w.on_delivered(5_000, 10 * MSS);
        w.poll(4_999);
        assert!(!w.fits(1));
        assert_eq!(w.next_ack_ns(), Some(5_000));
        w.poll(5_000);
        assert!(w.fits(1));
        assert_eq!(w.next_ack_ns(), None);
    }

    #[test]
    fn a_later_ack_never_overtakes_an_earlier_one() {
        let mut w = w();
        w.on_send(MSS);
        w.on_send(MSS);
        w.on_delivered(9_000, MSS);
        w.on_delivered(4_000, MSS); // a shorter path: cumulative ACKs still wait
        w.poll(8_999);
        assert_eq!(w.inflight_bytes(), 2 * MSS as u64);
        w.poll(9_000);
        assert_eq!(w.inflight_bytes(), 0);
    }

    #[test]
    fn a_timeout_halves_ssthresh_and_restarts_from_one_segment() {
        let mut w = w();
        let first = w.on_send(MSS);
        for _ in 0..7 {
            w.on_send(MSS);
        }
        w.on_timeout(first, MSS);
        assert_eq!(w.ssthresh_bytes(), 4 * MSS as u64, "FlightSize / 2");
        assert_eq!(w.window_bytes(), MSS as u64, "the loss window");
        assert_eq!(
            w.inflight_bytes(),
            7 * MSS as u64,
            "the lost bytes left the flight"
        );
        // One ACK for 7 segments: slow start takes 3 of them (1 -> ssthresh = 4), the
        // other 4 count as congestion avoidance (4 MSS · MSS / 4 MSS = one segment).
        w.on_delivered(1, 7 * MSS);
        w.poll(1);
        assert_eq!(w.cwnd_bytes(), 5 * MSS as u64);
        // Congestion avoidance: about one segment per window of ACKs.
        let before = w.cwnd_bytes();
        w.on_send(before as u32);
        w.on_delivered(2, before as u32);
        w.poll(2);
        assert_eq!(w.cwnd_bytes(), before + MSS as u64);
    }

    #[test]
    fn the_pdus_of_one_flight_time_out_as_one_loss_event() {
        let mut w = w();
        let seqs: Vec<u64> = (0..8).map(|_| w.on_send(MSS)).collect();
        w.on_timeout(seqs[0], MSS);
        w.on_delivered(1, MSS);
        w.poll(1);
        let (cwnd, ssthresh) = (w.cwnd_bytes(), w.ssthresh_bytes());
        w.on_timeout(seqs[5], MSS);
        assert_eq!((w.cwnd_bytes(), w.ssthresh_bytes()), (cwnd, ssthresh));
        assert_eq!(w.inflight_bytes(), 5 * MSS as u64);
    }

    #[test]
    fn a_timeout_after_a_fast_recovery_cut_still_collapses_the_window() {
        let mut w = w();
        let seqs: Vec<u64> = (0..8).map(|_| w.on_send(MSS)).collect();
        w.on_loss_detected(seqs[5], MSS);
        assert_eq!(w.cwnd_bytes(), 4 * MSS as u64);
        w.on_timeout(seqs[1], MSS);
        assert_eq!(w.cwnd_bytes(), MSS as u64, "the loss window");
    }

    #[test]
    fn pdus_are_numbered_in_send_order() {
        let mut w = w();
        assert_eq!((w.on_send(72), w.on_send(72), w.on_send(72)), (0, 1, 2));
    }

    #[test]
    fn a_detected_loss_halves_the_window_once_per_recovery_episode() {
        let mut w = w();
        let seqs: Vec<u64> = (0..10).map(|_| w.on_send(MSS)).collect();
        w.on_loss_detected(seqs[2], MSS);
        assert_eq!(w.ssthresh_bytes(), 5 * MSS as u64, "FlightSize / 2");
        assert_eq!(
            w.window_bytes(),
            5 * MSS as u64,
            "fast recovery: cwnd = ssthresh"
        );
        assert_eq!(w.inflight_bytes(), 9 * MSS as u64);
        // Another PDU of the same flight lost: same episode, no second halving.
        w.on_loss_detected(seqs[7], MSS);
        assert_eq!(w.window_bytes(), 5 * MSS as u64);
        assert_eq!(w.inflight_bytes(), 8 * MSS as u64);
        // A PDU sent after the reduction starts a new episode.
        let later = w.on_send(MSS);
        w.on_loss_detected(later, MSS);
        assert_eq!(
            w.ssthresh_bytes(),
            9 * MSS as u64 / 2,
            "half of the 9 segments out"
        );
    }

    #[test]
    fn a_tiny_flight_still_leaves_a_two_segment_ssthresh() {
        let mut w = w();
        let seq = w.on_send(72);
        w.on_timeout(seq, 72);
        assert_eq!(w.ssthresh_bytes(), 2 * MSS as u64);
        assert_eq!(w.inflight_bytes(), 0);
    }

    #[test]
    fn the_window_stops_at_the_receive_window() {
        let mut w = SendWindow::new(MSS, INIT_CWND_SEGMENTS, 200_000);
        for t in 1..100 {
            let n = w.window_bytes() as u32;
            w.on_send(n);
            w.on_delivered(t, n);
            w.poll(t);
        }
        assert_eq!(w.window_bytes(), 200_000);
        assert_eq!(
            w.cwnd_bytes(),
            200_000,
            "cwnd itself stops at the receive window"
        );
        let n = w.window_bytes() as u32;
        w.on_send(n);
        assert!(!w.fits(1), "and the sender is held to it");
    }
}
