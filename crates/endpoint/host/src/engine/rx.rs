//! The receive path: where the next `recv` lands (staging, or straight into
//! a slot buffer), PDU parsing with every peer-controlled field checked, and
//! the handling of ICResp, CapsuleResp, C2HData, R2T and TermReq.

use super::*;

/// Payloads at least this large are received straight into the slot buffer
/// when staging is empty, saving a copy (SPDK's 1 KiB rule).
const DIRECT_RECV_MIN: usize = 1024;

impl Engine {
    /// Where the next `recv` should write. Straight into a slot buffer when a
    /// large payload is pending and staging is empty, else into staging.
    pub fn recv_space(&mut self) -> &mut [u8] {
        if let Rx::Payload {
            pad: 0,
            at,
            remaining,
            ..
        } = self.rx_state
        {
            if self.rx.is_empty() && remaining >= DIRECT_RECV_MIN {
                self.direct = true;
                return &mut self.data[at..at + remaining];
            }
        }
        self.direct = false;
        self.rx.space()
    }

    /// Accounts `n` bytes written into the space from [`Engine::recv_space`]
    /// and parses every complete PDU.
    pub fn recv_done(&mut self, n: usize, now_ns: u64) -> Result<()> {
        self.check()?;
        if self.direct {
            self.direct = false;
            if let Rx::Payload {
                ref mut at,
                ref mut remaining,
                ..
            } = self.rx_state
            {
                *at += n;
                *remaining -= n;
            }
        } else {
            self.rx.commit(n);
        }
        let r = self.parse(now_ns);
        r.map_err(|e| self.fail(e))
    }

    /// Test helper: feeds bytes as if received.
    pub fn feed(&mut self, mut bytes: &[u8], now_ns: u64) -> Result<()> {
        while !bytes.is_empty() {
            let space = self.recv_space();
            let n = space.len().min(bytes.len());
            space[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.recv_done(n, now_ns)?;
        }
        Ok(())
    }

    pub(super) fn parse(&mut self, now_ns: u64) -> Result<()> {
        loop {
            let avail = self.rx.len();
            match self.rx_state {
                Rx::Header => {
                    if !self.parse_header(avail, now_ns)? {
                        return Ok(());
                    }
                }
                Rx::Payload { .. } => {
                    if !self.parse_payload(avail, now_ns)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Parses one PDU header if complete; false when more bytes are needed.
    pub(super) fn parse_header(&mut self, avail: usize, now_ns: u64) -> Result<bool> {
        let Some(ch) = CommonHeader::decode(self.rx.pending()) else {
            return Ok(false);
        };
        let l = check_layout(
            &ch,
            false,
            !self.ic_done,
            self.cfg.digests,
            self.cfg.max_pdu_bytes,
        )
        .map_err(|f| {
            Error::protocol(format!(
                "bad PDU header from controller (type {:#04x}): {} (FES {:#x}, field {})",
                ch.pdu_type,
                f.name(),
                f.fes,
                f.fei
            ))
        })?;
        // TermReqs are read whole; every other PDU only up to its data.
        let need = match l.pdu_type {
            PduType::C2HTermReq => l.plen,
            _ => l.header_total(),
        };
        if avail < need {
            return Ok(false);
        }
        let hdr: [u8; TERM_SPACE] = {
            let mut h = [0u8; TERM_SPACE];
            h[..need].copy_from_slice(&self.rx.pending()[..need]);
            h
        };
        self.rx.consume(need);
        verify_header_digest(&l, &hdr)
            .map_err(|_| Error::protocol(format!("header digest mismatch on {:?}", l.pdu_type)))?;
        self.on_header(&l, &hdr, now_ns)?;
        Ok(true)
    }

    pub(super) fn on_header(&mut self, l: &Layout, h: &[u8], now_ns: u64) -> Result<()> {
        match l.pdu_type {
            PduType::IcResp => self.on_icresp(IcResp::decode(h)),
            PduType::CapsuleResp => self.on_resp(Cqe::decode(&h[8..24])),
            PduType::C2HData => self.on_c2h(l, DataHdr::decode(h)),
            PduType::R2T => self.on_r2t(R2t::decode(h)),
            PduType::C2HTermReq => {
                let t = TermReq::decode(h);
                let name = trellis_nvme::Fatal::new(t.fes, t.fei).name();
                Err(Error::protocol(format!(
                    "controller terminated the connection: C2HTermReq FES {:#x} ({name}), FEI {}",
                    t.fes, t.fei
                )))
            }
            other => {
                let _ = now_ns;
                Err(Error::protocol(format!(
                    "unexpected {other:?} from controller"
                )))
            }
        }
    }

    pub(super) fn on_icresp(&mut self, r: IcResp) -> Result<()> {
        if r.pfv != 0 {
            return Err(Error::protocol(format!(
                "ICResp PFV {} (expected 0)",
                r.pfv
            )));
        }
        if r.cpda != 0 {
            // We never pad our data PDUs, so only CPDA 0 (dword alignment) works.
            return Err(Error::protocol(format!(
                "ICResp CPDA {} unsupported",
                r.cpda
            )));
        }
        if r.digests != self.cfg.digests {
            return Err(Error::protocol(format!(
                "ICResp digests {:?} differ from requested {:?}",
                r.digests, self.cfg.digests
            )));
        }
        if r.maxh2cdata < MIN_MAXH2CDATA || !r.maxh2cdata.is_multiple_of(4) {
            return Err(Error::protocol(format!(
                "ICResp MAXH2CDATA {} invalid",
                r.maxh2cdata
            )));
        }
        self.maxh2cdata = r.maxh2cdata;
        self.ic_done = true;
        Ok(())
    }

    /// Looks up an in-flight slot by CID, checking index and generation.
    pub(super) fn slot_of(&self, cid: u16, what: &str) -> Result<u16> {
        let slot = cid & (MAX_QUEUE_SIZE - 1);
        let gen = cid >> SLOT_BITS;
        match self.slots.get(slot as usize) {
            Some(s) if s.state == SlotState::InFlight && s.gen == gen => Ok(slot),
            _ => Err(Error::protocol(format!(
                "{what} for unknown command id {cid:#06x}"
            ))),
        }
    }

    pub(super) fn on_resp(&mut self, cqe: Cqe) -> Result<()> {
        let slot = self.slot_of(cqe.cid, "CapsuleResp")?;
        let s = self.slots[slot as usize];
        if cqe.status.is_success() {
            if let Xfer::FromCtrl(len) = s.xfer {
                if s.done != len {
                    return Err(Error::protocol(format!(
                        "short data: command {:#06x} completed after {} of {} bytes",
                        cqe.cid, s.done, len
                    )));
                }
            }
            if let Xfer::ToCtrl(len) = s.xfer {
                if s.done != len {
                    return Err(Error::protocol(format!(
                        "write {:#06x} completed before its data was requested ({} of {} bytes)",
                        cqe.cid, s.done, len
                    )));
                }
            }
        }
        if let Some(t) = self.cfg.credit_token {
            if cqe.status.is_success() && (cqe.dw1 >> 16) as u16 == t.get() {
                self.io_credits = Some(cqe.dw1 & 0xFFFF);
            }
        }
        self.complete(Completion {
            slot,
            status: cqe.status,
            dw0: cqe.dw0,
            dw1: cqe.dw1,
            sqhd: cqe.sqhd,
        });
        Ok(())
    }

    pub(super) fn complete(&mut self, c: Completion) {
        self.slots[c.slot as usize].state = SlotState::User;
        self.inflight -= 1;
        self.done.push_back(c);
    }

    pub(super) fn on_c2h(&mut self, l: &Layout, h: DataHdr) -> Result<()> {
        let slot = self.slot_of(h.cccid, "C2HData")?;
        let s = self.slots[slot as usize];
        let Xfer::FromCtrl(len) = s.xfer else {
            return Err(Error::protocol(format!(
                "C2HData for command {:#06x}, which reads no data",
                h.cccid
            )));
        };
        if h.datal as usize != l.data_len {
            return Err(Error::protocol(format!(
                "C2HData DATAL {} but PDU carries {} bytes",
                h.datal, l.data_len
            )));
        }
        if h.datao != s.done || h.datao as u64 + h.datal as u64 > len as u64 {
            return Err(Error::protocol(format!(
                "C2HData out of range: offset {} length {} (expected offset {}, command length {})",
                h.datao, h.datal, s.done, len
            )));
        }
        if l.flags & flags::SUCCESS != 0 && l.flags & flags::LAST_PDU == 0 {
            return Err(Error::protocol("C2HData SUCCESS without LAST_PDU"));
        }
        let start = slot as usize * self.cfg.buf_bytes + h.datao as usize;
        self.rx_state = Rx::Payload {
            slot,
            pad: l.data_off - l.header_total(),
            start,
            at: start,
            remaining: h.datal as usize,
            flags: l.flags,
            ddgst: l.ddgst,
        };
        Ok(())
    }

    pub(super) fn parse_payload(&mut self, avail: usize, now_ns: u64) -> Result<bool> {
        let Rx::Payload {
            slot,
            pad,
            start,
            at,
            remaining,
            flags: fl,
            ddgst,
        } = self.rx_state
        else {
            // parse() calls this only in the Payload state.
            debug_assert!(false, "parse_payload outside a payload");
            return Ok(false);
        };
        if pad > 0 {
            let n = pad.min(avail);
            self.rx.consume(n);
            self.set_payload(pad - n, at, remaining);
            return Ok(n > 0);
        }
        if remaining > 0 {
            let n = remaining.min(avail);
            if n == 0 {
                return Ok(false);
            }
            self.data[at..at + n].copy_from_slice(&self.rx.pending()[..n]);
            self.rx.consume(n);
            self.set_payload(0, at + n, remaining - n);
            return Ok(true);
        }
        if ddgst {
            if avail < DIGEST_LEN {
                return Ok(false);
            }
            let want = trellis_nvme::le32(self.rx.pending(), 0);
            self.rx.consume(DIGEST_LEN);
            if crc::digest(&self.data[start..at]) != want {
                return Err(Error::protocol("C2HData data digest mismatch"));
            }
        }
        self.rx_state = Rx::Header;
        let s = &mut self.slots[slot as usize];
        s.done += (at - start) as u32;
        let len = match s.xfer {
            Xfer::FromCtrl(n) => n,
            _ => 0,
        };
        if fl & flags::LAST_PDU != 0 && s.done != len {
            return Err(Error::protocol(format!(
                "short data: last C2HData after {} of {} bytes",
                s.done, len
            )));
        }
        if fl & flags::SUCCESS != 0 {
            self.complete(Completion {
                slot,
                status: Status::SUCCESS,
                dw0: 0,
                dw1: 0,
                sqhd: 0,
            });
        }
        let _ = now_ns;
        Ok(true)
    }

    pub(super) fn set_payload(&mut self, p: usize, a: usize, r: usize) {
        if let Rx::Payload {
            ref mut pad,
            ref mut at,
            ref mut remaining,
            ..
        } = self.rx_state
        {
            *pad = p;
            *at = a;
            *remaining = r;
        }
    }

    /// Answers an R2T with H2CData PDUs of at most MAXH2CDATA bytes each.
    pub(super) fn on_r2t(&mut self, r: R2t) -> Result<()> {
        let slot = self.slot_of(r.cccid, "R2T")?;
        let s = self.slots[slot as usize];
        let Xfer::ToCtrl(len) = s.xfer else {
            return Err(Error::protocol(format!(
                "R2T for command {:#06x}, which writes no data",
                r.cccid
            )));
        };
        if r.r2tl == 0 || r.r2to != s.done || r.r2to as u64 + r.r2tl as u64 > len as u64 {
            return Err(Error::protocol(format!(
                "R2T out of range: offset {} length {} (sent {}, command length {})",
                r.r2to, r.r2tl, s.done, len
            )));
        }
        let end = r.r2to + r.r2tl;
        let mut off = r.r2to;
        while off < end {
            let n = (end - off).min(self.maxh2cdata);
            let last = off + n == end;
            let mut hdr = [0u8; SMALL_HLEN + DIGEST_LEN];
            let hl = pdu::encode_data_hdr(
                &mut hdr,
                PduType::H2CData,
                &DataHdr {
                    cccid: r.cccid,
                    ttag: r.ttag,
                    datao: off,
                    datal: n,
                },
                if last { flags::LAST_PDU } else { 0 },
                self.cfg.digests,
            );
            self.push_arena(&hdr[..hl]);
            self.push_data(slot, off as usize, n as usize);
            off += n;
        }
        self.slots[slot as usize].done = end;
        Ok(())
    }
}
