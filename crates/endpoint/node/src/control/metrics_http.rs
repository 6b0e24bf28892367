//! The `/metrics` HTTP server: one thread, a poll loop over at most
//! [`MAX_CONNECTIONS`] open connections, each with a header deadline
//! ([`HEADER_TIMEOUT`]) and a bounded request size ([`MAX_REQUEST_BYTES`]);
//! one response per connection, then it closes.
//!
//! Why not a library: `tiny_http`, used before, gives every open connection
//! a thread of its own and has no header timeout: 300 idle connections made
//! 300 threads (issue 32). A scrape endpoint needs none of HTTP/1.1 beyond
//! one GET; this is the smallest server that bounds what a peer can hold.
//! When the connection table is full, a new connection evicts the one that
//! has waited longest for its request, so a flood of idle sockets cannot
//! keep a real scrape out.
//!
//! Access: the listener is what `[metrics] listen` says (there is no default
//! listener); a wildcard address is served with a warning. With `[metrics]
//! bearer_token_file`, a request must carry `Authorization: Bearer TOKEN`
//! (Prometheus's `bearer_token_file`), compared in constant time.

use super::metrics::{render, Sources, CONTENT_TYPE};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections open at once; one more evicts the oldest.
pub const MAX_CONNECTIONS: usize = 32;
/// A connection must have sent its whole request header by then.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request header accepted.
pub const MAX_REQUEST_BYTES: usize = 8 << 10;
/// Writing a response may block this long (a scraper that does not read).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the loop looks at the shutdown flag.
const POLL_MS: i32 = 100;

struct Conn {
    stream: TcpStream,
    since: Instant,
    buf: Vec<u8>,
}

/// Binds `addr` and serves `/metrics` until `shutdown` is raised. Returns
/// the bound address (port 0 picks one) and the server thread.
pub fn spawn(
    addr: SocketAddr,
    token: Option<String>,
    src: Sources,
    shutdown: Arc<AtomicBool>,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let l = TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
    l.set_nonblocking(true)?;
    let local = l.local_addr()?;
    if local.ip().is_unspecified() {
        tracing::warn!(
            "metrics on http://{local}/metrics: a wildcard address serves anyone who reaches this port; bind 127.0.0.1, or set [metrics] bearer_token_file{}",
            if token.is_some() { " (a bearer token is required)" } else { "" }
        );
    } else {
        tracing::info!("metrics on http://{local}/metrics");
    }
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(&l, token.as_deref(), &src, &shutdown))?;
    Ok((local, thread))
}

fn serve(l: &TcpListener, token: Option<&str>, src: &Sources, shutdown: &AtomicBool) {
    crate::sys::avoid_reactor_cpus(&src.reg.limits().cpus);
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut fds = Vec::with_capacity(MAX_CONNECTIONS + 1);
    while !shutdown.load(Relaxed) {
        fds.clear();
        fds.push(pollfd(l.as_raw_fd()));
        fds.extend(conns.iter().map(|c| pollfd(c.stream.as_raw_fd())));
        // SAFETY: fds is a live array of fds.len() pollfds that the kernel
        // fills in; every descriptor stays open until after the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, POLL_MS) };
        let now = Instant::now();
        if n > 0 {
            // Requests first (their indexes match `fds`), then new connections.
            let mut i = conns.len();
            while i > 0 {
                i -= 1;
                if fds[i + 1].revents != 0 && step(&mut conns[i], token, src) {
                    conns.swap_remove(i);
                }
            }
            if fds[0].revents != 0 {
                accept_all(l, &mut conns, now);
            }
        }
        conns.retain(|c| now.duration_since(c.since) < HEADER_TIMEOUT);
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn accept_all(l: &TcpListener, conns: &mut Vec<Conn>, now: Instant) {
    while let Ok((stream, _)) = l.accept() {
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if conns.len() == MAX_CONNECTIONS {
            // The one that has waited longest for its request goes.
            if let Some((oldest, _)) = conns.iter().enumerate().min_by_key(|(_, c)| c.since) {
                conns.swap_remove(oldest);
            }
        }
        conns.push(Conn {
            stream,
            since: now,
            buf: Vec::new(),
        });
    }
}

/// Reads what arrived; answers once the header is complete. True when the
/// connection is done (answered, closed by the peer, or refused).
fn step(c: &mut Conn, token: Option<&str>, src: &Sources) -> bool {
    let mut chunk = [0u8; 2048];
    match c.stream.read(&mut chunk) {
        Ok(0) => return true,
        Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
        Err(_) => return true,
    }
    if c.buf.len() > MAX_REQUEST_BYTES {
        respond(
            &mut c.stream,
            431,
            "request header too large\n",
            "text/plain",
        );
        return true;
    }
    let Some(end) = c.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&c.buf[..end]).into_owned();
    let (code, body, ctype) = answer(&head, token, src);
    respond(&mut c.stream, code, &body, ctype);
    true
}

/// The response to a request header: (status, body, content type).
fn answer(head: &str, token: Option<&str>, src: &Sources) -> (u16, String, &'static str) {
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    if let Some(want) = token {
        let given = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
            .map(|(_, v)| {
                v.trim()
                    .strip_prefix("Bearer ")
                    .unwrap_or("")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        use subtle::ConstantTimeEq;
        if !bool::from(given.as_bytes().ct_eq(want.as_bytes())) {
            return (
                401,
                "a bearer token is required ([metrics] bearer_token_file)\n".into(),
                "text/plain",
            );
        }
    }
    if method != "GET" {
        return (405, "only GET is served\n".into(), "text/plain");
    }
    if target.split('?').next() != Some("/metrics") {
        return (404, "see /metrics\n".into(), "text/plain");
    }
    match render(src) {
        Ok(body) => (200, body, CONTENT_TYPE),
        Err(e) => (500, format!("encoding failed: {e}\n"), "text/plain"),
    }
}

fn respond(s: &mut TcpStream, code: u16, body: &str, ctype: &str) {
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // A bounded blocking write: the response is small, the peer may be slow.
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    if let Err(e) = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body.as_bytes()))
    {
        tracing::debug!("metrics response not sent: {e}");
    }
}
