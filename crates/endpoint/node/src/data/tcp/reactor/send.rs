//! Sending: the gathered sendmsg of a connection's iovecs, TLS records
//! (receive, drive, encrypt, send), and the EPOLLOUT interest.

use super::*;

/// epoll engine: one receive of ciphertext into the connection's TLS.
pub(super) fn tls_receive(e: &mut Entry, fd: RawFd) {
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
pub(super) fn tls_drive(e: &mut Entry, ctx: &mut Ctx) {
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
                if let Some(left_out) = e.conn.close_log() {
                    tracing::warn!(peer = %e.conn.peer(), left_out, "{err}; closing");
                }
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
                if let Some(left_out) = e.conn.close_log() {
                    tracing::warn!(peer = %e.conn.peer(), left_out, "{err}; closing");
                }
                e.conn.close_as(CloseKind::TransportError, &err.to_string());
            }
        }
    }
}

/// Encrypts what the connection queued, as far as the TLS output bound
/// allows (and `budget`, when set). Err: the record layer failed.
pub(super) fn tls_encrypt(e: &mut Entry, iov: &mut Vec<libc::iovec>, budget: usize) {
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
            if let Some(left_out) = e.conn.close_log() {
                tracing::warn!(peer = %e.conn.peer(), left_out, "{err}; closing");
            }
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
pub(super) fn tls_send(e: &mut Entry, epfd: RawFd, idx: usize) -> bool {
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
pub(super) fn cap_iovecs(iov: &mut Vec<libc::iovec>, budget: usize) {
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
pub(super) fn send(
    e: &mut Entry,
    iov: &mut Vec<libc::iovec>,
    epfd: RawFd,
    idx: usize,
    budget: usize,
) -> bool {
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
pub(super) fn send_failed(e: &mut Entry, epfd: RawFd, idx: usize) {
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
pub(super) fn arm_out(e: &mut Entry, epfd: RawFd, idx: usize, want: bool) {
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
