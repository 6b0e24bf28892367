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
use trellis_nvme::Status;

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
    done: Vec<(u64, Status)>,
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
        let engine = shared.reg.limits.socket_engine;
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
        now_ns() + self.shared.reg.limits.shutdown_grace_ms * NS_PER_MS
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
                if let Some(c) = self.shared.reg.reactor_busy_ns.get(self.id) {
                    c.0.store(busy_ns, Ordering::Relaxed);
                }
                if let Some(h) = self.shared.reg.reactor_loop_hist.get(self.id) {
                    for (a, &v) in h.iter().zip(&loop_hist) {
                        a.store(v, Ordering::Relaxed);
                    }
                }
            }
            if shutdown_deadline.is_none() && self.shared.shutdown.load(Ordering::Relaxed) {
                shutdown_deadline =
                    Some(now + self.shared.reg.limits.shutdown_grace_ms * NS_PER_MS);
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
        let gen = self.shared.reg.ns.gen();
        if gen == self.ns_gen {
            return;
        }
        let set = self.shared.reg.ns.load();
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
        let tenants = &self.shared.reg.tenants;
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
        let l = &self.shared.reg.limits;
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
        let Some(l) = reg.listeners.get(nc.listener) else {
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
            let t = self.shared.reg.limits.tls_handshake_timeout_ms * NS_PER_MS;
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

    /// One recv into the connection's buffer, then parse what arrived.
    fn receive(&mut self, idx: usize, now: u64) {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return;
        };
        if e.zombie {
            return;
        }
        let fd = e.stream.as_raw_fd();
        if e.undecided.is_some() {
            let mut b = [0u8; 1];
            // SAFETY: the kernel writes at most 1 byte into the live local.
            let n = unsafe {
                libc::recv(
                    fd,
                    b.as_mut_ptr() as *mut _,
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                recv_failed(e, n as i32, std::io::Error::last_os_error());
                return;
            }
            decide(&mut self.tls_server, &self.shared.reg, e, b[0]);
        }
        if e.tls.is_some() {
            tls_receive(e, fd);
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            tls_drive(e, &mut ctx);
            return;
        }
        let space = e.conn.rx_space();
        if space.is_empty() {
            return; // parsing is stalled on output room; the socket keeps the bytes
        }
        // SAFETY: the kernel writes at most space.len() bytes into the live,
        // exclusively borrowed slice; recv is synchronous.
        let n = unsafe {
            libc::recv(
                fd,
                space.as_mut_ptr() as *mut _,
                space.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            e.conn
                .close_as(CloseKind::PeerClosed, "peer closed the connection");
            return;
        }
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                e.conn
                    .close_as(CloseKind::TransportError, &format!("recv: {err}"));
            }
            return;
        }
        e.conn.rx_commit(n as usize);
        // Borrow disjoint fields; no Arc clone (and no shared refcount traffic) per recv.
        let mut ctx = Self::ctx(
            &mut self.queues,
            &self.shared.reg,
            &mut self.scratch,
            self.auth.as_ref(),
            now,
        );
        e.conn.process(&mut ctx);
    }

    /// Hands the DH workers' results to their connections.
    fn reap_auth(&mut self, now: u64) -> bool {
        let Some(port) = &self.auth else { return false };
        let mut done = std::mem::take(&mut self.auth_done);
        let any = port.mailbox.take(&mut done);
        for d in done.drain(..) {
            if let Some(e) = self.conns.get_mut(d.conn as usize).and_then(|e| e.as_mut()) {
                e.conn.auth_done(d.job, d.out, now);
            }
        }
        self.auth_done = done;
        any
    }

    fn reap_backends(&mut self, now: u64) -> bool {
        self.done.clear();
        for q in self.queues.iter_mut().flatten() {
            q.kick();
            q.reap(&mut self.done);
        }
        for &(tag, st) in &self.done {
            let (tag, credit) = crate::data::qos::split_tag(tag);
            let (idx, slot) = ((tag >> 16) as usize, tag as u16);
            if let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) {
                e.conn.backend_done(slot, st, credit, now);
            }
        }
        !self.done.is_empty()
    }

    /// Sends what each connection has queued (one sendmsg each), resumes
    /// parsing that stopped for lack of tx room, and closes finished ones.
    fn flush_all(&mut self, now: u64) -> bool {
        let mut work = false;
        let budget = self.shared.reg.limits.send_budget.0 as usize;
        for idx in 0..self.conns.len() {
            let Some(e) = self.conns[idx].as_mut() else {
                continue;
            };
            let mut close_now = false;
            // A connection's deadline can move earlier only through an event
            // that also queued output (a completion, Connect, Set Features),
            // so only those are re-armed: idle connections cost nothing here.
            let rearm = e.conn.has_output();
            if e.tls.is_some() {
                // TLS: encrypt what the connection queued, decrypt and parse
                // what waits for room, then send the ciphertext.
                tls_encrypt(e, &mut self.iov, budget);
                let has_input = e.tls.as_ref().is_some_and(|t| t.has_input());
                if has_input || e.conn.rx_pending() {
                    let mut ctx = Self::ctx(
                        &mut self.queues,
                        &self.shared.reg,
                        &mut self.scratch,
                        self.auth.as_ref(),
                        now,
                    );
                    if e.conn.rx_pending() {
                        e.conn.process(&mut ctx);
                    }
                    tls_drive(e, &mut ctx);
                    tls_encrypt(e, &mut self.iov, budget);
                }
                if let Some(u) = self.uring.as_mut() {
                    if let Some(t) = e.tls.as_mut() {
                        if t.has_output() && !e.zombie && !e.send_armed {
                            let b = t.send_buf();
                            e.iov.clear();
                            e.iov.push(libc::iovec {
                                iov_base: b.as_ptr() as *mut _,
                                iov_len: b.len(),
                            });
                            close_now |= !queue_send(u, self.id, idx, e);
                            work = true;
                        }
                    }
                } else if !e.zombie {
                    work |= tls_send(e, self.epfd, idx);
                }
            } else if let Some(u) = self.uring.as_mut() {
                // io_uring: queue the send; the completion advances tx.
                if e.conn.has_output() && !e.zombie && !e.send_armed {
                    e.conn.tx_iovecs(&mut e.iov, MAX_IOV);
                    cap_iovecs(&mut e.iov, budget);
                    close_now |= !queue_send(u, self.id, idx, e);
                    work = true;
                }
            } else if e.conn.has_output() && !e.zombie {
                work |= send(e, &mut self.iov, self.epfd, idx, budget);
                if e.conn.rx_pending() {
                    let mut ctx = Self::ctx(
                        &mut self.queues,
                        &self.shared.reg,
                        &mut self.scratch,
                        self.auth.as_ref(),
                        now,
                    );
                    e.conn.process(&mut ctx);
                    if e.conn.has_output() {
                        send(e, &mut self.iov, self.epfd, idx, budget);
                    }
                }
            }
            // A TLS connection closes once its ciphertext is out too (an
            // alert, a TermReq): its queued send completed (io_uring) or the
            // socket took it (epoll); or when the peer has taken none of it
            // for `send_stall_timeout_ms`, as plain output is dropped.
            let tls_pending =
                e.tls.as_ref().is_some_and(|t| t.has_output()) || (e.tls.is_some() && e.send_armed);
            let tls_done = !tls_pending || {
                let stall_ns = self.shared.reg.limits.send_stall_timeout_ms * NS_PER_MS;
                if e.close_wait_since_ns == u64::MAX && e.conn.wants_close() {
                    e.close_wait_since_ns = now;
                }
                now.saturating_sub(e.close_wait_since_ns) > stall_ns
                    && e.close_wait_since_ns != u64::MAX
            };
            if close_now || (e.conn.wants_close() && tls_done) || e.zombie {
                self.close(idx);
            } else if rearm {
                self.arm_timer(idx);
            }
        }
        work
    }

    /// Registers connection `idx`'s next deadline if it is earlier than the
    /// one already in the heap (a later one is found when the earlier pops).
    fn arm_timer(&mut self, idx: usize) {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return;
        };
        if let Some(t) = e.conn.next_timeout() {
            if t < e.timer_at {
                e.timer_at = t;
                self.timers.push(Reverse((t, idx as u32, e.gen)));
            }
        }
    }

    /// Fires the connection timers that are due.
    fn run_timers(&mut self, now: u64) {
        while let Some(&Reverse((t, idx, gen))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(e) = self.conns.get_mut(idx as usize).and_then(|e| e.as_mut()) else {
                continue;
            };
            if e.gen != gen {
                continue; // the connection this timer was for is gone
            }
            if e.timer_at == t {
                e.timer_at = u64::MAX;
            }
            e.conn.handle_timeout(now);
            if e.conn.has_pool_waiters() {
                let mut ctx = Self::ctx(
                    &mut self.queues,
                    &self.shared.reg,
                    &mut self.scratch,
                    self.auth.as_ref(),
                    now,
                );
                e.conn.pump_pool(&mut ctx);
            }
            self.arm_timer(idx as usize);
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
            .conn_closed
            .get(e.conn.close_kind() as usize)
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.conns[idx] = None;
        self.free.push(idx as u32);
        self.shared.connections.fetch_sub(1, Ordering::Relaxed);
    }

    fn drained(&self) -> bool {
        self.conns
            .iter()
            .flatten()
            .all(|e| e.conn.backend_in_flight() == 0 && (!e.has_output() || e.zombie))
    }

    /// Backend requests and connection socket operations the kernel still
    /// owns (the wake-up read and idle timeout do not count: they touch no
    /// connection memory).
    fn kernel_in_flight(&self) -> (usize, usize) {
        let queued: usize = self.queues.iter().flatten().map(|q| q.in_flight()).sum();
        let (mut backend, mut socket) = (0, 0);
        for e in self.conns.iter().flatten() {
            backend += e.conn.backend_in_flight();
            socket += usize::from(e.recv_armed) + usize::from(e.send_armed);
        }
        (backend.max(queued), socket)
    }

    /// Closes every connection. Memory the kernel may still write (slot
    /// buffers under backend I/O, receive buffers and msghdrs under socket
    /// operations) is freed only once its operation completed: in-flight
    /// backend I/O gets until `grace_deadline`, armed socket operations
    /// [`SOCKET_CLOSE_WAIT_NS`]; then both are cancelled and get
    /// [`CANCEL_WAIT_NS`]; what is still running then is leaked.
    fn close_all(&mut self, grace_deadline: u64) {
        self.refuse_new("the target is shutting down");
        for idx in 0..self.conns.len() {
            self.close(idx);
        }
        let settle = now_ns() + SOCKET_CLOSE_WAIT_NS;
        self.wait_in_flight(grace_deadline.max(settle));
        let (backend, socket) = self.kernel_in_flight();
        if backend + socket > 0 {
            let cancelled = self.cancel_in_flight();
            tracing::warn!(
                reactor = self.id,
                "shutdown grace expired with {backend} backend requests and {socket} socket \
                 operations in flight; {cancelled} cancellations issued"
            );
            self.wait_in_flight(now_ns() + CANCEL_WAIT_NS);
        }
        self.leak_stuck();
        // SAFETY: epfd is ours and no longer used by anything.
        unsafe { libc::close(self.epfd) };
    }

    /// Reaps completions (closing connections as they finish) until nothing
    /// is in flight or `deadline` passes.
    fn wait_in_flight(&mut self, deadline: u64) {
        loop {
            let (backend, socket) = self.kernel_in_flight();
            if backend + socket == 0 || now_ns() >= deadline {
                return;
            }
            let mut work = self.reap_backends(now_ns());
            if self.uring.is_some() {
                // A failing engine only means fewer completions seen here;
                // what stays in flight is leaked below.
                work |= self.uring_step(now_ns(), true).unwrap_or(false);
            }
            for idx in 0..self.conns.len() {
                self.close(idx);
            }
            if !work {
                std::thread::sleep(SHUTDOWN_POLL);
            }
        }
    }

    /// Issues IORING_OP_ASYNC_CANCEL for every backend request and armed
    /// socket operation; returns how many.
    fn cancel_in_flight(&mut self) -> usize {
        let mut n: usize = self
            .queues
            .iter_mut()
            .flatten()
            .map(|q| q.cancel_all())
            .sum();
        if let Some(u) = self.uring.as_mut() {
            for (idx, e) in self.conns.iter().enumerate() {
                let Some(e) = e else { continue };
                for (armed, k) in [(e.recv_armed, Kind::Recv), (e.send_armed, Kind::Send)] {
                    if armed && u.cancel(idx, k).is_ok() {
                        n += 1;
                    }
                }
            }
            let _ = u.enter(false);
        }
        n
    }

    /// Leaks the buffers of connections the kernel may still write into:
    /// freeing them would let a late completion corrupt reused memory.
    fn leak_stuck(&mut self) {
        for idx in 0..self.conns.len() {
            let Some(e) = self.conns[idx].as_ref() else {
                continue;
            };
            if e.kernel_owned() {
                tracing::error!(
                    reactor = self.id,
                    peer = %e.conn.peer(),
                    backend_requests = e.conn.backend_in_flight(),
                    recv_armed = e.recv_armed,
                    send_armed = e.send_armed,
                    "operations still in flight after cancellation: leaking this connection's \
                     buffers rather than freeing memory the kernel may write"
                );
                std::mem::forget(self.conns[idx].take());
                self.shared.connections.fetch_sub(1, Ordering::Relaxed);
            } else {
                self.close(idx);
            }
        }
    }
}

/// A socket operation could not be queued: close that connection only.
/// io_uring engine: queues one send of `e.iov` (plain: the connection's
/// iovecs; TLS: its ciphertext). False when it could not be queued: the
/// connection is then closing (`not_queued`).
fn queue_send(
    u: &mut crate::data::tcp::uring_net::UringNet,
    reactor: usize,
    idx: usize,
    e: &mut Entry,
) -> bool {
    e.msg.msg_iov = e.iov.as_mut_ptr();
    e.msg.msg_iovlen = e.iov.len() as _;
    match u.arm_send(idx, e.stream.as_raw_fd(), &*e.msg) {
        Ok(()) => {
            e.send_armed = true;
            true
        }
        Err(err) => {
            not_queued(reactor, e, "send", &err.0);
            false
        }
    }
}

fn not_queued(reactor: usize, e: &mut Entry, what: &str, err: &std::io::Error) {
    tracing::error!(reactor, peer = %e.conn.peer(), "closing connection: cannot queue its io_uring {what} ({err})");
    e.conn
        .close_quietly(&format!("io_uring {what} could not be submitted: {err}"));
}

fn open_uring(
    id: usize,
    engine: crate::config::SocketEngine,
) -> Option<crate::data::tcp::uring_net::UringNet> {
    if engine != crate::config::SocketEngine::Uring {
        return None;
    }
    match crate::data::tcp::uring_net::UringNet::new(SOCKET_RING_ENTRIES) {
        Ok(u) => Some(u),
        Err(e) => {
            tracing::warn!(
                reactor = id,
                "io_uring socket engine unavailable ({e}); using epoll"
            );
            None
        }
    }
}

impl Reactor {
    /// io_uring engine: submit queued work, wait if idle, handle completions,
    /// and keep one receive armed per live connection. Err when the engine
    /// cannot go on (a submit failed for good and no new ring opens).
    fn uring_step(&mut self, now: u64, shutting: bool) -> Result<bool, String> {
        let l = &self.shared.reg.limits;
        let spinning = now.saturating_sub(self.last_work_ns) < l.idle_spin_us * 1000;
        let in_flight = self.queues.iter().flatten().any(|q| q.in_flight() > 0);
        let sleep = !spinning && !in_flight;
        let idle_ms = l.idle_sleep_ms;
        let wake_fd = self.wake_fd;
        let Some(u) = self.uring.as_mut() else {
            return Ok(false);
        };
        if !u.wake_armed {
            u.arm_wake(wake_fd);
        }
        if sleep && !u.timeout_armed {
            u.arm_timeout(idle_ms);
        }
        u.enter(sleep)?;
        let mut cqes = std::mem::take(&mut u.cqes);
        let lost = std::mem::take(&mut u.lost);
        let mut work = !lost.is_empty();
        for &ud in &lost {
            self.on_lost(ud);
        }
        for &(ud, res) in &cqes {
            let (idx, kind) = crate::data::tcp::uring_net::decode(ud);
            match kind {
                Kind::Wake => {
                    if let Some(u) = self.uring.as_mut() {
                        u.wake_armed = false;
                    }
                    work = true;
                }
                Kind::Timeout => {
                    if let Some(u) = self.uring.as_mut() {
                        u.timeout_armed = false;
                    }
                }
                Kind::Cancel => {}
                Kind::Recv => work |= self.on_recv_done(idx, res, now),
                Kind::Send => work |= self.on_send_done(idx, res, now),
            }
        }
        if let Some(u) = self.uring.as_mut() {
            // Keep completions reaped meanwhile (by a retry inside a push).
            cqes.clear();
            cqes.append(&mut u.cqes);
            u.cqes = cqes;
        }
        if !shutting {
            self.arm_receives();
        }
        Ok(work)
    }

    /// A socket operation never reached the kernel (its ring was retired):
    /// it will never complete, so its connection is closed.
    fn on_lost(&mut self, ud: u64) {
        let (idx, kind) = crate::data::tcp::uring_net::decode(ud);
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return;
        };
        let what = match kind {
            Kind::Recv => {
                e.recv_armed = false;
                "receive"
            }
            Kind::Send => {
                e.send_armed = false;
                "send"
            }
            _ => return,
        };
        if !e.zombie {
            let err = std::io::Error::other("submit failed, ring retired");
            not_queued(self.id, e, what, &err);
        }
        self.close(idx);
    }

    fn on_recv_done(&mut self, idx: usize, res: i32, now: u64) -> bool {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return false;
        };
        e.recv_armed = false;
        if e.zombie {
            return false;
        }
        if res == 0 {
            e.conn
                .close_as(CloseKind::PeerClosed, "peer closed the connection");
        } else if res < 0 {
            if res != -libc::EAGAIN && res != -libc::EINTR && res != -libc::ECANCELED {
                e.conn.close_as(
                    CloseKind::TransportError,
                    &format!("recv: {}", std::io::Error::from_raw_os_error(-res)),
                );
            }
        } else if e.undecided.is_some() {
            // The peeked first byte: the bytes stay in the socket.
            let first = e.peek.as_ref().map_or(0, |b| b[0]);
            decide(&mut self.tls_server, &self.shared.reg, e, first);
        } else if let Some(t) = e.tls.as_mut() {
            t.cipher_in_commit(res as usize);
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            tls_drive(e, &mut ctx);
        } else {
            e.conn.rx_commit(res as usize);
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            e.conn.process(&mut ctx);
        }
        true
    }

    fn on_send_done(&mut self, idx: usize, res: i32, now: u64) -> bool {
        let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) else {
            return false;
        };
        e.send_armed = false;
        if e.zombie {
            return false;
        }
        if res < 0 {
            e.conn.close_as(
                CloseKind::TransportError,
                &format!("send: {}", std::io::Error::from_raw_os_error(-res)),
            );
            e.conn.on_send_failure();
            return false;
        }
        match e.tls.as_mut() {
            Some(t) => t.sent(res as usize),
            None => e.conn.tx_advance(res as usize),
        }
        // Parsing may have stopped for lack of output room: resume it.
        if e.conn.rx_pending() {
            let mut ctx = Self::ctx(
                &mut self.queues,
                &self.shared.reg,
                &mut self.scratch,
                self.auth.as_ref(),
                now,
            );
            e.conn.process(&mut ctx);
        }
        true
    }

    fn arm_receives(&mut self) {
        let Some(u) = self.uring.as_mut() else {
            return;
        };
        let mut failed = Vec::new(); // allocates only on failure
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            let Some(e) = slot.as_mut() else { continue };
            if e.recv_armed || e.zombie || e.conn.is_closing() {
                continue;
            }
            let fd = e.stream.as_raw_fd();
            let (space, flags) = if e.undecided.is_some() {
                match e.peek.as_mut() {
                    Some(b) => (&mut b[..], libc::MSG_PEEK),
                    None => continue,
                }
            } else if let Some(t) = e.tls.as_mut() {
                (t.cipher_in_space(), 0)
            } else {
                (e.conn.rx_space(), 0)
            };
            if space.is_empty() {
                continue; // a zero-length receive would read as EOF
            }
            match u.arm_recv_flags(idx, fd, space, flags) {
                Ok(()) => e.recv_armed = true,
                Err(err) => {
                    not_queued(self.id, e, "receive", &err.0);
                    failed.push(idx);
                }
            }
        }
        for idx in failed {
            self.close(idx);
        }
    }
}

/// A receive returned `n` <= 0: the peer closed, or the socket failed
/// (a would-block is nothing).
fn recv_failed(e: &mut Entry, n: i32, err: std::io::Error) {
    if n == 0 {
        e.conn
            .close_as(CloseKind::PeerClosed, "peer closed the connection");
    } else if err.kind() != std::io::ErrorKind::WouldBlock
        && err.kind() != std::io::ErrorKind::Interrupted
    {
        e.conn
            .close_as(CloseKind::TransportError, &format!("recv: {err}"));
    }
}

/// The first byte of a connection on a TLS listener decides: a TLS
/// handshake record (0x16) starts TLS; anything else is plain NVMe/TCP,
/// refused where the listener requires TLS.
fn decide(
    server: &mut Option<trellis_tls::ServerConfig>,
    reg: &Arc<Registry>,
    e: &mut Entry,
    first: u8,
) {
    let Some(mode) = e.undecided.take() else {
        return;
    };
    if first != 0x16 {
        if mode == SecureChannel::Required {
            tracing::warn!(peer = %e.conn.peer(), "plain NVMe/TCP on a listener with secure_channel = \"required\" (the host did not start TLS); closing");
            e.conn.close_as(
                CloseKind::ProtocolError,
                "TLS required: the host did not start a TLS handshake",
            );
        } else {
            e.conn.tls_not_used();
        }
        return;
    }
    if server.is_none() {
        match crate::data::tcp::tls::server_config(reg) {
            Ok(c) => *server = Some(c),
            Err(err) => {
                tracing::error!(peer = %e.conn.peer(), "cannot set up TLS: {err}; closing");
                e.conn
                    .close_as(CloseKind::Other, &format!("TLS setup failed: {err}"));
                return;
            }
        }
    }
    let Some(cfg) = server.as_ref() else { return };
    match trellis_tls::Tls::server(cfg) {
        Ok(t) => e.tls = Some(Box::new(t)),
        Err(err) => {
            tracing::error!(peer = %e.conn.peer(), "cannot start TLS: {err}; closing");
            e.conn
                .close_as(CloseKind::Other, &format!("TLS setup failed: {err}"));
        }
    }
}

/// epoll engine: one receive of ciphertext into the connection's TLS.
fn tls_receive(e: &mut Entry, fd: RawFd) {
    let Some(t) = e.tls.as_mut() else { return };
    let space = t.cipher_in_space();
    if space.is_empty() {
        return; // plaintext waits for room in the connection; the socket keeps the bytes
    }
    // SAFETY: the kernel writes at most space.len() bytes into the live,
    // exclusively borrowed slice; recv is synchronous.
    let n = unsafe {
        libc::recv(
            fd,
            space.as_mut_ptr() as *mut _,
            space.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n <= 0 {
        recv_failed(e, n as i32, std::io::Error::last_os_error());
        return;
    }
    t.cipher_in_commit(n as usize);
}

/// Runs the TLS handshake, then decrypts what was received into the
/// connection and lets it parse, as long as the connection has room.
fn tls_drive(e: &mut Entry, ctx: &mut Ctx) {
    let Some(t) = e.tls.as_mut() else { return };
    if !t.is_established() {
        match t.handshake() {
            Ok(false) => return,
            Ok(true) => {
                let (host, sub) = match t.peer_identity() {
                    Some(id) => (id.hostnqn.clone(), id.subnqn.clone()),
                    None => {
                        e.conn
                            .close_as(CloseKind::ProtocolError, "TLS without a PSK identity");
                        return;
                    }
                };
                tracing::info!(peer = %e.conn.peer(), host = %host, subsystem = %sub, cipher = t.cipher().unwrap_or("?"), "TLS 1.3 established");
                e.conn.tls_established(host, sub);
            }
            Err(err) => {
                tracing::warn!(peer = %e.conn.peer(), "{err}; closing");
                e.conn.close_as(CloseKind::ProtocolError, &err.to_string());
                return;
            }
        }
    }
    while !e.conn.is_closing() {
        let space = e.conn.rx_space();
        if space.is_empty() {
            break;
        }
        match t.read(space) {
            Ok(0) => break,
            Ok(n) => {
                e.conn.rx_commit(n);
                e.conn.process(ctx);
            }
            Err(trellis_tls::TlsError::Closed) => {
                e.conn
                    .close_as(CloseKind::PeerClosed, "peer closed the TLS session");
            }
            Err(err) => {
                tracing::warn!(peer = %e.conn.peer(), "{err}; closing");
                e.conn.close_as(CloseKind::TransportError, &err.to_string());
            }
        }
    }
}

/// Encrypts what the connection queued, as far as the TLS output bound
/// allows (and `budget`, when set). Err: the record layer failed.
fn tls_encrypt(e: &mut Entry, iov: &mut Vec<libc::iovec>, budget: usize) {
    let Some(t) = e.tls.as_mut() else { return };
    if !t.is_established() {
        return;
    }
    while e.conn.has_output() {
        let room = t.out_room();
        if room == 0 {
            break;
        }
        e.conn.tx_iovecs(iov, MAX_IOV);
        cap_iovecs(iov, if budget == 0 { room } else { room.min(budget) });
        if iov.is_empty() {
            break;
        }
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let pieces = iov.iter().map(|v| {
            // SAFETY: each iovec points into the connection's tx arena or a
            // slot buffer, listed by tx_iovecs just now; nothing modifies
            // them before tx_advance below, after this borrow ends.
            unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) }
        });
        let r = t.write(pieces);
        if let Err(err) = r {
            tracing::warn!(peer = %e.conn.peer(), "{err}; closing");
            e.conn.close_as(CloseKind::TransportError, &err.to_string());
            e.conn.on_send_failure();
            return;
        }
        e.conn.tx_advance(total);
        if budget != 0 {
            break;
        }
    }
}

/// epoll engine: sends the TLS ciphertext that waits. Returns whether
/// bytes moved.
fn tls_send(e: &mut Entry, epfd: RawFd, idx: usize) -> bool {
    let Some(t) = e.tls.as_mut() else {
        return false;
    };
    let fd = e.stream.as_raw_fd();
    let mut moved = false;
    while t.has_output() {
        let b = t.send_buf();
        // SAFETY: b is a live slice of ciphertext; send is synchronous.
        let n = unsafe {
            libc::send(
                fd,
                b.as_ptr() as *const _,
                b.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            send_failed(e, epfd, idx);
            return moved;
        }
        t.sent(n as usize);
        moved |= n > 0;
    }
    arm_out(e, epfd, idx, false);
    moved
}

/// Cuts `iov` after `budget` bytes (0: no bound); the rest stays queued for
/// the connection's next turn.
fn cap_iovecs(iov: &mut Vec<libc::iovec>, budget: usize) {
    if budget == 0 {
        return;
    }
    let mut sum = 0usize;
    for i in 0..iov.len() {
        let len = iov[i].iov_len;
        if sum + len >= budget {
            iov[i].iov_len = budget - sum;
            iov.truncate(i + 1);
            return;
        }
        sum += len;
    }
}

/// One gathered sendmsg of everything queued (up to MAX_IOV pieces and
/// `budget` bytes). Returns whether bytes moved.
fn send(e: &mut Entry, iov: &mut Vec<libc::iovec>, epfd: RawFd, idx: usize, budget: usize) -> bool {
    e.conn.tx_iovecs(iov, MAX_IOV);
    cap_iovecs(iov, budget);
    if iov.is_empty() {
        return false;
    }
    // SAFETY: msghdr is plain C data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: msg and the iovecs it points to are live for the synchronous
    // call, and each iovec points into the connection's tx or slot buffers,
    // which tx_iovecs just listed and nothing modifies meanwhile.
    let n = unsafe {
        libc::sendmsg(
            e.stream.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        send_failed(e, epfd, idx);
        return false;
    }
    e.conn.tx_advance(n as usize);
    arm_out(e, epfd, idx, e.conn.has_output());
    n > 0
}

/// A send returned -1 (errno still set): a full socket buffer waits for
/// writability; anything else closes the connection.
fn send_failed(e: &mut Entry, epfd: RawFd, idx: usize) {
    let err = std::io::Error::last_os_error();
    if err.kind() == std::io::ErrorKind::WouldBlock {
        arm_out(e, epfd, idx, true);
    } else {
        e.conn
            .close_as(CloseKind::TransportError, &format!("send: {err}"));
        e.conn.on_send_failure();
    }
}

/// Watches for writability only while output is stuck, so a sleeping
/// reactor wakes when the peer drains its receive buffer.
fn arm_out(e: &mut Entry, epfd: RawFd, idx: usize, want: bool) {
    if e.out_armed == want {
        return;
    }
    e.out_armed = want;
    let events = libc::EPOLLIN as u32 | if want { libc::EPOLLOUT as u32 } else { 0 };
    let mut ev = libc::epoll_event {
        events,
        u64: idx as u64,
    };
    // SAFETY: ev is a live local the kernel only reads; both fds are open.
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, e.stream.as_raw_fd(), &mut ev) };
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
