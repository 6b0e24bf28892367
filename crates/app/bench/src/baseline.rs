//! Raw TCP request/response baseline: what this machine's loopback can do
//! with the same bytes per I/O and the same queue depth as an NVMe/TCP run,
//! and no NVMe work at all. Both ends busy-poll non-blocking sockets with
//! one gathered `sendmsg` of everything pending and one large `recv` per
//! loop iteration, like the real data path (docs/bench.md).
//!
//! Wire format (ours, not NVMe): every request is a 72-byte header (the size
//! of a CapsuleCmd) — byte 0 kind (1 read, 2 write), bytes 4..8 payload
//! length — followed, for writes, by the payload. The server answers a read
//! with 24 + len + 24 bytes (C2HData header, data, CapsuleResp) and a write
//! with 24 bytes (CapsuleResp), all zeros.

use std::collections::VecDeque;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::report::Latency;

pub const REQ_HDR: usize = 72;
const RESP_HDR: usize = 24;
const KIND_READ: u8 = 1;
const KIND_WRITE: u8 = 2;
/// Receive staging on both ends: one `recv` may take everything pending
/// (128 KiB x QD8 writes are ~1 MiB in flight).
const STAGING: usize = 4 << 20;
/// Payload source: one small, cache-hot buffer that every iovec of a gathered
/// send points into, so no payload byte is generated per I/O.
const SRC: usize = 256 << 10;
/// iovecs per gathered send (SRC x MAX_IOV = 16 MiB per `sendmsg`).
const MAX_IOV: usize = 64;
/// Client SO_SNDBUF/SO_RCVBUF, the Trellis host's default (`sock_buf_bytes`);
/// the server, like the Trellis target, keeps the kernel's autotuning.
const CLIENT_SOCK_BUF: libc::c_int = 2 << 20;
/// Largest payload per request (keeps a hostile client from sizing our buffers).
const MAX_LEN: u32 = 16 << 20;

/// A zero-filled buffer with every page written once up front, so no page
/// fault or zero-page mapping happens inside a measured send or recv.
fn touched_zeros(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    for i in (0..n).step_by(4096) {
        // SAFETY: in bounds; volatile so the store is not elided.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0) };
    }
    v
}

fn set_sock_buf(fd: i32, bytes: libc::c_int) -> io::Result<()> {
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid int option value.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn nonblocking_recv(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid writable buffer.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(n as usize)
}

/// One gathered, non-blocking `sendmsg` of `len` bytes taken from `src`
/// (wrapping at its end, starting at `off`), in at most MAX_IOV iovecs.
fn gathered_send(fd: i32, src: &[u8], mut off: usize, len: usize) -> io::Result<usize> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_IOV];
    let (mut n, mut left) = (0usize, len);
    while left > 0 && n < MAX_IOV {
        off %= src.len();
        let c = left.min(src.len() - off);
        iov[n] = libc::iovec {
            iov_base: src[off..].as_ptr() as *mut libc::c_void,
            iov_len: c,
        };
        n += 1;
        off += c;
        left -= c;
    }
    // SAFETY: zeroed msghdr plus iovecs into live, readable buffers.
    let r = unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = iov.as_mut_ptr();
        m.msg_iovlen = n as _;
        libc::sendmsg(fd, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

/// Serves connections until killed; one busy-polling thread per connection.
pub fn serve(listen: &str) -> Result<()> {
    let l = TcpListener::bind(listen).with_context(|| format!("bind {listen}"))?;
    println!("baseline server listening on {}", l.local_addr()?);
    for s in l.incoming() {
        let s = s?;
        std::thread::spawn(move || {
            let _ = serve_conn(s);
        });
    }
    Ok(())
}

/// Per loop iteration: one gathered send of everything owed (headers,
/// payload and completions are all zeros, so they come from one source
/// buffer), then one large recv, then parsing of every complete request.
fn serve_conn(s: TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let fd = s.as_raw_fd();
    let zeros = touched_zeros(SRC);
    let mut st = touched_zeros(STAGING);
    let (mut head, mut tail, mut skip, mut pending_out) = (0usize, 0usize, 0usize, 0usize);
    loop {
        if pending_out > 0 {
            pending_out -= gathered_send(fd, &zeros, 0, pending_out)?;
        }
        // Whatever is left is a partial header (< REQ_HDR bytes): keep the
        // whole buffer free for the next recv.
        if head > 0 {
            st.copy_within(head..tail, 0);
            tail -= head;
            head = 0;
        }
        let n = nonblocking_recv(fd, &mut st[tail..])?;
        if n == 0 {
            continue;
        }
        tail += n;
        while head < tail {
            if skip > 0 {
                let n = skip.min(tail - head);
                head += n;
                skip -= n;
                continue;
            }
            if tail - head < REQ_HDR {
                break;
            }
            let kind = st[head];
            let len = u32::from_le_bytes(st[head + 4..head + 8].try_into().unwrap());
            if len > MAX_LEN || !(kind == KIND_READ || kind == KIND_WRITE) {
                return Err(io::ErrorKind::InvalidData.into());
            }
            head += REQ_HDR;
            if kind == KIND_WRITE {
                skip = len as usize;
                pending_out += RESP_HDR;
            } else {
                pending_out += 2 * RESP_HDR + len as usize;
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClientOpts {
    pub addr: String,
    pub bs: u32,
    pub iodepth: u32,
    pub write: bool,
    pub runtime: Duration,
    pub ramp: Duration,
}

#[derive(Clone, Debug, Serialize)]
pub struct ClientResult {
    pub bs: u32,
    pub iodepth: u32,
    pub write: bool,
    pub ios: u64,
    pub iops: f64,
    pub mib_per_s: f64,
    #[serde(flatten)]
    pub lat: Latency,
    pub idle_poll_pct: f64,
}

/// Runs the client side for ramp + runtime and measures the runtime part.
pub fn run_client(o: &ClientOpts) -> Result<ClientResult> {
    if o.iodepth == 0 || o.bs == 0 || o.bs > MAX_LEN {
        bail!("bad baseline parameters");
    }
    let s = connect_client(o)?;
    let fd = s.as_raw_fd();
    let (req_len, resp_len) = message_lens(o);
    let stream = request_stream(o, req_len);
    let mut rx = touched_zeros(STAGING);
    let mut hist = Histogram::<u64>::new_with_bounds(100, 60_000_000_000, 3)?;
    let mut t0s: VecDeque<Instant> = VecDeque::with_capacity(o.iodepth as usize);
    let (mut pos, mut out_pending, mut in_bytes) = (0usize, 0usize, 0usize);
    let (mut polls, mut idle) = (0u64, 0u64);
    let start = Instant::now();
    let measure_from = start + o.ramp;
    let end = measure_from + o.runtime;
    let mut measure_start = None;
    loop {
        let now = Instant::now();
        if measure_start.is_none() && now >= measure_from {
            measure_start = Some(now);
            hist.reset();
            polls = 0;
            idle = 0;
        }
        let issuing = now < end;
        if !issuing && t0s.is_empty() {
            break;
        }
        while issuing && t0s.len() < o.iodepth as usize {
            t0s.push_back(now);
            out_pending += req_len;
        }
        let mut moved = 0;
        if out_pending > 0 {
            let n = gathered_send(fd, &stream, pos, out_pending)?;
            pos = (pos + n) % stream.len();
            out_pending -= n;
            moved += n;
        }
        let n = nonblocking_recv(fd, &mut rx)?;
        moved += n;
        in_bytes += n;
        let done_at = Instant::now();
        while in_bytes >= resp_len {
            in_bytes -= resp_len;
            let t = t0s.pop_front().context("response without a request")?;
            if measure_start.is_some() && t >= measure_from {
                hist.saturating_record(done_at.saturating_duration_since(t).as_nanos() as u64);
            }
        }
        polls += 1;
        if moved == 0 {
            idle += 1;
        }
    }
    let secs = end
        .saturating_duration_since(measure_start.unwrap_or(end))
        .as_secs_f64()
        .max(1e-9);
    let ios = hist.len();
    Ok(ClientResult {
        bs: o.bs,
        iodepth: o.iodepth,
        write: o.write,
        ios,
        iops: ios as f64 / secs,
        mib_per_s: ios as f64 * o.bs as f64 / secs / (1 << 20) as f64,
        lat: Latency::from_hist(&hist),
        idle_poll_pct: 100.0 * idle as f64 / polls.max(1) as f64,
    })
}

/// The client's socket: connected, no Nagle, non-blocking, with its buffers.
fn connect_client(o: &ClientOpts) -> Result<TcpStream> {
    let s = TcpStream::connect(&o.addr).with_context(|| format!("connect {}", o.addr))?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    set_sock_buf(s.as_raw_fd(), CLIENT_SOCK_BUF).context("SO_SNDBUF/SO_RCVBUF")?;
    Ok(s)
}

/// Bytes of one request and of its response: the data travels with the write
/// request or with the read response.
fn message_lens(o: &ClientOpts) -> (usize, usize) {
    let req_len = REQ_HDR + if o.write { o.bs as usize } else { 0 };
    let resp_len = if o.write {
        RESP_HDR
    } else {
        2 * RESP_HDR + o.bs as usize
    };
    (req_len, resp_len)
}

/// A periodic request stream, built once: whole requests, about SRC bytes,
/// sent with wrap-around iovecs from `pos` (offset within the stream).
fn request_stream(o: &ClientOpts, req_len: usize) -> Vec<u8> {
    let reps = (SRC / req_len).max(1);
    let mut stream = touched_zeros(req_len * reps);
    for r in 0..reps {
        let h = &mut stream[r * req_len..];
        h[0] = if o.write { KIND_WRITE } else { KIND_READ };
        h[4..8].copy_from_slice(&o.bs.to_le_bytes());
    }
    stream
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_answers_with_exactly_the_nvme_tcp_byte_counts() {
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve_conn(l.accept().unwrap().0));
        let mut c = TcpStream::connect(addr).unwrap();
        let len = 300_000u32; // > SRC: the response wraps around the source buffer
        let mut req = Vec::new();
        for kind in [KIND_READ, KIND_WRITE, KIND_READ] {
            let mut h = [0u8; REQ_HDR];
            h[0] = kind;
            h[4..8].copy_from_slice(&len.to_le_bytes());
            req.extend_from_slice(&h);
            if kind == KIND_WRITE {
                req.extend(std::iter::repeat_n(7u8, len as usize));
            }
        }
        c.write_all(&req).unwrap();
        let want = 2 * (2 * RESP_HDR + len as usize) + RESP_HDR;
        let mut got = vec![1u8; want];
        c.read_exact(&mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0));
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut extra = [0u8; 1];
        assert!(
            c.read(&mut extra).is_err(),
            "no bytes beyond the modelled ones"
        );
    }

    #[test]
    fn client_and_server_complete_requests_for_reads_and_writes() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let s = s.unwrap();
                std::thread::spawn(move || serve_conn(s));
            }
        });
        for write in [false, true] {
            let r = run_client(&ClientOpts {
                addr: addr.clone(),
                bs: 16384,
                iodepth: 4,
                write,
                runtime: Duration::from_millis(200),
                ramp: Duration::from_millis(20),
            })
            .unwrap();
            assert!(r.ios > 0, "some requests completed");
            assert!(r.lat.lat_us_p50 > 0.0);
        }
    }
}
