//! `trellis ctl subsystem|referral|listener`: what the discovery log lists, changed
//! live (the server side is `trellis_node::control::rpc_disc`).

use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand, Debug)]
pub enum DiscCmd {
    /// Add or remove a subsystem while hosts of the others stay connected;
    /// discovery hosts get a Discovery Log Page Change notice.
    Subsystem {
        #[command(subcommand)]
        cmd: SubsystemCmd,
    },
    /// Referrals to other nodes' discovery controllers in our discovery log.
    Referral {
        #[command(subcommand)]
        cmd: ReferralCmd,
    },
    /// Start or stop listening on an address; existing connections stay.
    Listener {
        #[command(subcommand)]
        cmd: ListenerCmd,
    },
}

#[derive(Subcommand, Debug)]
pub enum ListenerCmd {
    /// Listen on IP:PORT (port 0: a free one, printed).
    Add {
        #[arg(long)]
        addr: String,
        /// both (I/O and discovery) or discovery (default: discovery on
        /// port 8009, both elsewhere).
        #[arg(long)]
        kind: Option<String>,
        /// ANA state of every group through it (default: the first I/O
        /// listener's states): optimized, non-optimized, inaccessible,
        /// persistent-loss.
        #[arg(long)]
        ana_state: Option<String>,
        /// A name subsystems' `listeners` may use for it (unique on the
        /// node: 1-64 of A-Z a-z 0-9 . _ -).
        #[arg(long)]
        name: Option<String>,
        /// TLS on it: required (TLS only) or optional (TLS or plain);
        /// left out: plain TCP.
        #[arg(long)]
        secure_channel: Option<String>,
    },
    /// Stop listening on IP:PORT (hosts connected through it stay).
    Remove {
        #[arg(long)]
        addr: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum SubsystemCmd {
    /// Add a subsystem (no namespaces: add them with `namespace add`).
    Add {
        #[arg(long)]
        nqn: String,
        /// A host NQN allowed to connect (repeatable); none: any host.
        #[arg(long = "allow-host")]
        allow_host: Vec<String>,
        /// Serial number (default: derived from the node identity and NQN).
        #[arg(long)]
        serial: Option<String>,
        #[arg(long)]
        model: Option<String>,
    },
    /// Remove a subsystem; refused while hosts are connected unless --force.
    Remove {
        #[arg(long)]
        nqn: String,
        /// Tear down the controllers of connected hosts.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ReferralCmd {
    /// List another node's discovery controller (IP:PORT) as a referral.
    Add {
        #[arg(long)]
        addr: String,
        /// The PORTID the entry carries (the other node's port number).
        #[arg(long, default_value_t = 1)]
        portid: u16,
    },
    /// Stop listing a referral.
    Remove {
        #[arg(long)]
        addr: String,
    },
}

/// The JSON-RPC method and parameters of `c`.
pub fn request(c: &DiscCmd) -> (&'static str, Value) {
    match c {
        DiscCmd::Subsystem {
            cmd:
                SubsystemCmd::Add {
                    nqn,
                    allow_host,
                    serial,
                    model,
                },
        } => {
            let mut p = json!({"nqn": nqn, "allowed_hosts": allow_host});
            if let Some(s) = serial {
                p["serial"] = json!(s);
            }
            if let Some(m) = model {
                p["model"] = json!(m);
            }
            ("subsystem_add", p)
        }
        DiscCmd::Subsystem {
            cmd: SubsystemCmd::Remove { nqn, force },
        } => ("subsystem_remove", json!({"nqn": nqn, "force": force})),
        DiscCmd::Referral {
            cmd: ReferralCmd::Add { addr, portid },
        } => ("referral_add", json!({"addr": addr, "portid": portid})),
        DiscCmd::Referral {
            cmd: ReferralCmd::Remove { addr },
        } => ("referral_remove", json!({"addr": addr})),
        DiscCmd::Listener {
            cmd:
                ListenerCmd::Add {
                    addr,
                    kind,
                    ana_state,
                    name,
                    secure_channel,
                },
        } => (
            "listener_add",
            json!({"addr": addr, "kind": kind, "ana_state": ana_state,
                   "name": name, "secure_channel": secure_channel}),
        ),
        DiscCmd::Listener {
            cmd: ListenerCmd::Remove { addr },
        } => ("listener_remove", json!({"addr": addr})),
    }
}

/// One line for a result of these methods; None for other methods.
pub fn summary(method: &str, r: &Value) -> Option<String> {
    let n = &r["notified_controllers"];
    let s = |k: &str| r[k].as_str().unwrap_or("?").to_string();
    Some(match method {
        "subsystem_add" => format!(
            "{} added; {n} discovery controller(s) sent a log change notice",
            s("subsystem")
        ),
        "subsystem_remove" => format!(
            "{} removed; {} controller(s) torn down; {n} discovery controller(s) notified",
            s("subsystem"),
            r["torn_down_controllers"]
        ),
        "referral_add" | "referral_remove" => format!(
            "referral to {} {}; {n} discovery controller(s) notified",
            s("referral"),
            if method == "referral_add" {
                "added"
            } else {
                "removed"
            }
        ),
        "listener_add" => format!(
            "listening on {}; {n} discovery controller(s) notified",
            s("listener")
        ),
        "listener_remove" => format!(
            "stopped listening on {} (its connections stay); {n} discovery controller(s) notified",
            s("listener")
        ),
        _ => return None,
    })
}
