//! Reactors: one thread per core, each owning its connections for their whole
//! life (no cross-thread handoff on the data path).
//!
//! Each loop: take new connections, poll sockets with `epoll_wait` (timeout 0
//! while busy), receive and process PDUs, reap backend completions, then send
//! everything each connection has queued with one gathered `sendmsg`. After
//! `idle_spin_us` without work the reactor sleeps in `epoll_wait`, so an idle
//! target does not burn a core, while a busy one never pays a wake-up (about
//! 70 µs on these VMs) between I/Os.
//!
//! Failure policy (fail-stop): a panic anywhere in a reactor's loop (a bug
//! in a command handler, say) is caught. The reactor marks itself dead so
//! the acceptor stops handing it connections, logs why at error level, shuts
//! down every socket it owns (hosts see the connection end at once, not a
//! hang), raises the target's shutdown flag, and records the failure, so
//! `Target::wait` (server.rs) returns an error and `trellis target` exits
//! non-zero. The other reactors finish in-flight commands within the grace
//! period. We stop rather than restart the reactor because a panic means an
//! invariant broke while shared state (controllers, their queues) may be half
//! updated: a supervisor (systemd, Kubernetes) restarting the process gives a
//! clean state, and hosts reconnect (or fail over to another path) on their own.
//!
//! Shutdown never frees memory the kernel may still write: in-flight backend
//! I/O is waited for (up to `shutdown_grace_ms`), then cancelled
//! (IORING_OP_ASYNC_CANCEL) and waited for again (up to [`CANCEL_WAIT_NS`]);
//! buffers of requests that still have not completed are leaked on purpose,
//! with an error log line.

use crate::config::SecureChannel;
use crate::data::nvme::exec::Ctx;
use crate::data::tcp::conn::Conn;
use crate::data::tcp::uring_net::Kind;
use crate::state::stats::CloseKind;
use crate::state::subsystem::Registry;
use crate::sys::now_ns;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

mod drain;
mod send;
mod shutdown;
mod step;
mod uring;
use send::*;
use step::*;
use uring::*;

const NS_PER_MS: u64 = 1_000_000;

pub struct NewConn {
    pub stream: TcpStream,
    pub listener: usize,
    /// Its place in its peer address's share, given back when it is dropped.
    pub peer: crate::state::conns::PeerToken,
}

pub struct ReactorHandle {
    pub id: usize,
    pub tx: mpsc::Sender<NewConn>,
    wake_fd: RawFd,
    /// Cleared by the reactor when it fails or exits: hand it nothing more.
    alive: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

impl ReactorHandle {
    /// Hands a connection to the reactor and wakes it if it sleeps. Gives
    /// the connection back if the reactor is dead or gone.
    pub fn give(&self, c: NewConn) -> Result<(), NewConn> {
        if !self.is_alive() {
            return Err(c);
        }
        self.tx.send(c).map_err(|e| e.0)?;
        self.wake();
        Ok(())
    }
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local u64 to our eventfd, which
        // stays open until this handle is dropped.
        unsafe { libc::write(self.wake_fd, &one as *const u64 as *const _, 8) };
    }
}

impl Drop for ReactorHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the eventfd is ours and the reactor thread that also used
        // it has been joined: nothing uses the fd after this close.
        unsafe { libc::close(self.wake_fd) };
    }
}

const WAKE_TOKEN: u64 = u64::MAX;
/// Most iovecs per sendmsg (IOV_MAX is 1024; 256 already covers ~80 reads).
const MAX_IOV: usize = 256;
/// How often a reactor publishes its busy time for `/metrics`.
const PUBLISH_NS: u64 = NS_PER_MS;
/// Events taken per epoll_wait; more simply wait for the next loop.
const EPOLL_EVENTS: usize = 256;
/// Initial room of the scratch buffer handlers build responses in (the
/// largest admin payloads, e.g. a 4 KiB identify or a log page, fit).
const SCRATCH_BYTES: usize = 64 << 10;
/// Initial room for the backend completions of one loop.
const DONE_CAPACITY: usize = 1024;
/// Submission queue entries of the socket engine's ring: one receive and
/// at most one send per connection, plus the wake-up read and the timeout.
const SOCKET_RING_ENTRIES: u32 = 4096;
/// After shutdown(2) of its socket, a connection's armed receive and send
/// complete at once; this long is allowed before they count as stuck.
const SOCKET_CLOSE_WAIT_NS: u64 = 100 * NS_PER_MS;
/// After cancellation, how long to wait for the cancelled operations to
/// complete. Cancelled (or shut-down) operations end in microseconds; what
/// is still running after this (I/O stuck in a device) is leaked.
pub const CANCEL_WAIT_NS: u64 = 2_000 * NS_PER_MS;
/// Sleep between polls while waiting for in-flight operations at shutdown.
const SHUTDOWN_POLL: std::time::Duration = std::time::Duration::from_micros(200);

struct Entry {
    stream: TcpStream,
    /// Held for the connection's life (`state::conns`).
    _peer: crate::state::conns::PeerToken,
    /// Distinguishes this connection from later ones that reuse its index,
    /// so a stale timer never fires on a stranger.
    gen: u32,
    /// The deadline registered in the timer heap (`u64::MAX`: none).
    timer_at: u64,
    conn: Conn,
    out_armed: bool,
    /// io_uring engine: a receive / a send is in flight for this connection.
    recv_armed: bool,
    send_armed: bool,
    /// The iovecs and msghdr of the in-flight send (stable until it completes).
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
    /// Socket closed, waiting for backend requests to drain.
    zombie: bool,
    /// A TLS listener's connection whose first byte is not seen yet: it
    /// decides between TLS and plain (`secure_channel`).
    undecided: Option<SecureChannel>,
    /// io_uring engine: the byte a peeking receive reads into.
    peek: Option<Box<[u8; 1]>>,
    /// This connection speaks TLS: ciphertext on the socket, plaintext in
    /// `conn` (None on plain connections: their path is untouched).
    tls: Option<Box<trellis_tls::Tls>>,
    /// When a closing TLS connection found ciphertext still going out (an
    /// alert, a TermReq) and began waiting for it (`u64::MAX`: not waiting).
    close_wait_since_ns: u64,
}

impl Entry {
    /// The kernel may still write into this connection's buffers.
    fn kernel_owned(&self) -> bool {
        self.conn.backend_in_flight() > 0 || self.recv_armed || self.send_armed
    }

    /// Output waits: plaintext in the connection, or ciphertext in its TLS.
    fn has_output(&self) -> bool {
        self.conn.has_output() || self.tls.as_ref().is_some_and(|t| t.has_output())
    }
}

#[derive(Clone)]
pub struct Shared {
    pub reg: Arc<Registry>,
    pub shutdown: Arc<AtomicBool>,
    pub connections: Arc<AtomicUsize>,
    /// Why reactors failed; non-empty makes `Target::wait` return an error.
    pub failures: Arc<Mutex<Vec<String>>>,
    /// The DH workers (None: authentication computes on the reactor).
    pub auth: Option<Arc<crate::data::nvme::auth_work::AuthPool>>,
}

impl Shared {
    /// Records a failure that must make the target exit non-zero, and stops it.
    pub fn fail(&self, why: String) {
        crate::sys::lock(&self.failures).push(why);
        self.shutdown.store(true, Ordering::SeqCst);
    }
}

pub fn spawn(id: usize, cpu: Option<usize>, shared: Shared) -> std::io::Result<ReactorHandle> {
    let (tx, rx) = mpsc::channel();
    // SAFETY: eventfd takes no pointers; the result is checked.
    let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if wake_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let epfd = match epoll_with(wake_fd) {
        Ok(fd) => fd,
        Err(e) => {
            // SAFETY: wake_fd was just created and is used by nothing else.
            unsafe { libc::close(wake_fd) };
            return Err(e);
        }
    };
    let alive = Arc::new(AtomicBool::new(true));
    let thread = {
        let alive = alive.clone();
        std::thread::Builder::new()
            .name(format!("reactor-{id}"))
            .spawn(move || {
                // run() catches panics of the loop and its cleanup; this
                // catches the rest (setup), so no reactor dies unnoticed.
                let (guard, alive_flag) = (shared.clone(), alive.clone());
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                    if let Some(cpu) = cpu {
                        pin_to_cpu(cpu);
                    }
                    crate::data::nvme::exec::set_reactor_id(id);
                    Reactor::new(id, shared, rx, wake_fd, epfd, alive).run();
                }));
                if r.is_err() {
                    alive_flag.store(false, Ordering::SeqCst);
                    tracing::error!(
                        reactor = id,
                        "reactor panicked outside its loop; stopping the target"
                    );
                    guard.fail(format!("reactor {id} panicked outside its loop"));
                }
            })?
    };
    Ok(ReactorHandle {
        id,
        tx,
        wake_fd,
        alive,
        thread: Some(thread),
    })
}

/// An epoll instance watching `wake_fd`.
fn epoll_with(wake_fd: RawFd) -> std::io::Result<RawFd> {
    // SAFETY: epoll_create1 takes no pointers; the result is checked.
    let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: WAKE_TOKEN,
    };
    // SAFETY: ev is a live local the kernel only reads; both fds are open.
    if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, wake_fd, &mut ev) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: epfd was just created and is used by nothing else.
        unsafe { libc::close(epfd) };
        return Err(e);
    }
    Ok(epfd)
}

fn pin_to_cpu(cpu: usize) {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        tracing::warn!("cannot pin reactor to CPU {cpu}");
    }
}

struct Reactor {
    id: usize,
    shared: Shared,
    rx: mpsc::Receiver<NewConn>,
    wake_fd: RawFd,
    epfd: RawFd,
    alive: Arc<AtomicBool>,
    conns: Vec<Option<Entry>>,
    free: Vec<u32>,
    queues: Vec<Option<crate::data::nvme::exec::NsQueue>>,
    /// The namespace set generation `queues` was last pruned for.
    ns_gen: u64,
    /// The tenant weights generation the schedulers in `queues` have.
    weights_gen: u64,
    scratch: Vec<u8>,
    iov: Vec<libc::iovec>,
    done: Vec<crate::backend::Completion>,
    last_work_ns: u64,
    /// Connection deadlines as (time, index, generation): a connection's
    /// timers are data (`Conn::next_timeout`), not a scan of every connection.
    timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    next_gen: u32,
    /// Some when the io_uring socket engine is in use; None means epoll + syscalls.
    uring: Option<crate::data::tcp::uring_net::UringNet>,
    /// The TLS context of `secure_channel` listeners (made at the first
    /// connection on one).
    tls_server: Option<trellis_tls::ServerConfig>,
    /// The DH workers and where their results for this reactor arrive.
    auth: Option<crate::data::nvme::auth_work::AuthPort>,
    auth_done: Vec<crate::data::nvme::auth_work::Done>,
    /// Preempt and Abort's drains, as this reactor takes part (`drain.rs`).
    drain: drain::DrainState,
}

/// The reactor's way to the DH workers: None (computing on the reactor,
/// with a warning) if its eventfd cannot be shared with them.
fn auth_port(
    id: usize,
    shared: &Shared,
    wake_fd: RawFd,
) -> Option<crate::data::nvme::auth_work::AuthPort> {
    let pool = shared.auth.clone()?;
    match crate::data::nvme::auth_work::Mailbox::new(wake_fd) {
        Ok(m) => Some(crate::data::nvme::auth_work::AuthPort {
            pool,
            mailbox: Arc::new(m),
        }),
        Err(e) => {
            tracing::warn!(
                reactor = id,
                "DH-HMAC-CHAP exponentiations will run on the reactor: {e}"
            );
            None
        }
    }
}

/// The text of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

impl Reactor {
    fn new(
        id: usize,
        shared: Shared,
        rx: mpsc::Receiver<NewConn>,
        wake_fd: RawFd,
        epfd: RawFd,
        alive: Arc<AtomicBool>,
    ) -> Reactor {
        let engine = shared.reg.limits().socket_engine;
        let auth = auth_port(id, &shared, wake_fd);
        Reactor {
            id,
            shared,
            rx,
            wake_fd,
            epfd,
            alive,
            conns: Vec::new(),
            free: Vec::new(),
            queues: Vec::new(),
            ns_gen: 0,
            weights_gen: 0,
            scratch: Vec::with_capacity(SCRATCH_BYTES),
            iov: Vec::with_capacity(MAX_IOV),
            done: Vec::with_capacity(DONE_CAPACITY),
            last_work_ns: 0,
            timers: BinaryHeap::new(),
            next_gen: 0,
            uring: open_uring(id, engine),
            tls_server: None,
            auth,
            auth_done: Vec::new(),
            drain: Default::default(),
        }
    }

    /// Serves until shutdown, catching any panic (see the module comment for
    /// the failure policy), then closes everything without freeing memory
    /// the kernel may still write.
    fn run(&mut self) {
        use std::panic::{catch_unwind, AssertUnwindSafe};
        // AssertUnwindSafe: after a panic the reactor's state is only used to
        // close sockets and wait for the kernel, never to serve again.
        let outcome = catch_unwind(AssertUnwindSafe(|| self.serve()));
        let grace_deadline = match outcome {
            Ok(Ok(deadline)) => deadline,
            Ok(Err(why)) => self.fail(&why),
            Err(p) => self.fail(&format!("panicked: {}", panic_message(&*p))),
        };
        if catch_unwind(AssertUnwindSafe(|| self.close_all(grace_deadline))).is_err() {
            tracing::error!(
                reactor = self.id,
                "closing connections panicked too; leaking all connection buffers"
            );
            self.shared
                .fail(format!("reactor {} panicked while closing", self.id));
            std::mem::forget(std::mem::take(&mut self.conns));
        }
        self.alive.store(false, Ordering::SeqCst);
        self.refuse_new("the reactor has stopped");
    }

    /// The reactor failed: stop taking connections, close the sockets of
    /// all it owns, and stop the target. Returns the deadline for in-flight
    /// backend I/O (a full grace period from now).
    fn fail(&mut self, why: &str) -> u64 {
        self.alive.store(false, Ordering::SeqCst);
        let live = self.conns.iter().flatten().filter(|e| !e.zombie).count();
        tracing::error!(
            reactor = self.id,
            "reactor failed: {why}; closing its {live} connections and stopping the target \
             (it will exit with an error)"
        );
        self.shared
            .fail(format!("reactor {} failed: {why}", self.id));
        for e in self.conns.iter_mut().flatten() {
            if e.zombie {
                continue;
            }
            tracing::error!(reactor = self.id, peer = %e.conn.peer(), "closing connection: its reactor failed");
            e.conn.close_quietly(&format!("reactor {} failed", self.id));
            // Hosts see the connection end now, not when the target exits.
            let _ = e.stream.shutdown(std::net::Shutdown::Both);
        }
        self.refuse_new("its reactor failed");
        now_ns() + self.shared.reg.limits().shutdown_grace_ms * NS_PER_MS
    }

    /// Closes connections handed over but not taken yet, with a log line.
    fn refuse_new(&mut self, why: &str) {
        while let Ok(nc) = self.rx.try_recv() {
            let peer = nc.stream.peer_addr().ok();
            tracing::warn!(reactor = self.id, ?peer, "closing new connection: {why}");
            self.shared.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The loop. Returns the shutdown deadline once drained or past it; Err
    /// when the socket engine cannot go on.
    fn serve(&mut self) -> Result<u64, String> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EPOLL_EVENTS];
        let mut shutdown_deadline: Option<u64> = None;
        // Busy time: loops that did work, measured from one loop's start to
        // the next (no extra clock read). Logged at exit, so a run can tell a
        // saturated reactor from one that only ran late in bursts.
        let (started_ns, mut prev_ns, mut prev_work, mut busy_ns) =
            (now_ns(), now_ns(), false, 0u64);
        let mut next_publish_ns = 0;
        // Durations of loops that did work: a long one delays every timer
        // and completion that falls due during it (emulated SSD lateness).
        let mut loop_hist = [0u64; crate::state::stats::LAT_BUCKETS];
        loop {
            let now = now_ns();
            if prev_work {
                let d = now.saturating_sub(prev_ns);
                busy_ns += d;
                loop_hist[crate::state::stats::lat_bucket(d)] += 1;
            }
            prev_ns = now;
            if now >= next_publish_ns {
                next_publish_ns = now + PUBLISH_NS;
                self.drop_removed_queues();
                self.apply_weights();
                if let Some(c) = self.shared.reg.reactor_busy_ns().get(self.id) {
                    c.0.store(busy_ns, Ordering::Relaxed);
                }
                if let Some(h) = self.shared.reg.reactor_loop_hist().get(self.id) {
                    for (a, &v) in h.iter().zip(&loop_hist) {
                        a.store(v, Ordering::Relaxed);
                    }
                }
            }
            if shutdown_deadline.is_none() && self.shared.shutdown.load(Ordering::Relaxed) {
                shutdown_deadline =
                    Some(now + self.shared.reg.limits().shutdown_grace_ms * NS_PER_MS);
            }
            if let Some(d) = shutdown_deadline {
                if self.drained() || now > d {
                    let wall_ns = now.saturating_sub(started_ns).max(1);
                    let (preempted, wait_ns) = cpu_contention().unwrap_or_default();
                    tracing::info!(
                        reactor = self.id,
                        "busy {:.1} % of {:.1} s (loops that did work); preempted {} times, {:.1} ms runnable but waiting for its CPU",
                        busy_ns as f64 * 100.0 / wall_ns as f64,
                        wall_ns as f64 / 1e9,
                        preempted,
                        wait_ns as f64 / 1e6
                    );
                    return Ok(d);
                }
            }
            let shutting = shutdown_deadline.is_some();
            let mut work = self.accept_new(now);
            if self.uring.is_some() {
                work |= self.uring_step(now, shutting)?;
            } else {
                work |= self.epoll_step(&mut events, now, shutting);
            }
            // After the socket step (which also hands the kernel the sends
            // queued last loop), before completions: see `drain.rs`.
            self.drain_step();
            work |= self.reap_backends(now);
            work |= self.reap_auth(now);
            work |= self.flush_all(now);
            self.run_timers(now);
            if work {
                self.last_work_ns = now;
            }
            prev_work = work;
        }
    }

    /// Closes this reactor's backend queues of namespaces removed from the
    /// set (`live`) once nothing is in flight on them, so a removed
    /// namespace's backend goes away. Called about once a millisecond: one
    /// load when nothing changed.
    fn drop_removed_queues(&mut self) {
        let gen = self.shared.reg.ns().gen();
        if gen == self.ns_gen {
            return;
        }
        let set = self.shared.reg.ns().load();
        let mut busy = false;
        for (uid, q) in self.queues.iter_mut().enumerate() {
            let Some(bq) = q else { continue };
            if set.by_uid(uid as u32).is_some() {
                continue;
            }
            if bq.in_flight() == 0 {
                *q = None;
            } else {
                busy = true; // looked at again next time
            }
        }
        if !busy {
            self.ns_gen = gen;
        }
    }

    /// Re-applies the tenant weights to this reactor's schedulers after a
    /// live change (`tenant_set_weight`): one load when nothing changed.
    fn apply_weights(&mut self) {
        let tenants = &self.shared.reg.tenants();
        let gen = tenants.weights_gen();
        if gen == self.weights_gen {
            return;
        }
        self.weights_gen = gen;
        let w = tenants.weights();
        for q in self.queues.iter_mut().flatten() {
            if let Some(qq) = q.qos() {
                qq.set_weights(&w);
            }
        }
    }

    /// epoll engine: wait (or poll) for readable sockets and receive.
    fn epoll_step(&mut self, events: &mut [libc::epoll_event], now: u64, shutting: bool) -> bool {
        let n = self.wait(events, now);
        let mut work = false;
        for ev in &events[..n] {
            work = true;
            if ev.u64 == WAKE_TOKEN {
                let mut v: u64 = 0;
                // SAFETY: reads 8 bytes into a live local u64 from our eventfd.
                unsafe { libc::read(self.wake_fd, &mut v as *mut u64 as *mut _, 8) };
                continue;
            }
            let idx = ev.u64 as usize;
            if ev.events & (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0
                && !shutting
            {
                self.receive(idx, now);
            }
        }
        work
    }

    /// Busy-polls (timeout 0) while there was recent work or backend I/O in
    /// flight; otherwise sleeps up to `idle_sleep_ms`.
    fn wait(&mut self, events: &mut [libc::epoll_event], now: u64) -> usize {
        let l = &self.shared.reg.limits();
        let spinning = now.saturating_sub(self.last_work_ns) < l.idle_spin_us * 1000;
        let in_flight = self.queues.iter().flatten().any(|q| q.in_flight() > 0);
        let timeout = if spinning || in_flight {
            0
        } else {
            // Sleep until the next connection deadline, at most idle_sleep_ms.
            let until_ms = self.timers.peek().map_or(u64::MAX, |Reverse((t, _, _))| {
                t.saturating_sub(now).div_ceil(NS_PER_MS)
            });
            until_ms.min(l.idle_sleep_ms) as i32
        };
        // SAFETY: the kernel writes at most events.len() entries into the
        // live slice; epfd is ours.
        let n = unsafe {
            libc::epoll_wait(self.epfd, events.as_mut_ptr(), events.len() as i32, timeout)
        };
        n.max(0) as usize
    }

    fn accept_new(&mut self, now: u64) -> bool {
        let mut any = false;
        while let Ok(nc) = self.rx.try_recv() {
            any = true;
            self.add(nc, now);
        }
        any
    }

    fn add(&mut self, nc: NewConn, now: u64) {
        let reg = self.shared.reg.clone();
        let (Ok(peer), Ok(local)) = (nc.stream.peer_addr(), nc.stream.local_addr()) else {
            self.shared.connections.fetch_sub(1, Ordering::Relaxed);
            return;
        };
        let Some(l) = reg.listeners().get(nc.listener) else {
            tracing::error!(%peer, "connection from unknown listener {}; closing", nc.listener);
            self.shared.connections.fetch_sub(1, Ordering::Relaxed);
            return;
        };
        let (kind, portid, secure) = (l.kind, l.portid, l.secure);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.conns.len() as u32 - 1
            }
        };
        let fd = nc.stream.as_raw_fd();
        let mut conn = Conn::new(idx, reg, peer, local, kind, portid, now);
        if secure.is_some() {
            let t = self.shared.reg.limits().tls_handshake_timeout_ms * NS_PER_MS;
            conn.tls_handshake_started(now, t);
        }
        if self.uring.is_none() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: idx as u64,
            };
            // SAFETY: ev is a live local the kernel only reads; fd is open.
            unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        }
        tracing::debug!(reactor = self.id, %peer, "connection accepted");
        // SAFETY: msghdr is plain C data; all-zero is a valid empty header.
        let msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        self.next_gen = self.next_gen.wrapping_add(1);
        self.conns[idx as usize] = Some(Entry {
            gen: self.next_gen,
            timer_at: u64::MAX,
            stream: nc.stream,
            _peer: nc.peer,
            conn,
            out_armed: false,
            recv_armed: false,
            send_armed: false,
            iov: Vec::with_capacity(MAX_IOV),
            msg,
            zombie: false,
            undecided: secure,
            peek: secure.map(|_| Box::new([0u8; 1])),
            tls: None,
            close_wait_since_ns: u64::MAX,
        });
        self.arm_timer(idx as usize);
    }

    fn ctx<'a>(
        queues: &'a mut Vec<Option<crate::data::nvme::exec::NsQueue>>,
        reg: &'a Registry,
        scratch: &'a mut Vec<u8>,
        auth: Option<&'a crate::data::nvme::auth_work::AuthPort>,
        now: u64,
    ) -> Ctx<'a> {
        Ctx {
            icd: &[],
            now_ns: now,
            queues,
            reg,
            scratch,
            auth,
        }
    }

    /// Closes a connection; one with backend requests in flight stays as a
    /// zombie (socket shut down) until they finish, because they write into
    /// its buffers.
    fn close(&mut self, idx: usize) {
        let Some(e) = self.conns[idx].as_mut() else {
            return;
        };
        if !e.zombie {
            let fd = e.stream.as_raw_fd();
            if self.uring.is_none() {
                // SAFETY: EPOLL_CTL_DEL reads no event; both fds are open.
                unsafe {
                    libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
                };
            }
            // Shutdown also completes any receive or send armed in io_uring.
            let _ = e.stream.shutdown(std::net::Shutdown::Both);
            e.zombie = true;
            e.conn.close_quietly("closing");
            tracing::debug!(peer = %e.conn.peer(), reason = e.conn.close_reason(), "connection closed");
        }
        if e.kernel_owned() {
            return;
        }
        e.conn.on_close();
        if let Some(c) = self
            .shared
            .reg
            .conn_closed()
            .get(e.conn.close_kind() as usize)
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.conns[idx] = None;
        self.free.push(idx as u32);
        self.shared.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How much other work took the calling thread's CPU: (involuntary context
/// switches, ns spent runnable but not running), from /proc/thread-self
/// (`status` and `schedstat`, Linux Documentation/scheduler/sched-stats.rst).
/// A spinning reactor is only ever switched out involuntarily, so these are the
/// times a kernel thread, an interrupt's deferred work or another process ran
/// on its CPU: each one delays every completion and timer that falls due
/// meanwhile. Read once, at exit; None where /proc does not say.
fn cpu_contention() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let preempted = status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()?;
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let wait_ns = schedstat.split_whitespace().nth(1)?.parse().ok()?;
    Some((preempted, wait_ns))
}

#[cfg(test)]
mod contention_tests {
    #[test]
    fn cpu_contention_reads_this_threads_switches_and_wait() {
        // Both /proc files parse: a renamed field or a moved column gives None,
        // and the reactor's exit line would then report zeros.
        assert!(super::cpu_contention().is_some());
    }
}
