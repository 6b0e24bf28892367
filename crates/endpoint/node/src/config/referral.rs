//! `[[referral]]`: entries naming other nodes' discovery controllers.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use trellis_nvme::log::{subtype, DiscoveryEntry};

/// Referrals one node may list (config and `ctl referral add` together).
pub const MAX_REFERRALS: usize = 256;

/// Discovery log entries a node may list in all: the host library refuses
/// longer logs (its `MAX_DISCOVERY_ENTRIES`), as a host must bound memory.
pub const MAX_DISCOVERY_ENTRIES: usize = 1024;

/// `[[referral]]`: another node's discovery controller, listed in our
/// discovery log as a referral.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReferralConfig {
    /// HOST:PORT of the other discovery controller (an IP address: hosts
    /// connect to what the entry says, so it must be routable for them).
    pub addr: SocketAddr,
    /// PORTID of the entry (Discovery Log Page Entry): the other node's port
    /// number for that address. Default: 1.
    #[serde(default = "default_portid")]
    pub portid: u16,
}

fn default_portid() -> u16 {
    1
}

/// Treq of every entry we list: secure channel not required (bits 1:0 =
/// 10b), SQ flow control disable supported (bit 2).
pub const TREQ: u8 = 0x2 | 0x4;

impl ReferralConfig {
    pub fn entry(&self) -> DiscoveryEntry {
        DiscoveryEntry {
            adrfam: if self.addr.is_ipv4() { 1 } else { 2 },
            subtype: subtype::REFERRAL,
            treq: TREQ,
            portid: self.portid,
            trsvcid: self.addr.port().to_string(),
            subnqn: trellis_nvme::fabrics::DISCOVERY_NQN.into(),
            traddr: self.addr.ip().to_string(),
            sectype: trellis_nvme::log::sectype::NONE,
        }
    }
}

/// Checks referrals as the config and `ctl referral add` give them.
pub fn check_referrals(rs: &[ReferralConfig]) -> anyhow::Result<()> {
    anyhow::ensure!(
        rs.len() <= MAX_REFERRALS,
        "{} [[referral]] entries: at most {MAX_REFERRALS} (MAX_REFERRALS)",
        rs.len()
    );
    for (i, r) in rs.iter().enumerate() {
        anyhow::ensure!(
            !r.addr.ip().is_unspecified() && r.addr.port() != 0,
            "referral {} is not an address a host can connect to: give HOST:PORT of the other node's discovery listener",
            r.addr
        );
        anyhow::ensure!(
            !rs[..i].iter().any(|x| x.addr == r.addr),
            "referral {} is listed twice: remove one",
            r.addr
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn referral_entry_is_subtype_1_to_the_discovery_nqn() {
        let r = ReferralConfig {
            addr: "10.0.0.2:8009".parse().unwrap(),
            portid: 7,
        };
        let e = r.entry();
        assert_eq!((e.subtype, e.portid, e.adrfam), (1, 7, 1));
        assert_eq!(
            (e.traddr.as_str(), e.trsvcid.as_str()),
            ("10.0.0.2", "8009")
        );
        assert_eq!(e.subnqn, trellis_nvme::fabrics::DISCOVERY_NQN);
        assert!(check_referrals(std::slice::from_ref(&r)).is_ok());
        let e = check_referrals(&[r.clone(), r]).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
        let bad = ReferralConfig {
            addr: "0.0.0.0:8009".parse().unwrap(),
            portid: 1,
        };
        assert!(check_referrals(&[bad]).is_err());
    }
}
