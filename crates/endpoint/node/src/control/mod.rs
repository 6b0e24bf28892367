//! The management plane: the JSON-RPC management socket (`rpc`,
//! `rpc_disc`, `status`), the live changes to subsystems, namespaces,
//! listeners and referrals, the HA lease (`ha`), and `/metrics`. Writes
//! `state`; never imports `data`.

pub mod drive_health;
pub mod ha;
pub mod listeners;
pub mod metrics;
pub mod metrics_http;
pub mod namespaces;
pub mod referrals;
pub mod rpc;
pub mod rpc_disc;
pub mod status;
pub mod subsystems;

use crate::state::subsystem::Registry;
use std::sync::{Arc, OnceLock};

/// What the management plane works on: the registry it changes, and the HA
/// lease once `server` has started it (set once; None without `[ha]`).
/// `server` builds it and hands it to the management socket and the lease,
/// so the registry, which the data plane reads, holds nothing of control.
pub struct Control {
    pub reg: Arc<Registry>,
    ha: OnceLock<Arc<ha::Ha>>,
}

impl Control {
    pub fn new(reg: Arc<Registry>) -> Arc<Control> {
        Arc::new(Control {
            reg,
            ha: OnceLock::new(),
        })
    }

    /// The HA lease, when this node is in an HA pair and it has started.
    pub fn ha(&self) -> Option<&Arc<ha::Ha>> {
        self.ha.get()
    }

    /// Records the started lease; a second call (a second start) is ignored.
    pub(crate) fn set_ha(&self, h: Arc<ha::Ha>) {
        let _ = self.ha.set(h);
    }
}
