//! The daemon: listeners, an acceptor thread, reactors, and clean shutdown.

use crate::config::Config;
use crate::reactor::{self, NewConn, ReactorHandle, Shared};
use crate::subsystem::Registry;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A running target. Dropping it does not stop it: call [`Target::stop`].
pub struct Target {
    pub reg: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
    reactors: Arc<Vec<ReactorHandle>>,
    pub local_addrs: Vec<std::net::SocketAddr>,
}

impl Target {
    /// Opens backends, binds every listener and starts the reactors.
    pub fn start(cfg: &Config) -> anyhow::Result<Target> {
        cfg.validate()?;
        let mut listeners = Vec::new();
        let mut cfg = cfg.clone();
        for l in &mut cfg.listeners {
            let sock = TcpListener::bind(l.addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", l.addr))?;
            sock.set_nonblocking(true)?;
            // Port 0 picks a free port: record the real one, which the
            // discovery log must advertise.
            l.addr = sock.local_addr()?;
            tracing::info!("listening on {} ({:?})", l.addr, l.kind());
            listeners.push(sock);
        }
        let reg = Arc::new(Registry::build(&cfg)?);
        let local_addrs = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let shutdown = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let mut reactors = Vec::new();
        for i in 0..cfg.target.reactors {
            let cpu = cfg.target.cpus.get(i).copied();
            let shared = Shared {
                reg: reg.clone(),
                shutdown: shutdown.clone(),
                connections: connections.clone(),
            };
            reactors.push(reactor::spawn(i, cpu, shared)?);
        }
        let reactors = Arc::new(reactors);
        let acceptor = {
            let (reactors, shutdown, reg) = (reactors.clone(), shutdown.clone(), reg.clone());
            std::thread::Builder::new()
                .name("acceptor".into())
                .spawn(move || accept_loop(listeners, &reactors, &shutdown, &connections, &reg))?
        };
        Ok(Target {
            reg,
            shutdown,
            acceptor: Some(acceptor),
            reactors,
            local_addrs,
        })
    }

    pub fn shutdown_flag(&self) -> Arc<AtomicBool> {
        self.shutdown.clone()
    }

    /// Stops accepting, lets reactors finish in-flight commands (bounded by
    /// `shutdown_grace_ms`), closes every socket and flushes the backends.
    pub fn stop(mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.wait();
    }

    /// Blocks until the shutdown flag is raised (e.g. by a signal), then stops.
    pub fn wait(&mut self) {
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for r in self.reactors.iter() {
            r.wake();
        }
        if let Some(rs) = Arc::get_mut(&mut self.reactors) {
            rs.clear(); // joins each reactor thread
        }
        for ns in &self.reg.namespaces {
            if let Err(e) = ns.backend.sync_all() {
                tracing::error!("flush of nsid {} failed: {e}", ns.nsid);
            }
        }
        tracing::info!("target stopped");
    }
}

/// Polls the listeners (100 ms timeout so shutdown is noticed) and hands
/// each accepted socket to a reactor, round-robin.
fn accept_loop(
    listeners: Vec<TcpListener>,
    reactors: &[ReactorHandle],
    shutdown: &AtomicBool,
    connections: &AtomicUsize,
    reg: &Registry,
) {
    let mut next = 0usize;
    let mut fds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|l| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !shutdown.load(Ordering::Relaxed) {
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 100) };
        if n <= 0 {
            continue;
        }
        for (i, l) in listeners.iter().enumerate() {
            if fds[i].revents == 0 {
                continue;
            }
            while let Ok((stream, peer)) = l.accept() {
                if connections.load(Ordering::Relaxed) >= reg.limits.max_connections {
                    tracing::warn!(%peer, "connection limit reached; refusing");
                    continue;
                }
                if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                    continue;
                }
                connections.fetch_add(1, Ordering::Relaxed);
                reactors[next % reactors.len()].give(NewConn {
                    stream,
                    listener: i,
                });
                next += 1;
            }
        }
    }
}

/// Runs a target until SIGINT or SIGTERM.
pub fn run(cfg: &Config) -> anyhow::Result<()> {
    let mut t = Target::start(cfg)?;
    let flag = t.shutdown_flag();
    signal_hook::flag::register(signal_hook::consts::SIGINT, flag.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, flag)?;
    tracing::info!("trellis target ready");
    t.wait();
    Ok(())
}
