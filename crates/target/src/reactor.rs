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
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(
                "cannot pin reactor to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
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
}

impl Reactor {
    fn new(id: usize, shared: Shared, rx: mpsc::Receiver<NewConn>, wake_fd: RawFd) -> Reactor {
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
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: idx as u64,
        };
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        tracing::debug!(reactor = self.id, %peer, "connection accepted");
        self.conns[idx as usize] = Some(Entry {
            stream: nc.stream,
            conn,
            out_armed: false,
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
            if !e.conn.tx.is_empty() && !e.zombie {
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
            unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
            let _ = e.stream.shutdown(std::net::Shutdown::Both);
            e.zombie = true;
            e.conn.close_quietly("closing");
            tracing::debug!(peer = %e.conn.peer, reason = e.conn.close_reason.as_deref().unwrap_or(""), "connection closed");
        }
        if e.conn.backend_in_flight > 0 {
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
                if let Some(e) = self.conns[idx].as_mut() {
                    e.conn.backend_in_flight = 0; // reactor is exiting: no more completions are reaped
                }
                self.close(idx);
            }
        }
        unsafe { libc::close(self.epfd) };
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
