//! Asynchronous events (NVM Express Base Specification 2.0, §5.2): the
//! notices this target raises, the completion each one gets, and the log
//! page whose read (with RAE clear) re-arms it. The control path raises an
//! event with `Controller::raise_event` (a flag); the admin queue completes
//! an outstanding AER with it (`Queue::take_event`) on its next check.

use crate::state::subsystem::Controller;
use std::sync::atomic::Ordering::Relaxed;
use trellis_nvme::ana::{id::AEN_ANA_CHANGE, AEN_ANA_CHANGE_DW0};
use trellis_nvme::log::lid;

/// Asynchronous Event Configuration bit 8 (Set Features 0Bh), and OAES
/// bit 8 in Identify Controller: Namespace Attribute Notices.
pub const AEN_NS_ATTR: u32 = 1 << 8;

/// Completion DW0 of the Namespace Attribute Changed notice: type Notice
/// (2h), information 00h, log page 04h (Changed Namespace List), §5.2.1.
pub const AEN_NS_ATTR_DW0: u32 = 0x2 | (lid::CHANGED_NS_LIST as u32) << 16;

/// Asynchronous Event Configuration bit 31 (Set Features 0Bh), and OAES
/// bit 31 in a discovery controller's Identify Controller: Discovery Log
/// Page Change Notices (NVMe Base 2.0, Set Features: Asynchronous Event
/// Configuration).
pub const AEN_DISC_CHANGE: u32 = 1 << 31;

/// Completion DW0 of the Discovery Log Page Change notice: type Notice
/// (2h), information F0h, log page 70h (NVMe Base 2.0 §5.2.1, Notice
/// event information; Linux's NVME_AER_NOTICE_DISC_CHANGED).
pub const AEN_DISC_CHANGE_DW0: u32 = 0x2 | 0xF0 << 8 | (lid::DISCOVERY as u32) << 16;

/// Internal event bit of "Reservation Log Page Available" (NVMe Base 2.0
/// §5.2.1, I/O command specific status): no Asynchronous Event
/// Configuration bit enables it (bit 30 is reserved there, so a host can
/// never set it); Set Features 82h masks its notices instead.
pub const RESV_LOG: u32 = 1 << 30;

/// Asynchronous Event Configuration bits 0, 2 and 3 (Set Features 0Bh):
/// a SMART / Health critical warning bit that sets raises the event of the
/// same bit (NVMe Base 2.0, Set Features: Asynchronous Event Configuration,
/// "SMART / Health Critical Warnings"). Every controller supports them; no
/// OAES bit advertises them.
pub const AEN_SMART_SPARE: u32 = 1 << 0;
pub const AEN_SMART_RELIABILITY: u32 = 1 << 2;
pub const AEN_SMART_READ_ONLY: u32 = 1 << 3;
/// The critical warning bits that raise an event.
pub const SMART_WARNINGS: u8 = 0x0D;

/// Completion DW0 of a SMART / Health status event: type 1h, the
/// information code (00h NVM subsystem reliability, 02h spare below
/// threshold; §5.2.1, "SMART / Health Status"), log page 02h.
const fn smart_dw0(info: u32) -> u32 {
    0x1 | info << 8 | (lid::SMART as u32) << 16
}

/// An event: its configuration bit, its completion DW0, its log page.
struct Event {
    bit: u32,
    dw0: u32,
    lid: u8,
}

/// Every event we raise, in the order they are delivered when several wait.
const EVENTS: [Event; 7] = [
    Event {
        bit: AEN_SMART_READ_ONLY,
        dw0: smart_dw0(0x00),
        lid: lid::SMART,
    },
    Event {
        bit: AEN_SMART_RELIABILITY,
        dw0: smart_dw0(0x00),
        lid: lid::SMART,
    },
    Event {
        bit: AEN_SMART_SPARE,
        dw0: smart_dw0(0x02),
        lid: lid::SMART,
    },
    Event {
        bit: AEN_NS_ATTR,
        dw0: AEN_NS_ATTR_DW0,
        lid: lid::CHANGED_NS_LIST,
    },
    Event {
        bit: AEN_ANA_CHANGE,
        dw0: AEN_ANA_CHANGE_DW0,
        lid: lid::ANA,
    },
    Event {
        bit: AEN_DISC_CHANGE,
        dw0: AEN_DISC_CHANGE_DW0,
        lid: lid::DISCOVERY,
    },
    Event {
        bit: RESV_LOG,
        dw0: trellis_nvme::resv::AEN_DW0,
        lid: lid::RESERVATION,
    },
];

/// The events an NVM controller supports (OAES; also the bits whose
/// enabling makes its admin queue look for raised events).
pub const SUPPORTED: u32 = AEN_NS_ATTR | AEN_ANA_CHANGE;

/// The events a discovery controller supports (its OAES, and the only
/// Asynchronous Event Configuration bit it accepts, as nvmet's
/// NVMET_DISC_AEN_CFG_OPTIONAL).
pub const DISCOVERY_SUPPORTED: u32 = AEN_DISC_CHANGE;

/// Takes one raised, unsent event of `ctrl`: its completion DW0.
pub fn take(ctrl: &Controller) -> Option<u32> {
    let pending = ctrl.aen_pending.load(Relaxed);
    let e = EVENTS.iter().find(|e| pending & e.bit != 0)?;
    (ctrl.aen_pending.fetch_and(!e.bit, Relaxed) & e.bit != 0).then_some(e.dw0)
}

/// The host read log page `lid` with RAE clear: the event that points to
/// it is unmasked (it may be raised again).
pub fn acknowledge(ctrl: &Controller, lid: u8) {
    for e in EVENTS.iter().filter(|e| e.lid == lid) {
        ctrl.aen_masked.fetch_and(!e.bit, Relaxed);
    }
}

/// NSIDs the Changed Namespace List holds (§5.16.1.5: 1024 entries; more
/// and the log reports FFFFFFFFh in entry 0).
pub const CHANGED_NS_MAX: usize = 1024;

/// A controller's Changed Namespace List (log page 04h).
#[derive(Default)]
pub struct ChangedNs {
    nsids: Vec<u32>,
    overflow: bool,
}

impl ChangedNs {
    /// Notes `nsid` as changed (once).
    pub fn add(&mut self, nsid: u32) {
        if self.overflow || self.nsids.contains(&nsid) {
            return;
        }
        if self.nsids.len() == CHANGED_NS_MAX {
            self.overflow = true;
            self.nsids.clear();
            return;
        }
        self.nsids.push(nsid);
    }

    /// The 4 KiB log page, ascending NSIDs; cleared when `clear`.
    pub fn encode(&mut self, page: &mut Vec<u8>, clear: bool) {
        page.clear();
        page.resize(CHANGED_NS_MAX * 4, 0);
        if self.overflow {
            page[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            self.nsids.sort_unstable();
            for (c, n) in page.chunks_exact_mut(4).zip(&self.nsids) {
                c.copy_from_slice(&n.to_le_bytes());
            }
        }
        if clear {
            *self = ChangedNs::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_ns_list_dedups_sorts_overflows_and_clears() {
        let mut c = ChangedNs::default();
        for n in [3, 1, 3] {
            c.add(n);
        }
        let mut page = Vec::new();
        c.encode(&mut page, false);
        assert_eq!(page.len(), 4096);
        assert_eq!(&page[..12], &[1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        c.encode(&mut page, true);
        c.encode(&mut page, false);
        assert!(page.iter().all(|&b| b == 0), "cleared by the read");
        for n in 1..=CHANGED_NS_MAX as u32 + 1 {
            c.add(n);
        }
        c.encode(&mut page, true);
        assert_eq!(&page[..8], &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
        assert_eq!(AEN_NS_ATTR_DW0, 0x0004_0002);
        assert_eq!(AEN_DISC_CHANGE_DW0, 0x0070_F002);
    }
}
