//! The daemon: listeners, an acceptor thread, reactors, and clean shutdown.

use crate::config::Config;
use crate::data::tcp::reactor::{self, NewConn, ReactorHandle, Shared};
use crate::state::subsystem::Registry;
use crate::sys::avoid_reactor_cpus;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How long the acceptor sleeps in poll(2) before looking at the shutdown
/// flag again: the longest a stop waits for the acceptor.
const ACCEPT_POLL_MS: i32 = 100;

/// A running target. Dropping it does not stop it: call [`Target::stop`].
pub struct Target {
    pub reg: Arc<Registry>,
    shutdown: Arc<AtomicBool>,
    failures: Arc<Mutex<Vec<String>>>,
    acceptor: Option<std::thread::JoinHandle<()>>,
    reactors: Arc<Vec<ReactorHandle>>,
    pub local_addrs: Vec<SocketAddr>,
    /// Where `/metrics` is served, when `[metrics] listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    metrics: Option<std::thread::JoinHandle<()>>,
    /// The management socket's thread, when `[ctl] socket` is set.
    ctl: Option<std::thread::JoinHandle<()>>,
    /// The HA lease thread and fence watchdog, when `[ha]` is set.
    ha: Option<crate::control::ha::Threads>,
    /// The DH-HMAC-CHAP workers and transaction bounds (its counters are
    /// for tests).
    pub auth: Arc<crate::data::nvme::auth_work::AuthPool>,
    /// Saves the health counters every `HEALTH_SAVE_INTERVAL_S`.
    health_saver: Option<std::thread::JoinHandle<()>>,
}

impl Target {
    /// Opens backends, binds every listener and starts the reactors.
    /// Long (over 70 lines) on purpose: the start order is the argument
    /// (listeners, registry, metrics, the management plane, DH workers,
    /// reactors, then the lease), each step using what the ones before made,
    /// so it stays one readable sequence.
    pub fn start(cfg: &Config) -> anyhow::Result<Target> {
        cfg.validate()?;
        check_nofile(cfg.target.max_connections);
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
        default_remote_hosts(&mut cfg);
        let reg = Arc::new(Registry::build(&cfg)?);
        let local_addrs = cfg.listeners.iter().map(|l| l.addr).collect();
        let shutdown = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        // Bound before any thread starts, so a taken port fails the start cleanly.
        let (metrics_addr, metrics) = match cfg.metrics.listen {
            Some(addr) => {
                let src = crate::control::metrics::Sources {
                    reg: reg.clone(),
                    connections: connections.clone(),
                };
                let token = metrics_token(&cfg.metrics)?;
                let (a, t) =
                    crate::control::metrics_http::spawn(addr, token, src, shutdown.clone())?;
                (Some(a), Some(t))
            }
            None => (None, None),
        };
        // The management plane's handle: the HA lease joins it when started below.
        let control = crate::control::Control::new(reg.clone());
        let ctl = match &cfg.ctl.socket {
            Some(path) => match crate::control::rpc::spawn(path, control.clone(), shutdown.clone())
            {
                Ok(t) => Some(t),
                Err(e) => {
                    shutdown.store(true, Ordering::SeqCst); // stops the metrics thread
                    return Err(e);
                }
            },
            None => None,
        };
        // The DH-HMAC-CHAP exponentiations' threads, off the reactors.
        let auth = match crate::data::nvme::auth_work::AuthPool::start(&cfg.target) {
            Ok(a) => a,
            Err(e) => {
                shutdown.store(true, Ordering::SeqCst);
                return Err(e.into());
            }
        };
        let mut reactors = Vec::new();
        for i in 0..cfg.target.reactors {
            let cpu = cfg.target.cpus.get(i).copied();
            let shared = Shared {
                reg: reg.clone(),
                shutdown: shutdown.clone(),
                connections: connections.clone(),
                failures: failures.clone(),
                auth: Some(auth.clone()),
            };
            match reactor::spawn(i, cpu, shared) {
                Ok(r) => reactors.push(r),
                Err(e) => {
                    // Stops the threads already started (reactors, metrics).
                    shutdown.store(true, Ordering::SeqCst);
                    return Err(e.into());
                }
            }
        }
        let reactors = Arc::new(reactors);
        // Before the acceptor: no host sees this node optimized before it holds the lease.
        let ha = match crate::control::ha::start(&cfg, &control, &shutdown) {
            Ok(h) => h,
            Err(e) => {
                shutdown.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        let health_saver =
            match spawn_health_saver(reg.clone(), control.ha().cloned(), shutdown.clone()) {
                Ok(h) => h,
                Err(e) => {
                    shutdown.store(true, Ordering::SeqCst);
                    return Err(e.into());
                }
            };
        let acceptor = {
            let (reactors, reg) = (reactors.clone(), reg.clone());
            let shared = Shared {
                reg: reg.clone(),
                shutdown: shutdown.clone(),
                connections,
                failures: failures.clone(),
                auth: None,
            };
            std::thread::Builder::new()
                .name("acceptor".into())
                .spawn(move || accept_thread(listeners, &reactors, &shared))
        };
        let acceptor = match acceptor {
            Ok(a) => a,
            Err(e) => {
                shutdown.store(true, Ordering::SeqCst);
                return Err(e.into());
            }
        };
        // Started: from now on a crash counts as an unsafe shutdown.
        reg.health().serve();
        Ok(Target {
            reg,
            shutdown,
            failures,
            acceptor: Some(acceptor),
            reactors,
            local_addrs,
            metrics_addr,
            metrics,
            ctl,
            ha,
            auth,
            health_saver: Some(health_saver),
        })
    }

    pub fn shutdown_flag(&self) -> Arc<AtomicBool> {
        self.shutdown.clone()
    }

    /// Stops accepting, lets reactors finish in-flight commands (bounded by
    /// `shutdown_grace_ms`), closes every socket and flushes the backends.
    /// Err if a reactor failed (panicked) while the target ran.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.store(true, Ordering::SeqCst);
        self.wait()
    }

    /// Blocks until the shutdown flag is raised (by a signal, or by a
    /// reactor that failed), then stops. Err if any reactor failed: the
    /// process must then exit non-zero.
    pub fn wait(&mut self) -> anyhow::Result<()> {
        if let Some(a) = self.acceptor.take() {
            if a.join().is_err() {
                self.note_failure("the acceptor thread panicked".into());
            }
        }
        if let Some(m) = self.metrics.take() {
            if m.join().is_err() {
                self.note_failure("the metrics thread panicked".into());
            }
        }
        if let Some(c) = self.ctl.take() {
            if c.join().is_err() {
                self.note_failure("the management socket thread panicked".into());
            }
        }
        for r in self.reactors.iter() {
            r.wake();
        }
        let mut joined = Vec::new();
        if let Some(rs) = Arc::get_mut(&mut self.reactors) {
            for r in rs.iter_mut() {
                if let Some(t) = r.thread.take() {
                    joined.push((r.id, t.join().is_ok()));
                }
            }
            rs.clear(); // closes each reactor's eventfd
        }
        self.auth.stop();
        for (id, ok) in joined {
            if !ok {
                self.note_failure(format!("reactor {id} thread panicked outside its loop"));
            }
        }
        let mut flushed = true;
        for ns in self.reg.ns().load().all() {
            if let Err(e) = ns.backend().sync_all() {
                tracing::error!("flush of nsid {} failed: {e}", ns.nsid());
                flushed = false;
            }
        }
        // Closed in the health file only once flushed: a stop that could
        // not flush counts as unsafe at the next start (`state::health`).
        // The final save first (a periodic one after it does nothing), so
        // a health thread slowed by unresponsive drives cannot hold it up.
        if let Err(e) = self.reg.health().close(flushed) {
            tracing::error!("{e:#}");
        }
        if let Some(h) = self.health_saver.take() {
            if h.join().is_err() {
                self.note_failure("the health saver thread panicked".into());
            }
        }
        // After the reactors: the lease is released once no command is in flight.
        if let Some(h) = self.ha.take() {
            if let Err(e) = h.join() {
                self.note_failure(e);
            }
        }
        let failures = std::mem::take(&mut *crate::sys::lock(&self.failures));
        if failures.is_empty() {
            tracing::info!("target stopped");
            Ok(())
        } else {
            tracing::error!("target stopped after a failure: {}", failures.join("; "));
            anyhow::bail!("target failed: {}", failures.join("; "))
        }
    }

    fn note_failure(&self, why: String) {
        tracing::error!("{why}");
        crate::sys::lock(&self.failures).push(why);
    }
}

/// The acceptor thread: a panic here would silently stop all new
/// connections, so it is caught and stops the target with an error.
fn accept_thread(listeners: Vec<TcpListener>, reactors: &[ReactorHandle], shared: &Shared) {
    avoid_reactor_cpus(&shared.reg.limits().cpus);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        accept_loop(listeners, reactors, shared)
    }));
    if r.is_err() {
        tracing::error!("the acceptor panicked; stopping the target");
        shared.fail("the acceptor panicked".into());
    }
}

/// The poll set of the acceptor's sockets.
fn pollfds(socks: &[(usize, TcpListener)]) -> Vec<libc::pollfd> {
    socks
        .iter()
        .map(|(_, l)| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// Raises the descriptor limit for `max_connections` (`rlimit`); warns,
/// naming the fix, when even the hard limit is too low.
fn check_nofile(max_connections: usize) {
    match crate::sys::rlimit::ensure_nofile(max_connections) {
        Some(n) if n.enough() => {}
        // The default bound is a ceiling few nodes reach: below it, say so
        // quietly; a bound the operator chose gets a warning.
        Some(n) if max_connections == crate::config::DEFAULT_MAX_CONNECTIONS => tracing::info!(
            "RLIMIT_NOFILE (hard limit {}) allows about {} connections, below the default target.max_connections {max_connections}",
            n.hard,
            n.soft.saturating_sub(crate::sys::rlimit::FD_RESERVE)
        ),
        Some(n) => tracing::warn!(
            "target.max_connections {max_connections} needs {} file descriptors, but RLIMIT_NOFILE allows {} (hard limit {}): connections past it will be refused; raise the limit (ulimit -n, systemd LimitNOFILE=) or lower max_connections",
            n.wanted,
            n.soft,
            n.hard
        ),
        None => tracing::warn!("cannot read RLIMIT_NOFILE; connections may be refused below target.max_connections"),
    }
}

/// Polls the listeners (so shutdown is noticed within [`ACCEPT_POLL_MS`])
/// and hands each accepted socket to a live reactor, round-robin.
/// Listeners added or removed live (`livelisten`) join or leave the poll
/// set at the top of the next loop.
fn accept_loop(listeners: Vec<TcpListener>, reactors: &[ReactorHandle], shared: &Shared) {
    let mut next = 0usize;
    let mut socks: Vec<(usize, TcpListener)> = listeners.into_iter().enumerate().collect();
    let mut fds = pollfds(&socks);
    let max_connections = shared.reg.limits().max_connections;
    let mut last_accept_warn: Option<std::time::Instant> = None;
    while !shared.shutdown.load(Ordering::Relaxed) {
        if shared.reg.listeners().sync_sockets(&mut socks) {
            fds = pollfds(&socks);
        }
        // SAFETY: fds is a live array of fds.len() pollfds that the kernel
        // fills in; the sockets they name stay open until the next sync.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, ACCEPT_POLL_MS) };
        if n <= 0 {
            continue;
        }
        for (k, (i, l)) in socks.iter().enumerate() {
            if fds[k].revents == 0 {
                continue;
            }
            loop {
                let (stream, peer) = match l.accept() {
                    Ok(a) => a,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // A peer that reset before we took it, or a signal: next.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue
                    }
                    Err(e) => {
                        accept_failed(&e, &mut last_accept_warn);
                        break;
                    }
                };
                if shared.connections.load(Ordering::Relaxed) >= max_connections {
                    refused(
                        shared,
                        peer,
                        "connection limit reached (target.max_connections)",
                    );
                    continue;
                }
                let Some(token) = shared.reg.peer_budget().try_admit(peer.ip()) else {
                    refused(shared, peer, "this address holds its share of connections (target.max_connections_per_addr)");
                    continue;
                };
                let setup = stream.set_nonblocking(true).and(stream.set_nodelay(true));
                if let Err(e) = setup.and_then(|()| keepalive(&stream, shared.reg.limits())) {
                    tracing::warn!(%peer, "cannot set up the accepted socket ({e}); closing");
                    continue;
                }
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let nc = NewConn {
                    stream,
                    listener: *i,
                    peer: token,
                };
                if hand_off(reactors, &mut next, nc, peer).is_err() {
                    tracing::error!(%peer, "no live reactor to serve the connection; closing it");
                    shared.connections.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// TCP keepalive on an accepted socket (`target.tcp_keepalive_*`), so the
/// connection of a host that vanished ends: a controller with KATO 0 would
/// otherwise be kept, with its buffers, until the node stops.
fn keepalive(s: &std::net::TcpStream, l: &crate::config::TargetConfig) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if l.tcp_keepalive_idle_s == 0 {
        return Ok(());
    }
    // The same bound for data sent and never acknowledged (a host that
    // vanished before it acked our last PDU): without it TCP retransmits
    // for tcp_retries2 (about 15 minutes) and keepalive never starts.
    // With keepalive on, Linux also takes it as the keepalive deadline
    // (tcp(7), TCP_USER_TIMEOUT).
    let probes_s = l.tcp_keepalive_interval_s * l.tcp_keepalive_probes;
    let user_timeout_ms = (l.tcp_keepalive_idle_s + probes_s) * 1000;
    // Each within a C int: validate() bounds them (32767 s, 127 probes,
    // the whole within i32::MAX ms).
    let opts = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPIDLE,
            l.tcp_keepalive_idle_s,
        ),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            l.tcp_keepalive_interval_s,
        ),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, l.tcp_keepalive_probes),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout_ms),
    ];
    for (level, name, v) in opts {
        let v = v as libc::c_int;
        // SAFETY: the fd is the live socket `s` owns; the value is a local
        // c_int whose size is passed with it.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The bearer token `/metrics` requires, read once at start from
/// `[metrics] bearer_token_file` (trimmed; an empty file is refused).
fn metrics_token(m: &crate::config::MetricsConfig) -> anyhow::Result<Option<String>> {
    let Some(p) = &m.bearer_token_file else {
        return Ok(None);
    };
    let t = std::fs::read_to_string(p)
        .map_err(|e| anyhow::anyhow!("[metrics] bearer_token_file {}: {e}", p.display()))?;
    let t = t.trim().to_string();
    anyhow::ensure!(
        !t.is_empty(),
        "[metrics] bearer_token_file {} is empty: put the token in it",
        p.display()
    );
    Ok(Some(t))
}

/// Saves the power-on time every `HEALTH_SAVE_INTERVAL_S` and looks at the
/// drives' critical warnings every second (`control::drive_health`) until
/// shutdown (the final save, which marks namespaces closed, is
/// `Target::wait`'s).
fn spawn_health_saver(
    reg: Arc<Registry>,
    ha: Option<Arc<crate::control::ha::Ha>>,
    shutdown: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    use crate::state::health::HEALTH_SAVE_INTERVAL_S;
    std::thread::Builder::new()
        .name("health".into())
        .spawn(move || {
            crate::sys::avoid_reactor_cpus(&reg.limits().cpus);
            let mut last = std::time::Instant::now();
            let mut watch = crate::control::drive_health::DriveWatch::new(ha);
            let mut checked = std::time::Instant::now();
            let check_every = std::time::Duration::from_millis(
                crate::control::drive_health::DRIVE_CHECK_INTERVAL_MS,
            );
            while !shutdown.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(ACCEPT_POLL_MS as u64));
                if checked.elapsed() >= check_every {
                    checked = std::time::Instant::now();
                    watch.check(&reg);
                }
                if last.elapsed().as_secs() >= HEALTH_SAVE_INTERVAL_S {
                    last = std::time::Instant::now();
                    if let Err(e) = reg.health().save(false) {
                        tracing::warn!("{e:#}");
                    }
                }
            }
        })
}

/// Warns of a connection the acceptor refuses, rate-limited (a flood of
/// them, which is what a limit is for, must not flood the log too): a
/// burst whole, then `target.log_lines_per_sec`, each line counting the
/// refusals not logged since the last.
fn refused(shared: &Shared, peer: SocketAddr, why: &str) {
    if let Some(left_out) = shared.reg.log_limits().accept.admit() {
        tracing::warn!(%peer, left_out, "refusing a connection: {why}");
    }
}

/// How long the acceptor pauses after a failed accept (out of descriptors,
/// say): the pending connection stays in the listen backlog, and polling
/// again at once would spin the acceptor's core.
const ACCEPT_RETRY_MS: u64 = 10;
/// At most one warning per this long about failing accepts.
const ACCEPT_WARN_INTERVAL_S: u64 = 10;

/// An accept failed for another reason than "nothing pending" (EMFILE,
/// ENFILE, ENOBUFS): warn at most every [`ACCEPT_WARN_INTERVAL_S`], naming
/// the likely fix, and pause so the acceptor does not spin.
fn accept_failed(e: &std::io::Error, last: &mut Option<std::time::Instant>) {
    let now = std::time::Instant::now();
    if last.is_none_or(|t| now.duration_since(t).as_secs() >= ACCEPT_WARN_INTERVAL_S) {
        *last = Some(now);
        tracing::warn!(
            "cannot accept a connection: {e}; connections wait in the listen backlog (out of file descriptors? raise RLIMIT_NOFILE or lower target.max_connections)"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(ACCEPT_RETRY_MS));
}

/// Gives the connection to the next live reactor (round-robin, skipping
/// dead ones); gives it back if every reactor is dead.
fn hand_off(
    reactors: &[ReactorHandle],
    next: &mut usize,
    mut nc: NewConn,
    peer: SocketAddr,
) -> Result<(), NewConn> {
    for _ in 0..reactors.len() {
        let Some(i) = next_live(reactors.len(), *next, |i| reactors[i].is_alive()) else {
            break;
        };
        *next = i + 1;
        match reactors[i].give(nc) {
            Ok(()) => {
                if !reactors[i].is_alive() {
                    // It died while taking the connection: it may close the
                    // socket unserved; say so rather than let it vanish.
                    tracing::warn!(%peer, reactor = i, "reactor failed while taking the connection; it will be closed");
                }
                return Ok(());
            }
            Err(back) => nc = back,
        }
    }
    Err(nc)
}

/// The first reactor at or after `start` (cyclically) for which `alive` holds.
fn next_live(n: usize, start: usize, alive: impl Fn(usize) -> bool) -> Option<usize> {
    (0..n).map(|k| (start + k) % n).find(|&i| alive(i))
}

/// Runs a target until SIGINT or SIGTERM. Err (so the process exits
/// non-zero) if it cannot start or if a reactor failed.
pub fn run(cfg: &Config) -> anyhow::Result<()> {
    let mut t = Target::start(cfg)?;
    let flag = t.shutdown_flag();
    signal_hook::flag::register(signal_hook::consts::SIGINT, flag.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, flag)?;
    tracing::info!("trellis target ready");
    t.wait()
}

/// `nvme-tcp` namespaces without a `hostnqn` connect as this HA node
/// (`[ha] node`), so the two nodes of a pair are distinct registrants to
/// the shared namespace; without `[ha] node`, `open_namespace` uses the
/// node UUID.
fn default_remote_hosts(cfg: &mut Config) {
    let Some(node) = cfg.ha.as_ref().map(|h| h.node.clone()) else {
        return;
    };
    if node.is_empty() {
        return;
    }
    for s in &mut cfg.subsystems {
        for n in &mut s.namespaces {
            if n.backend == crate::config::BackendKind::NvmeTcp && n.hostnqn.is_none() {
                n.hostnqn = Some(crate::backend::remote::default_hostnqn(&node));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_live;

    #[test]
    fn next_live_skips_dead_reactors_round_robin() {
        let alive = [true, false, true];
        let f = |i: usize| alive[i];
        assert_eq!(next_live(3, 0, f), Some(0));
        assert_eq!(next_live(3, 1, f), Some(2));
        assert_eq!(next_live(3, 3, f), Some(0));
        assert_eq!(next_live(3, 5, f), Some(2));
        assert_eq!(next_live(3, 0, |_| false), None);
        assert_eq!(next_live(0, 0, |_| true), None);
    }
}
