//! `trellis san up|status|link|exec|down`: runs the plan's commands, starts
//! and stops the targets, and keeps what it created in a state file so that
//! `down` removes exactly that.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::plan::{self, Rate};
use crate::topo::{self, Kind, Topology};

/// Default NQN of every node's subsystem (the target's default).
pub const NQN: &str = "nqn.2026-11.io.trellis:default";
/// How long `up` waits for every target to listen.
const TARGET_START: Duration = Duration::from_secs(15);
/// How long `down` waits for a target to exit after SIGTERM.
const TARGET_STOP: Duration = Duration::from_secs(10);
/// Largest namespace a node serves from RAM or the emulated drive.
const NS_SIZE_MAX_MIB: u64 = 4096;

#[derive(clap::Args, Debug)]
pub struct SanArgs {
    #[command(subcommand)]
    pub cmd: SanCmd,
    /// Where the state file and the targets' logs live.
    #[arg(long, global = true, default_value = "/run/trellis-san")]
    pub state_dir: PathBuf,
}

#[derive(clap::Subcommand, Debug)]
pub enum SanCmd {
    /// Build a topology: switched (one link per node to a ToR bridge) or
    /// torus2d (2x2 torus of storage nodes, the client's 4-port adapter with
    /// one port to each): namespaces tsan-*, links, shaping, routes, and a
    /// trellis target in every storage node.
    Up {
        /// switched or torus2d.
        topology: String,
        /// Rate of every storage-side link, e.g. 1gbit, 500mbit, or off.
        #[arg(long, default_value = "1gbit")]
        rate: String,
        /// Rate of each client link (switched: its one link; torus2d: each
        /// of its 4 ports); default: --rate.
        #[arg(long = "host-rate")]
        host_rate: Option<String>,
        /// Backend of every node's namespace: emulated (pm9a3-gen4, clean)
        /// or ram.
        #[arg(long, default_value = "emulated")]
        backend: String,
        /// Namespace size per storage node in MiB.
        #[arg(long = "size-mib", default_value_t = 256)]
        size_mib: u64,
        /// Emulated drive: every device time × this (1 to 1000).
        #[arg(long = "time-scale", default_value_t = 1)]
        time_scale: u32,
    },
    /// The topology, its paths (client → node, path address, hops) and
    /// whether the links and targets are up.
    Status,
    /// Take one link down or bring it back: `link st0 st1 down`; parallel
    /// links are told apart with --nth (0-based, in `status` order).
    Link {
        a: String,
        b: String,
        /// down or up.
        state: String,
        #[arg(long, default_value_t = 0)]
        nth: usize,
    },
    /// Run a command in a node's namespace: `exec h0 -- trellis bench ...`.
    Exec {
        node: String,
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Stop the targets and remove every namespace `up` created.
    Down,
}

#[derive(Serialize, Deserialize, Debug)]
struct State {
    topology: Topology,
    rate: Option<Rate>,
    host_rate: Option<Rate>,
    /// (node, pid) of each target.
    targets: Vec<(String, u32)>,
    /// Namespaces created, in creation order.
    namespaces: Vec<String>,
}

pub fn run(a: SanArgs) -> Result<()> {
    let state_file = a.state_dir.join("state.json");
    match a.cmd {
        SanCmd::Up {
            topology,
            rate,
            host_rate,
            backend,
            size_mib,
            time_scale,
        } => {
            let kind: Kind = topology.parse().map_err(anyhow::Error::msg)?;
            let r = plan::parse_rate(&rate).map_err(|e| anyhow::anyhow!("--rate: {e}"))?;
            let hr = match host_rate {
                Some(h) => plan::parse_rate(&h).map_err(|e| anyhow::anyhow!("--host-rate: {e}"))?,
                None => r,
            };
            if !matches!(backend.as_str(), "emulated" | "ram") {
                bail!("--backend {backend:?}: use emulated or ram");
            }
            if !(1..=NS_SIZE_MAX_MIB).contains(&size_mib) {
                bail!("--size-mib {size_mib}: use 1 to {NS_SIZE_MAX_MIB}");
            }
            if !(1..=1000).contains(&time_scale) {
                bail!("--time-scale {time_scale}: use 1 to 1000");
            }
            let node = NodeSpec {
                backend,
                size_mib,
                time_scale,
            };
            up(&a.state_dir, &state_file, kind, r, hr, &node)
        }
        SanCmd::Status => status(&load(&state_file)?),
        SanCmd::Link {
            a: x,
            b: y,
            state,
            nth,
        } => set_link(&state_file, &x, &y, &state, nth),
        SanCmd::Exec { node, command } => {
            let st = load(&state_file)?;
            if !st.topology.nodes.contains(&node) {
                bail!(
                    "no node {node:?}: the nodes are {}",
                    st.topology.nodes.join(", ")
                );
            }
            let s = Command::new("ip")
                .args(["netns", "exec", &Topology::ns(&node)])
                .args(&command)
                .status()
                .context("running ip netns exec")?;
            std::process::exit(s.code().unwrap_or(1));
        }
        SanCmd::Down => down(&state_file),
    }
}

/// `san link A B up|down`: the `nth` link between two nodes goes up or down.
fn set_link(state_file: &Path, x: &str, y: &str, state: &str, nth: usize) -> Result<()> {
    let st = load(state_file)?;
    let up = match state {
        "up" => true,
        "down" => false,
        other => bail!("link state {other:?}: use down or up"),
    };
    let ls = st.topology.links_between(x, y);
    let Some(&l) = ls.get(nth) else {
        bail!(
            "no link {nth} between {x} and {y} ({} link(s) there; see trellis san status)",
            ls.len()
        );
    };
    run_all(&plan::link_state(&st.topology, l, up))?;
    println!("link {x}-{y} #{nth} {}", if up { "up" } else { "down" });
    Ok(())
}

struct NodeSpec {
    backend: String,
    size_mib: u64,
    time_scale: u32,
}

fn load(state_file: &Path) -> Result<State> {
    let text = std::fs::read_to_string(state_file).with_context(|| {
        format!(
            "no SAN is up here ({} is missing): run trellis san up switched|torus2d",
            state_file.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("reading {}", state_file.display()))
}

fn save(state_file: &Path, st: &State) -> Result<()> {
    let tmp = state_file.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(st)?)?;
    std::fs::rename(&tmp, state_file)?;
    Ok(())
}

fn run_one(c: &[String]) -> Result<()> {
    let o = Command::new(&c[0])
        .args(&c[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} (is iproute2 installed?)", c[0]))?;
    if !o.status.success() {
        bail!(
            "`{}` failed: {}",
            c.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

fn run_all(cmds: &[Vec<String>]) -> Result<()> {
    cmds.iter().try_for_each(|c| run_one(c))
}

fn existing_namespaces() -> Result<Vec<String>> {
    let o = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .context("running ip netns list")?;
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

fn up(
    dir: &Path,
    state_file: &Path,
    kind: Kind,
    rate: Option<Rate>,
    host_rate: Option<Rate>,
    node: &NodeSpec,
) -> Result<()> {
    if state_file.exists() {
        bail!(
            "a SAN is already up ({}): run trellis san down first",
            state_file.display()
        );
    }
    let t = match kind {
        Kind::Switched => topo::switched(),
        Kind::Torus2d => topo::torus2d(),
    };
    let have = existing_namespaces()?;
    if let Some(n) = t
        .nodes
        .iter()
        .map(|n| Topology::ns(n))
        .find(|n| have.contains(n))
    {
        bail!("namespace {n} already exists and is not ours to reuse: remove it (ip netns del {n}) or run trellis san down");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut st = State {
        topology: t.clone(),
        rate,
        host_rate,
        targets: Vec::new(),
        namespaces: t.nodes.iter().map(|n| Topology::ns(n)).collect(),
    };
    // Saved first: whatever fails below, `down` knows what to remove.
    save(state_file, &st)?;
    let built =
        run_all(&plan::up(&t, rate, host_rate)).and_then(|_| start_targets(dir, &mut st, node));
    save(state_file, &st)?;
    if let Err(e) = built {
        let _ = down(state_file);
        return Err(e.context("building the SAN failed; everything created was removed"));
    }
    status(&st)
}

fn start_targets(dir: &Path, st: &mut State, node: &NodeSpec) -> Result<()> {
    let exe = std::env::current_exe().context("finding the trellis binary")?;
    let storage: Vec<String> = st
        .topology
        .nodes
        .iter()
        .filter(|n| n.starts_with("st"))
        .cloned()
        .collect();
    for n in &storage {
        let ndir = dir.join(n);
        std::fs::create_dir_all(&ndir)?;
        let cfg = ndir.join("target.toml");
        let backend = match node.backend.as_str() {
            "emulated" => format!(
                "backend = \"emulated\"\nsize = \"{}M\"\nprofile = \"pm9a3-gen4\"\nprecondition = \"clean\"\ntime_scale = {}\n",
                node.size_mib, node.time_scale
            ),
            _ => format!("backend = \"ram\"\nsize = \"{}M\"\n", node.size_mib),
        };
        std::fs::write(
            &cfg,
            format!(
                "[target]\nstate_dir = \"{}\"\n\n[[listener]]\naddr = \"0.0.0.0:4420\"\n\n[[subsystem]]\nnqn = \"{NQN}\"\n\n[[subsystem.namespace]]\n{backend}",
                ndir.display()
            ),
        )?;
        let log = std::fs::File::create(ndir.join("target.log"))?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &Topology::ns(n)])
            .arg(&exe)
            .args(["target", "-c"])
            .arg(&cfg)
            .args(["--log", "info"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own process group: a Ctrl-C at `san up` must not stop it.
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        let child = c.spawn().context("starting a target")?;
        st.targets.push((n.clone(), child.id()));
    }
    let deadline = Instant::now() + TARGET_START;
    for n in &storage {
        let log = dir.join(n).join("target.log");
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("listening on") {
                break;
            }
            if Instant::now() > deadline {
                bail!("the target in {n} did not start; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

fn down(state_file: &Path) -> Result<()> {
    let st = load(state_file)?;
    for &(_, pid) in &st.targets {
        // SAFETY: plain kill(2) on a pid we started.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + TARGET_STOP;
    while st.targets.iter().any(|&(_, p)| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let have = existing_namespaces()?;
    let mut errors = Vec::new();
    for ns in st.namespaces.iter().rev().filter(|n| have.contains(n)) {
        // Anything else still running inside (a bench started with exec).
        if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
            for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                if let Ok(p) = p.parse::<libc::pid_t>() {
                    // SAFETY: plain kill(2).
                    unsafe {
                        libc::kill(p, libc::SIGKILL);
                    }
                }
            }
        }
        if let Err(e) = run_one(&["ip".into(), "netns".into(), "del".into(), ns.clone()]) {
            errors.push(e.to_string());
        }
    }
    if !errors.is_empty() {
        bail!("could not remove everything: {}", errors.join("; "));
    }
    std::fs::remove_file(state_file)?;
    println!("san down: {} namespaces removed", st.namespaces.len());
    Ok(())
}

fn link_up(ns: &str, dev: &str) -> bool {
    Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", dev])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("state UP"))
        .unwrap_or(false)
}

fn status(st: &State) -> Result<()> {
    let t = &st.topology;
    let rate = |r: Option<Rate>| {
        r.map_or("unshaped".to_string(), |r| {
            format!("{} Mbit/s", r.bits_per_s / 1_000_000)
        })
    };
    println!(
        "topology {:?}: {} nodes, {} links; storage links {}, client links {}",
        t.kind,
        t.nodes.len(),
        t.links.len(),
        rate(st.rate),
        rate(st.host_rate)
    );
    for (n, pid) in &st.targets {
        println!(
            "target {n}: pid {pid} {}, subsystem {NQN} on port 4420",
            if alive(*pid) {
                "running"
            } else {
                "NOT RUNNING"
            }
        );
    }
    println!("links:");
    for (i, l) in t.links.iter().enumerate() {
        let up = link_up(&Topology::ns(&l.a), &l.a_dev) && link_up(&Topology::ns(&l.b), &l.b_dev);
        let nth = t
            .links_between(&l.a, &l.b)
            .iter()
            .position(|&x| x == i)
            .unwrap_or(0);
        println!(
            "  {}:{} - {}:{} (#{nth}) {}",
            l.a,
            l.a_dev,
            l.b,
            l.b_dev,
            if up { "up" } else { "DOWN" }
        );
    }
    println!("paths (connect from h0 to ADDRESS:4420):");
    for p in &t.paths {
        let mut route = "h0".to_string();
        for &h in &p.hops {
            let (_, from_dev, to, to_dev) = t.hop_ends(h);
            route.push_str(&format!(" -{from_dev}/{to_dev}-> {to}"));
        }
        println!("  {} path {} {:<12} {route}", p.target, p.index, p.addr);
    }
    Ok(())
}
