//! One queue pair on a non-blocking TCP socket: the engine plus a thin
//! busy-poll loop. Each [`Queue::poll`] does at most one gathered `sendmsg`
//! of everything queued and one large `recv`, then parses every PDU received.
//!
//! A `Queue` is `Send` and meant to be owned by exactly one reactor thread.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use trellis_nvme::Sqe;

use crate::engine::{Completion, Engine, EngineConfig, Xfer};
use crate::error::{Error, Result};

/// Most iovecs per sendmsg; the rest goes in the next call (IOV_MAX is 1024).
const MAX_IOV: usize = 256;
/// Check command timeouts at most this often while polling.
const TIMEOUT_CHECK_EVERY: Duration = Duration::from_millis(1);

/// Counters of the poll loop, for the "is the client the bottleneck" check.
#[derive(Clone, Copy, Debug, Default)]
pub struct PollStats {
    pub polls: u64,
    /// Polls that neither sent nor received a byte.
    pub idle_polls: u64,
    pub sendmsg_calls: u64,
    pub recv_calls: u64,
}

pub struct Queue {
    engine: Engine,
    sock: TcpStream,
    iov: Vec<libc::iovec>,
    last_timeout_check: Instant,
    /// Most bytes one poll receives (usize::MAX: whatever the engine has
    /// room for). A reactor that serves other queues between polls bounds
    /// this one's turn with it.
    recv_max: usize,
    pub stats: PollStats,
    /// TLS on this connection: the engine's PDUs are plaintext inside it.
    tls: Option<Box<trellis_tls::Tls>>,
}

// SAFETY: the iovec array only ever holds pointers into `engine`'s buffers
// while `flush` runs; between calls its contents are stale and never read.
unsafe impl Send for Queue {}

/// Socket options for a queue's connection.
#[derive(Clone, Debug)]
pub struct SockOpts {
    pub connect_timeout: Duration,
    /// SO_SNDBUF / SO_RCVBUF; 0 keeps the kernel's autotuning.
    pub sock_buf_bytes: usize,
    /// TLS 1.3 with this PSK before ICReq (None: plain TCP).
    pub tls: Option<trellis_tls::ClientConfig>,
}

pub fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(Error::Transport)?
        .next()
        .ok_or_else(|| Error::Transport(io::Error::new(io::ErrorKind::NotFound, addr.to_string())))
}

impl Queue {
    /// Opens the TCP connection and exchanges ICReq/ICResp.
    pub fn connect(addr: SocketAddr, cfg: EngineConfig, opts: SockOpts) -> Result<Queue> {
        let sock = TcpStream::connect_timeout(&addr, opts.connect_timeout).map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                Error::Timeout(format!("TCP connect to {addr}"))
            } else {
                Error::Transport(e)
            }
        })?;
        sock.set_nodelay(true)?;
        if opts.sock_buf_bytes > 0 {
            set_buf(&sock, opts.sock_buf_bytes)?;
        }
        let tls = match &opts.tls {
            None => None,
            Some(c) => {
                let mut t = trellis_tls::Tls::client(c)
                    .map_err(|e| Error::protocol(format!("TLS to {addr}: {e}")))?;
                let deadline = Instant::now() + opts.connect_timeout;
                trellis_tls::client_handshake(&mut t, &sock, deadline).map_err(|e| {
                    Error::Transport(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!("TLS to {addr} as {:?}: {e}", c.identity()),
                    ))
                })?;
                sock.set_read_timeout(None)?;
                Some(Box::new(t))
            }
        };
        sock.set_nonblocking(true)?;
        let mut q = Queue {
            engine: Engine::new(cfg),
            sock,
            iov: Vec::with_capacity(MAX_IOV),
            last_timeout_check: Instant::now(),
            recv_max: usize::MAX,
            stats: PollStats::default(),
            tls,
        };
        q.engine.start();
        let deadline = Instant::now() + opts.connect_timeout;
        while !q.engine.ic_done() {
            q.poll_once(Instant::now())?;
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!("ICResp from {addr}")));
            }
            std::thread::yield_now();
        }
        Ok(q)
    }

    /// A queue that never connected, failed from the start: a place holder
    /// for a path that is down when its owner starts, which replaces it once
    /// the path comes up. `queue_size` slots (tiny buffers), no peer.
    pub fn dead(queue_size: u16) -> Result<Queue> {
        // SAFETY: socket(2) returns a new descriptor that the TcpStream then
        // owns (and closes); an unconnected socket makes every call fail.
        let sock = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(Error::Transport(io::Error::last_os_error()));
            }
            <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd)
        };
        let cfg = EngineConfig {
            queue_size: queue_size.max(2),
            buf_bytes: 4096,
            staging_bytes: 4096,
            max_pdu_bytes: 4096 + 512,
            ..EngineConfig::default()
        };
        let mut q = Queue {
            engine: Engine::new(cfg),
            sock,
            iov: Vec::new(),
            last_timeout_check: Instant::now(),
            recv_max: usize::MAX,
            stats: PollStats::default(),
            tls: None,
        };
        let _ = q
            .engine
            .fail_with(Error::protocol("path down since the start"));
        Ok(q)
    }

    /// Ends the connection at once and discards what the kernel still holds
    /// to send. Multipath failover needs this before it re-sends a path's
    /// commands elsewhere: a plain close would let the kernel go on
    /// delivering queued bytes (a write command and its data) once the link
    /// returns, and that stale write would land after newer ones sent on
    /// another path. SO_LINGER 0 makes the close a reset that drops the send
    /// queue; the descriptor is then pointed at a fresh unconnected socket,
    /// so later calls on this queue fail instead of reaching anything.
    pub fn abort(&mut self) {
        let fd = self.sock.as_raw_fd();
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt with a valid linger struct and its size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &linger as *const libc::linger as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        // SAFETY: socket(2) creates a new descriptor we own; dup2 atomically
        // closes our connected socket (the reset, send queue dropped) and
        // reuses its number for the fresh one, which the TcpStream then owns
        // and closes on drop; the temporary descriptor is closed here.
        unsafe {
            let fresh = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fresh >= 0 {
                libc::dup2(fresh, fd);
                libc::close(fresh);
            } else {
                // Out of descriptors: at least stop both directions.
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
        let _ = self
            .engine
            .fail_with(Error::protocol("queue aborted by its owner"));
    }

    /// Bounds the bytes one poll receives (at least one PDU header's worth).
    pub fn set_recv_max(&mut self, bytes: usize) {
        self.recv_max = bytes.max(128);
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    // Thin forwards so reactor code reads naturally.
    pub fn alloc(&mut self) -> Option<u16> {
        self.engine.alloc()
    }
    pub fn free(&mut self, slot: u16) {
        self.engine.free(slot)
    }
    pub fn buf(&self, slot: u16) -> &[u8] {
        self.engine.buf(slot)
    }
    pub fn buf_mut(&mut self, slot: u16) -> &mut [u8] {
        self.engine.buf_mut(slot)
    }
    pub fn submit(&mut self, slot: u16, sqe: Sqe, xfer: Xfer, now: Instant) -> Result<()> {
        self.engine.submit(slot, sqe, xfer, ns_of(now))
    }
    pub fn next_completion(&mut self) -> Option<Completion> {
        self.engine.next_completion()
    }

    /// One reactor iteration: flush, receive once, parse, check timeouts.
    /// Returns the number of completions now waiting.
    pub fn poll(&mut self, now: Instant) -> Result<usize> {
        self.poll_once(now)?;
        if now.saturating_duration_since(self.last_timeout_check) >= TIMEOUT_CHECK_EVERY {
            self.last_timeout_check = now;
            self.engine.check_timeouts(ns_of(now))?;
        }
        Ok(self.engine.completions_pending())
    }

    fn poll_once(&mut self, now: Instant) -> Result<()> {
        self.engine.check()?;
        self.stats.polls += 1;
        let sent = self.flush().map_err(|e| self.engine.fail_with(e))?;
        let got = self.recv(now)?;
        if sent == 0 && got == 0 {
            self.stats.idle_polls += 1;
        }
        Ok(())
    }

    /// One gathered sendmsg of queued output. Returns bytes sent.
    pub fn flush(&mut self) -> Result<usize> {
        if self.tls.is_some() {
            return self.flush_tls();
        }
        if !self.engine.has_output() {
            return Ok(0);
        }
        self.engine.output_iovecs(&mut self.iov, MAX_IOV);
        // SAFETY: msghdr is plain data; iov points into engine buffers that
        // are not touched until sendmsg returns.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = self.iov.as_mut_ptr();
            msg.msg_iovlen = self.iov.len() as _;
            libc::sendmsg(
                self.sock.as_raw_fd(),
                &msg,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        self.stats.sendmsg_calls += 1;
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(Error::Transport(e));
        }
        self.engine.sent(n as usize);
        Ok(n as usize)
    }

    /// TLS: encrypts the engine's output (bounded by the TLS output room),
    /// then one send of the ciphertext waiting. Returns bytes sent.
    fn flush_tls(&mut self) -> Result<usize> {
        let Some(t) = self.tls.as_mut() else {
            return Ok(0);
        };
        while self.engine.has_output() && t.out_room() > 0 {
            self.engine.output_iovecs(&mut self.iov, MAX_IOV);
            let mut total = 0usize;
            let room = t.out_room();
            let pieces = self.iov.iter().map_while(|v| {
                if total >= room {
                    return None;
                }
                let n = v.iov_len.min(room - total);
                total += n;
                // SAFETY: the iovecs point into engine buffers listed just
                // now; nothing touches them before `sent` below.
                Some(unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, n) })
            });
            t.write(pieces)
                .map_err(|e| Error::Transport(io::Error::other(e.to_string())))?;
            if total == 0 {
                break;
            }
            self.engine.sent(total);
        }
        if !t.has_output() {
            return Ok(0);
        }
        let b = t.send_buf();
        // SAFETY: b is a live slice of ciphertext; send is synchronous.
        let n = unsafe {
            libc::send(
                self.sock.as_raw_fd(),
                b.as_ptr() as *const libc::c_void,
                b.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        self.stats.sendmsg_calls += 1;
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(Error::Transport(e));
        }
        t.sent(n as usize);
        Ok(n as usize)
    }

    /// TLS: one recv of ciphertext, then every record decrypted into the
    /// engine as it has room.
    fn recv_tls(&mut self, now: Instant) -> Result<usize> {
        let fd = self.sock.as_raw_fd();
        let Some(t) = self.tls.as_mut() else {
            return Ok(0);
        };
        let space = t.cipher_in_space();
        let mut got = 0usize;
        if !space.is_empty() {
            let len = space.len().min(self.recv_max);
            // SAFETY: `space` is a valid writable slice of at least `len` bytes.
            let n = unsafe {
                libc::recv(
                    fd,
                    space.as_mut_ptr() as *mut libc::c_void,
                    len,
                    libc::MSG_DONTWAIT,
                )
            };
            self.stats.recv_calls += 1;
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                    return Err(self.engine.fail_with(Error::Transport(e)));
                }
            } else if n == 0 {
                let e = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "controller closed the connection",
                );
                return Err(self.engine.fail_with(Error::Transport(e)));
            } else {
                t.cipher_in_commit(n as usize);
                got = n as usize;
            }
        }
        loop {
            let space = self.engine.recv_space();
            if space.is_empty() {
                break;
            }
            let n = match t.read(space) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let e = io::Error::new(io::ErrorKind::ConnectionAborted, e.to_string());
                    return Err(self.engine.fail_with(Error::Transport(e)));
                }
            };
            self.engine.recv_done(n, ns_of(now))?;
        }
        Ok(got)
    }

    /// One recv into staging (or straight into a payload buffer), then parse.
    fn recv(&mut self, now: Instant) -> Result<usize> {
        if self.tls.is_some() {
            return self.recv_tls(now);
        }
        let fd = self.sock.as_raw_fd();
        let space = self.engine.recv_space();
        let space_len = space.len().min(self.recv_max);
        // SAFETY: `space` is a valid writable slice for its length, and
        // `space_len` is at most that.
        let n = unsafe {
            libc::recv(
                fd,
                space.as_mut_ptr() as *mut libc::c_void,
                space_len,
                libc::MSG_DONTWAIT,
            )
        };
        self.stats.recv_calls += 1;
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(self.engine.fail_with(Error::Transport(e)));
        }
        if n == 0 {
            let e = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "controller closed the connection",
            );
            return Err(self.engine.fail_with(Error::Transport(e)));
        }
        self.engine.recv_done(n as usize, ns_of(now))?;
        Ok(n as usize)
    }

    /// Runs one command to completion (admin path, setup): submit, then poll
    /// until its completion arrives. Other completions are left queued.
    pub fn exec(&mut self, sqe: Sqe, xfer: Xfer, data: &[u8]) -> Result<(Completion, u16)> {
        let slot = self
            .alloc()
            .ok_or_else(|| Error::protocol("no free command slot for a synchronous command"))?;
        let room = self.buf(slot).len();
        if data.len() > room {
            self.free(slot);
            return Err(Error::Usage(format!(
                "{} bytes of command data do not fit this queue's {room}-byte buffers",
                data.len()
            )));
        }
        self.buf_mut(slot)[..data.len()].copy_from_slice(data);
        let r = self.exec_slot(slot, sqe, xfer);
        if r.is_err() && self.engine.check().is_ok() {
            // Still on the wire only if it timed out, and then the queue failed.
            self.free(slot);
        }
        r.map(|c| (c, slot))
    }

    fn exec_slot(&mut self, slot: u16, sqe: Sqe, xfer: Xfer) -> Result<Completion> {
        self.submit(slot, sqe, xfer, Instant::now())?;
        let mut spins = 0u32;
        loop {
            let now = Instant::now();
            self.poll(now)?;
            // Completions are FIFO; ours is found and others kept in order.
            let n = self.engine.completions_pending();
            for _ in 0..n {
                let Some(c) = self.engine.next_completion() else {
                    break;
                };
                if c.slot == slot {
                    return Ok(c);
                }
                self.requeue(c);
            }
            spins += 1;
            if spins > 64 {
                // Setup commands are not latency critical; let the peer run.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn requeue(&mut self, c: Completion) {
        self.engine.push_completion(c);
    }

    /// Convenience for setup code: exec and turn a non-success status into an
    /// error, freeing the slot. Returns DW0 and a copy of the first `out.len()`
    /// bytes of read data.
    pub fn exec_ok(
        &mut self,
        sqe: Sqe,
        xfer: Xfer,
        data: &[u8],
        out: &mut [u8],
    ) -> Result<Completion> {
        let (c, slot) = self.exec(sqe, xfer, data)?;
        let n = out.len();
        out.copy_from_slice(&self.buf(slot)[..n]);
        self.free(slot);
        if !c.status.is_success() {
            return Err(Error::Nvme(c.status));
        }
        Ok(c)
    }
}

fn set_buf(sock: &TcpStream, bytes: usize) -> Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid int option value.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(Error::Transport(io::Error::last_os_error()));
        }
    }
    Ok(())
}

use trellis_units::clock::instant_ns as ns_of;
/// The process's monotonic clock in ns, the time base the sans-IO engine
/// takes (its own tests and the simulator pass theirs): the one clock and
/// epoch of the process, shared with the node (`trellis_units::clock`).
pub use trellis_units::clock::now_ns;
