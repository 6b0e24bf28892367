//! Reactors: one thread per core, each owning its connections for their whole
//! life (no cross-thread handoff on the data path).
//!
//! Each loop: take new connections, poll sockets with `epoll_wait` (timeout 0
//! while busy), receive and process PDUs, reap backend completions, then send
//! everything each connection has queued with one gathered `sendmsg`. After
//! `idle_spin_us` without work the reactor sleeps in `epoll_wait`, so an idle
//! target does not burn a core, while a busy one never pays a wake-up (about
//! 70 µs on these VMs) between I/Os.

use crate::backend::BackendQueue;
use crate::conn::{Conn, Ctx};
use crate::subsystem::Registry;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use trellis_nvme::Status;

/// Monotonic nanoseconds since the first call in this process.
pub fn now_ns() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

pub struct NewConn {
    pub stream: TcpStream,
    pub listener: usize,
}

pub struct ReactorHandle {
    pub tx: mpsc::Sender<NewConn>,
    wake_fd: RawFd,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

impl ReactorHandle {
    /// Hands a connection to the reactor and wakes it if it sleeps.
    pub fn give(&self, c: NewConn) {
        if self.tx.send(c).is_ok() {
            self.wake();
        }
    }
    pub fn wake(&self) {
        let one: u64 = 1;
        unsafe { libc::write(self.wake_fd, &one as *const u64 as *const _, 8) };
    }
}

impl Drop for ReactorHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        unsafe { libc::close(self.wake_fd) };
    }
}

const WAKE_TOKEN: u64 = u64::MAX;
/// Most iovecs per sendmsg (IOV_MAX is 1024; 256 already covers ~80 reads).
const MAX_IOV: usize = 256;
const TICK_NS: u64 = 1_000_000;

struct Entry {
    stream: TcpStream,
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
}

pub struct Shared {
    pub reg: Arc<Registry>,
    pub shutdown: Arc<AtomicBool>,
    pub connections: Arc<AtomicUsize>,
}

pub fn spawn(id: usize, cpu: Option<usize>, shared: Shared) -> std::io::Result<ReactorHandle> {
    let (tx, rx) = mpsc::channel();
    let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if wake_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let thread = std::thread::Builder::new()
        .name(format!("reactor-{id}"))
        .spawn(move || {
            if let Some(cpu) = cpu {
                pin_to_cpu(cpu);
            }
            let mut r = Reactor::new(id, shared, rx, wake_fd);
            r.run();
        })?;
    Ok(ReactorHandle {
        tx,
        wake_fd,
        thread: Some(thread),
    })
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
    conns: Vec<Option<Entry>>,
    free: Vec<u32>,
    queues: Vec<Option<Box<dyn BackendQueue>>>,
    scratch: Vec<u8>,
    iov: Vec<libc::iovec>,
    done: Vec<(u64, Status)>,
    last_work_ns: u64,
    last_tick_ns: u64,
    /// Some when the io_uring socket engine is in use; None means epoll + syscalls.
    uring: Option<crate::uring_net::UringNet>,
}

impl Reactor {
    fn new(id: usize, shared: Shared, rx: mpsc::Receiver<NewConn>, wake_fd: RawFd) -> Reactor {
        let shared_engine = shared.reg.limits.socket_engine;
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(
            epfd >= 0,
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        );
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: WAKE_TOKEN,
        };
        unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, wake_fd, &mut ev) };
        Reactor {
            id,
            shared,
            rx,
            wake_fd,
            epfd,
            conns: Vec::new(),
            free: Vec::new(),
            queues: Vec::new(),
            scratch: Vec::with_capacity(64 << 10),
            iov: Vec::with_capacity(MAX_IOV),
            done: Vec::with_capacity(1024),
            last_work_ns: 0,
            last_tick_ns: 0,
            uring: open_uring(id, shared_engine),
        }
    }

    fn run(&mut self) {
        let mut events: Vec<libc::epoll_event> = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        let mut shutdown_deadline: Option<u64> = None;
        loop {
            let now = now_ns();
            if shutdown_deadline.is_none() && self.shared.shutdown.load(Ordering::Relaxed) {
                shutdown_deadline =
                    Some(now + self.shared.reg.limits.shutdown_grace_ms * 1_000_000);
            }
            if let Some(d) = shutdown_deadline {
                if self.drained() || now > d {
                    break;
                }
            }
            let mut work = self.accept_new(now);
            if self.uring.is_some() {
                work |= self.uring_step(now, shutdown_deadline.is_some());
                work |= self.reap_backends();
                work |= self.flush_all(now);
                if now - self.last_tick_ns > TICK_NS {
                    self.tick(now);
                }
                if work {
                    self.last_work_ns = now;
                }
                continue;
            }
            let n = self.wait(&mut events, now);
            for ev in &events[..n] {
                work = true;
                if ev.u64 == WAKE_TOKEN {
                    let mut v: u64 = 0;
                    unsafe { libc::read(self.wake_fd, &mut v as *mut u64 as *mut _, 8) };
                    continue;
                }
                let idx = ev.u64 as usize;
                if ev.events & (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0
                    && shutdown_deadline.is_none()
                {
                    self.receive(idx, now);
                }
            }
            work |= self.reap_backends();
            work |= self.flush_all(now);
            if now - self.last_tick_ns > TICK_NS {
                self.tick(now);
            }
            if work {
                self.last_work_ns = now;
            }
        }
        self.close_all();
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
            l.idle_sleep_ms as i32
        };
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
        let l = &reg.listeners[nc.listener];
        let (kind, portid) = (l.kind, l.portid);
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.conns.len() as u32 - 1
            }
        };
        let fd = nc.stream.as_raw_fd();
        let conn = Conn::new(idx, reg, peer, local, kind, portid, now);
        if self.uring.is_none() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: idx as u64,
            };
            unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        }
        tracing::debug!(reactor = self.id, %peer, "connection accepted");
        let msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        self.conns[idx as usize] = Some(Entry {
            stream: nc.stream,
            conn,
            out_armed: false,
            recv_armed: false,
            send_armed: false,
            iov: Vec::with_capacity(MAX_IOV),
            msg,
            zombie: false,
        });
    }

    fn ctx<'a>(
        queues: &'a mut Vec<Option<Box<dyn BackendQueue>>>,
        reg: &'a Registry,
        scratch: &'a mut Vec<u8>,
        now: u64,
    ) -> Ctx<'a> {
        Ctx {
            now_ns: now,
            queues,
            reg,
            scratch,
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
        let space = e.conn.rx_space();
        if space.is_empty() {
            return; // parsing is stalled on output room; the socket keeps the bytes
        }
        let n = unsafe {
            libc::recv(
                fd,
                space.as_mut_ptr() as *mut _,
                space.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            e.conn.close_quietly("peer closed the connection");
            return;
        }
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                e.conn.close_quietly(&format!("recv: {err}"));
            }
            return;
        }
        e.conn.rx_commit(n as usize, now);
        // Borrow disjoint fields; no Arc clone (and no shared refcount traffic) per recv.
        let mut ctx = Self::ctx(&mut self.queues, &self.shared.reg, &mut self.scratch, now);
        e.conn.process(&mut ctx);
    }

    fn reap_backends(&mut self) -> bool {
        self.done.clear();
        for q in self.queues.iter_mut().flatten() {
            q.kick();
            q.reap(&mut self.done);
        }
        for &(tag, st) in &self.done {
            let (idx, slot) = ((tag >> 16) as usize, tag as u16);
            if let Some(e) = self.conns.get_mut(idx).and_then(|e| e.as_mut()) {
                e.conn.backend_done(slot, st);
            }
        }
        !self.done.is_empty()
    }

    /// Sends what each connection has queued (one sendmsg each), resumes
    /// parsing that stopped for lack of tx room, and closes finished ones.
    fn flush_all(&mut self, now: u64) -> bool {
        let mut work = false;
        for idx in 0..self.conns.len() {
            let Some(e) = self.conns[idx].as_mut() else {
                continue;
            };
            if let Some(u) = self.uring.as_mut() {
                // io_uring: queue the send; the completion advances tx.
                if !e.conn.tx.is_empty() && !e.zombie && !e.send_armed {
                    e.conn.tx_iovecs(&mut e.iov, MAX_IOV);
                    e.msg.msg_iov = e.iov.as_mut_ptr();
                    e.msg.msg_iovlen = e.iov.len() as _;
                    u.arm_send(idx, e.stream.as_raw_fd(), &*e.msg);
                    e.send_armed = true;
                    work = true;
                }
            } else if !e.conn.tx.is_empty() && !e.zombie {
                work |= send(e, &mut self.iov, self.epfd, idx);
                if e.conn.rx_pending() && e.conn.tx.has_room() {
                    let mut ctx =
                        Self::ctx(&mut self.queues, &self.shared.reg, &mut self.scratch, now);
                    e.conn.process(&mut ctx);
                    if !e.conn.tx.is_empty() {
                        send(e, &mut self.iov, self.epfd, idx);
                    }
                }
            }
            if e.conn.wants_close() || e.zombie {
                self.close(idx);
            }
        }
        work
    }

    fn tick(&mut self, now: u64) {
        self.last_tick_ns = now;
        for e in self.conns.iter_mut().flatten() {
            e.conn.tick(now);
            e.conn.flush_stats();
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
                unsafe {
                    libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
                };
            }
            // Shutdown also completes any receive or send armed in io_uring.
            let _ = e.stream.shutdown(std::net::Shutdown::Both);
            e.zombie = true;
            e.conn.close_quietly("closing");
            tracing::debug!(peer = %e.conn.peer, reason = e.conn.close_reason.as_deref().unwrap_or(""), "connection closed");
        }
        if e.conn.backend_in_flight > 0 || e.recv_armed || e.send_armed {
            return;
        }
        e.conn.on_close();
        self.conns[idx] = None;
        self.free.push(idx as u32);
        self.shared.connections.fetch_sub(1, Ordering::Relaxed);
    }

    fn drained(&self) -> bool {
        self.conns
            .iter()
            .flatten()
            .all(|e| e.conn.backend_in_flight == 0 && (e.conn.tx.is_empty() || e.zombie))
    }

    fn close_all(&mut self) {
        for idx in 0..self.conns.len() {
            if self.conns[idx].is_some() {
                self.close(idx);
            }
        }
        // io_uring operations write into connection buffers: wait (bounded)
        // for every armed one to complete before the buffers are freed.
        let deadline = now_ns() + 2_000_000_000;
        while self.uring.is_some()
            && now_ns() < deadline
            && self
                .conns
                .iter()
                .flatten()
                .any(|e| e.recv_armed || e.send_armed)
        {
            self.uring_step(now_ns(), true);
            for idx in 0..self.conns.len() {
                if self.conns[idx].is_some() {
                    self.close(idx);
                }
            }
        }
        for idx in 0..self.conns.len() {
            if self.conns[idx].is_some() {
                if let Some(e) = self.conns[idx].as_mut() {
                    // The reactor is exiting: no more completions will be reaped.
                    e.conn.backend_in_flight = 0;
                    e.recv_armed = false;
                    e.send_armed = false;
                }
                self.close(idx);
            }
        }
        unsafe { libc::close(self.epfd) };
    }
}

fn open_uring(
    id: usize,
    engine: crate::config::SocketEngine,
) -> Option<crate::uring_net::UringNet> {
    if engine != crate::config::SocketEngine::Uring {
        return None;
    }
    match crate::uring_net::UringNet::new(4096) {
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
    /// and keep one receive armed per live connection.
    fn uring_step(&mut self, now: u64, shutting: bool) -> bool {
        let l = &self.shared.reg.limits;
        let spinning = now.saturating_sub(self.last_work_ns) < l.idle_spin_us * 1000;
        let in_flight = self.queues.iter().flatten().any(|q| q.in_flight() > 0);
        let sleep = !spinning && !in_flight;
        let idle_ms = l.idle_sleep_ms;
        let wake_fd = self.wake_fd;
        let u = self.uring.as_mut().expect("uring engine");
        if !u.wake_armed {
            u.arm_wake(wake_fd);
        }
        if sleep && !u.timeout_armed {
            u.arm_timeout(idle_ms);
        }
        u.enter(sleep);
        let cqes = std::mem::take(&mut u.cqes);
        let mut work = false;
        for &(ud, res) in &cqes {
            let (idx, kind) = crate::uring_net::decode(ud);
            match kind {
                crate::uring_net::Kind::Wake => {
                    self.uring.as_mut().unwrap().wake_armed = false;
                    work = true;
                }
                crate::uring_net::Kind::Timeout => {
                    self.uring.as_mut().unwrap().timeout_armed = false
                }
                crate::uring_net::Kind::Recv => work |= self.on_recv_done(idx, res, now),
                crate::uring_net::Kind::Send => work |= self.on_send_done(idx, res, now),
            }
        }
        self.uring.as_mut().unwrap().cqes = cqes;
        if !shutting {
            self.arm_receives();
        }
        work
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
            e.conn.close_quietly("peer closed the connection");
        } else if res < 0 {
            if res != -libc::EAGAIN && res != -libc::EINTR && res != -libc::ECANCELED {
                e.conn.close_quietly(&format!(
                    "recv: {}",
                    std::io::Error::from_raw_os_error(-res)
                ));
            }
        } else {
            e.conn.rx_commit(res as usize, now);
            let mut ctx = Self::ctx(&mut self.queues, &self.shared.reg, &mut self.scratch, now);
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
            e.conn.close_quietly(&format!(
                "send: {}",
                std::io::Error::from_raw_os_error(-res)
            ));
            e.conn.on_send_failure();
            return false;
        }
        e.conn.tx_advance(res as usize);
        // Parsing may have stopped for lack of output room: resume it.
        if e.conn.rx_pending() && e.conn.tx.has_room() {
            let mut ctx = Self::ctx(&mut self.queues, &self.shared.reg, &mut self.scratch, now);
            e.conn.process(&mut ctx);
        }
        true
    }

    fn arm_receives(&mut self) {
        let u = self.uring.as_mut().expect("uring engine");
        for (idx, slot) in self.conns.iter_mut().enumerate() {
            let Some(e) = slot.as_mut() else { continue };
            if e.recv_armed || e.zombie || e.conn.state == crate::conn::State::Closing {
                continue;
            }
            let fd = e.stream.as_raw_fd();
            let space = e.conn.rx_space();
            if space.is_empty() {
                continue; // a zero-length receive would read as EOF
            }
            u.arm_recv(idx, fd, space);
            e.recv_armed = true;
        }
    }
}

/// One gathered sendmsg of everything queued (up to MAX_IOV pieces).
/// Returns whether bytes moved.
fn send(e: &mut Entry, iov: &mut Vec<libc::iovec>, epfd: RawFd, idx: usize) -> bool {
    e.conn.tx_iovecs(iov, MAX_IOV);
    if iov.is_empty() {
        return false;
    }
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    let n = unsafe {
        libc::sendmsg(
            e.stream.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::WouldBlock {
            arm_out(e, epfd, idx, true);
        } else {
            e.conn.close_quietly(&format!("send: {err}"));
            e.conn.on_send_failure();
        }
        return false;
    }
    e.conn.tx_advance(n as usize);
    arm_out(e, epfd, idx, !e.conn.tx.is_empty());
    n > 0
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
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, e.stream.as_raw_fd(), &mut ev) };
}
