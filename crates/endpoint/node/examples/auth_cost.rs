//! What in-band authentication (DH-HMAC-CHAP) adds to connecting: the time to
//! open a controller (admin queue) and 4 I/O queues from the host library to
//! an in-process target, without authentication and with each DH group the
//! target may choose, uni- and bidirectional. Authentication runs once per
//! queue at Connect and never on the I/O path, so this is its whole cost.
//! Rounds alternate the configurations (the VM's regime changes from second
//! to second); prints one JSON line per configuration with the median and
//! range of the per-queue time. A benchmark, not a test:
//!
//!   cargo run --release -p trellis-node --example auth_cost [-- ROUNDS]
use std::time::Instant;
use trellis_nvme::dhchap::Secret;

const HOST: &str = "nqn.2026-11.io.trellis:auth-cost-host";
const NQN: &str = "nqn.2026-11.io.trellis:auth-cost";
/// Valid DHHC-1 secrets (48 bytes, SHA-384 transform and none).
const HOST_KEY: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const IO_QUEUES: u16 = 4;

fn target(groups: Option<&str>) -> anyhow::Result<trellis_node::Target> {
    let host = match groups {
        None => String::new(),
        Some(g) => format!(
            "[[subsystem.host]]\nnqn = \"{HOST}\"\ndhchap_secret = \"{HOST_KEY}\"\ndhchap_ctrl_secret = \"{HOST_KEY}\"\ndhchap_dhgroups = [\"{g}\"]\n"
        ),
    };
    let allow = if groups.is_none() {
        "allow_any_host = true\n"
    } else {
        ""
    };
    let toml = format!(
        "[target]\nreactors = 1\n\n[[listener]]\naddr = \"127.0.0.1:0\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\n{allow}\n{host}\n[[subsystem.namespace]]\nbackend = \"null\"\nsize = \"1GiB\"\n"
    );
    trellis_node::Target::start(&trellis_node::config::Config::from_toml(&toml)?)
}

/// ms per queue to open the admin queue and IO_QUEUES I/O queues.
fn connect_ms(addr: &str, cfg: &trellis_host::HostConfig) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let mut c = trellis_host::Controller::connect(addr, NQN, cfg)?;
    c.set_num_queues(IO_QUEUES)?;
    let mut qs = Vec::new();
    for _ in 0..IO_QUEUES {
        qs.push(c.connect_io_queue(16, 4096)?);
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3 / (1 + IO_QUEUES) as f64)
}

fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    let key = Secret::parse(HOST_KEY).map_err(|e| anyhow::anyhow!("{e}"))?;
    let configs: Vec<(&str, Option<&str>, bool)> = vec![
        ("no auth", None, false),
        ("null", Some("null"), false),
        ("ffdhe2048", Some("ffdhe2048"), false),
        ("ffdhe3072", Some("ffdhe3072"), false),
        ("ffdhe4096", Some("ffdhe4096"), false),
        ("ffdhe8192", Some("ffdhe8192"), false),
        ("ffdhe2048 bidirectional", Some("ffdhe2048"), true),
    ];
    let targets = configs
        .iter()
        .map(|c| target(c.1))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut samples = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        for (i, (_, groups, bidi)) in configs.iter().enumerate() {
            let cfg = trellis_host::HostConfig {
                hostnqn: HOST.into(),
                kato_ms: 0,
                dhchap_secret: groups.is_some().then(|| key.clone()),
                dhchap_ctrl_secret: (*bidi).then(|| key.clone()),
                ..Default::default()
            };
            let addr = targets[i].local_addrs[0].to_string();
            samples[i].push(connect_ms(&addr, &cfg)?);
        }
    }
    for ((name, ..), s) in configs.iter().zip(&mut samples) {
        s.sort_by(f64::total_cmp);
        println!(
            "{{\"auth\": \"{name}\", \"rounds\": {rounds}, \"ms_per_queue_median\": {:.3}, \"ms_per_queue_min\": {:.3}, \"ms_per_queue_max\": {:.3}}}",
            s[s.len() / 2],
            s[0],
            s[s.len() - 1]
        );
    }
    for t in targets {
        t.stop()?;
    }
    Ok(())
}
