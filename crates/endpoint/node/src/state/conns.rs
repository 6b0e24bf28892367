//! Connections per peer address (`target.max_connections_per_addr`): one
//! address, however many idle sockets it opens, takes at most its share of
//! `target.max_connections`, so a flood of sockets that never send an ICReq
//! cannot lock other hosts out. The acceptor takes a [`PeerToken`] before it
//! hands a socket to a reactor; the token goes with the connection and gives
//! its place back when the connection is dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub struct PeerBudget {
    max_per_addr: usize,
    /// Open connections by peer address; an address with none has no entry,
    /// so the map holds at most `max_connections` entries.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its address's share.
pub struct PeerToken {
    budget: Arc<PeerBudget>,
    addr: IpAddr,
}

impl PeerBudget {
    pub fn new(max_per_addr: usize) -> PeerBudget {
        assert!(max_per_addr >= 1, "a budget of no connection admits nobody");
        PeerBudget {
            max_per_addr,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub fn max_per_addr(&self) -> usize {
        self.max_per_addr
    }

    /// A place for one more connection from `addr`, or None when the
    /// address holds its whole share.
    pub fn try_admit(self: &Arc<Self>, addr: IpAddr) -> Option<PeerToken> {
        let mut open = crate::sys::lock(&self.open);
        let n = open.entry(addr).or_insert(0);
        if *n >= self.max_per_addr {
            return None;
        }
        *n += 1;
        Some(PeerToken {
            budget: self.clone(),
            addr,
        })
    }

    /// Open connections from `addr`.
    pub fn open_from(&self, addr: IpAddr) -> usize {
        crate::sys::lock(&self.open)
            .get(&addr)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for PeerToken {
    fn drop(&mut self) {
        let mut open = crate::sys::lock(&self.budget.open);
        if let Some(n) = open.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_takes_its_share_and_gives_it_back() {
        let b = Arc::new(PeerBudget::new(2));
        let (x, y): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let t1 = b.try_admit(x).unwrap();
        let _t2 = b.try_admit(x).unwrap();
        assert!(b.try_admit(x).is_none(), "a third from one address");
        assert!(b.try_admit(y).is_some(), "another address is not affected");
        drop(t1);
        assert_eq!(b.open_from(x), 1);
        assert!(b.try_admit(x).is_some());
    }
}
