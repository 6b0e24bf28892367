//! File descriptors for every connection the limits allow.
//!
//! Each NVMe/TCP queue pair is its own TCP connection, so a target serving
//! `target.max_connections` needs that many descriptors and a few more. Linux
//! starts processes with a soft RLIMIT_NOFILE of 1,024 (the hard limit is
//! usually far higher; systemd's default is 524,288, and our unit sets
//! 65,536), which would refuse connections long before `max_connections`.
//! Servers raise the soft limit themselves (nginx `worker_rlimit_nofile`,
//! SPDK at startup); so does the target, up to the hard limit, and says so
//! when even that is too low.

/// Descriptors besides connections: listeners, epoll and io_uring instances,
/// namespace files, the metrics and management sockets, logs.
pub const FD_RESERVE: u64 = 256;

/// What [`ensure_nofile`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoFile {
    /// Descriptors `max_connections` needs (with [`FD_RESERVE`]).
    pub wanted: u64,
    /// The soft limit now in force.
    pub soft: u64,
    pub hard: u64,
}

impl NoFile {
    pub fn enough(&self) -> bool {
        self.soft >= self.wanted
    }
}

/// Raises the soft RLIMIT_NOFILE to what `max_connections` needs, at most to
/// the hard limit; never lowers it. None if the limit cannot be read.
pub fn ensure_nofile(max_connections: usize) -> Option<NoFile> {
    let wanted = (max_connections as u64).saturating_add(FD_RESERVE);
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    // rlim_t is u64 on Linux (64-bit and 32-bit with large-file support).
    let (soft, hard): (u64, u64) = (r.rlim_cur, r.rlim_max);
    let target = wanted.min(hard);
    if target > soft {
        let new = libc::rlimit {
            rlim_cur: target,
            rlim_max: r.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit from a struct we own; raising
        // the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return Some(NoFile {
                wanted,
                soft: target,
                hard,
            });
        }
    }
    Some(NoFile { wanted, soft, hard })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After the call the soft limit covers the request (this test process
    /// asks for a small one), and a second call never lowers it.
    #[test]
    fn the_soft_limit_covers_the_connections_up_to_the_hard_limit() {
        let a = ensure_nofile(1_000).expect("getrlimit");
        assert_eq!(a.wanted, 1_000 + FD_RESERVE);
        assert!(a.soft >= a.wanted.min(a.hard), "{a:?}");
        let b = ensure_nofile(10).expect("getrlimit");
        assert_eq!(b.soft, a.soft, "a smaller request lowered the limit");
        assert!(b.enough());
        let huge = ensure_nofile(usize::MAX).expect("getrlimit");
        assert_eq!(huge.wanted, u64::MAX);
        assert!(!huge.enough());
        assert!(huge.soft <= huge.hard);
    }
}
