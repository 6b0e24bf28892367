//! Leaves every wing may use: the clock, locks, CPU placement, hex ids,
//! and the io_uring ring, resource limits and fault-injection points. Nothing
//! here imports another module of this crate except its own submodules.

pub mod fault;
pub mod latency;
pub mod loglimit;
pub mod ring;
pub mod rlimit;
pub mod thermal;

/// Locks a mutex whether or not it is poisoned. A poisoned lock means a
/// reactor panicked while holding it; that reactor's failure already stops
/// the target with an error, and the guarded data (controller maps, error
/// logs, feature values) stay usable for the other reactors to finish their
/// in-flight commands and tear down cleanly, so recovering the guard beats
/// spreading the panic to every thread that touches the lock.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses `len` bytes written as hex digits, with optional `-` or `:`
/// separators (nvme-cli prints NGUID and EUI-64 as plain hex).
pub fn parse_hex_id(text: &str, len: usize) -> Result<Vec<u8>, String> {
    let digits: String = text.chars().filter(|c| *c != '-' && *c != ':').collect();
    if digits.len() != 2 * len || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("must be {} hex digits", 2 * len));
    }
    let bytes: Vec<u8> = (0..len)
        .map(|i| u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect();
    if bytes.iter().all(|&b| b == 0) {
        return Err("must not be all zeroes (zero means \"not reported\")".into());
    }
    Ok(bytes)
}

/// The process's one monotonic clock (shared with the host library): every
/// `*_ns` time of the node counts from its epoch.
pub use trellis_units::clock::{instant_ns, now_ns};

/// The CPUs this process may run on (`sched_getaffinity`), ascending; None
/// when the kernel does not say.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's own size.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return None;
    }
    // SAFETY: every cpu < CPU_SETSIZE is within the set.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// CPUs as a list of ranges, as `taskset -c` reads them: "0-3,6".
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => cpus[i].to_string(),
            1 => format!("{},{}", cpus[i], cpus[j]),
            _ => format!("{}-{}", cpus[i], cpus[j]),
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Keeps the calling helper thread (acceptor, metrics) off the CPUs that
/// reactors are pinned to, so its wake-ups never preempt a busy-polling
/// reactor. Nothing changes when no reactor is pinned, or when the pinned
/// CPUs are all the process may use.
pub(crate) fn avoid_reactor_cpus(pinned: &[usize]) {
    if pinned.is_empty() {
        return;
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is the set's own size.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return;
    }
    let mut left = 0;
    for cpu in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: cpu < CPU_SETSIZE, within the set.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            if pinned.contains(&cpu) {
                // SAFETY: as above.
                unsafe { libc::CPU_CLR(cpu, &mut set) };
            } else {
                left += 1;
            }
        }
    }
    if left == 0 {
        return;
    }
    // SAFETY: a valid set of the right size for this thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        tracing::debug!("could not keep a helper thread off the reactor CPUs");
    }
}
