//! The C ABI that `c/engine.c` calls (declared in `c/trellis_fio.h`).
//!
//! Rules kept by every function here: no panic crosses into C (each body runs
//! under `catch_unwind` and a panic becomes an error return), every error
//! comes back as a return code plus a one-line message in the caller's
//! buffer, and nothing is allocated per I/O.

use crate::{Device, Done, IoKind, Spec, SubmitError};
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// An open device and its reusable completion list.
pub struct Handle {
    dev: Device,
    done: Vec<Done>,
}

const EINVAL: c_int = libc::EINVAL;
const EIO: c_int = libc::EIO;

/// Copies `msg` into the caller's buffer, truncated and NUL-terminated.
///
/// # Safety
/// `err` is null or valid for `len` bytes.
unsafe fn set_err(err: *mut c_char, len: usize, msg: &str) {
    if err.is_null() || len == 0 {
        return;
    }
    let n = msg.len().min(len - 1);
    // SAFETY: err is valid for len bytes (the caller's contract) and n < len.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// Runs `f`; a panic becomes `Err` with its message.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(format!("internal error (panic): {what}"))
    })
}

/// # Safety
/// `s` is a valid NUL-terminated string.
unsafe fn spec_of(s: *const c_char) -> Result<Spec, String> {
    if s.is_null() {
        return Err("no filename: name the target as filename=traddr=... trsvcid=...".into());
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| "filename is not UTF-8".to_string())?;
    Spec::parse(s)
}

/// Connects, identifies the namespace and disconnects: fio's setup step,
/// which must know each file's size before the jobs start.
///
/// # Safety
/// `filename` is NUL-terminated; the out pointers are valid; `err` as `set_err`.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_probe(
    filename: *const c_char,
    size_bytes: *mut u64,
    block_bytes: *mut u32,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    let r = guarded(|| {
        // SAFETY: forwarded caller contract (a NUL-terminated filename).
        let spec = unsafe { spec_of(filename) }?;
        let dev = Device::open(&spec, 1, 4096)?;
        let geometry = (dev.size_bytes(), dev.block_bytes());
        dev.close()?;
        Ok(geometry)
    });
    match r {
        Ok((size, block)) => {
            // SAFETY: the caller passes valid out pointers.
            unsafe {
                *size_bytes = size;
                *block_bytes = block;
            }
            0
        }
        Err(e) => {
            // SAFETY: err as the caller promised.
            unsafe { set_err(err, err_len, &e) };
            -EIO
        }
    }
}

/// Opens one device for one fio job: null (and a message) on failure.
///
/// # Safety
/// `filename` is NUL-terminated; `err` as `set_err`.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_open(
    filename: *const c_char,
    depth: u32,
    max_bs: u32,
    err: *mut c_char,
    err_len: usize,
) -> *mut Handle {
    let r = guarded(|| {
        // SAFETY: forwarded caller contract.
        let spec = unsafe { spec_of(filename) }?;
        let dev = Device::open(&spec, depth, max_bs)?;
        let done = Vec::with_capacity(dev.rows.len());
        Ok(Box::new(Handle { dev, done }))
    });
    match r {
        Ok(h) => Box::into_raw(h),
        Err(e) => {
            // SAFETY: err as the caller promised.
            unsafe { set_err(err, err_len, &e) };
            std::ptr::null_mut()
        }
    }
}

/// The namespace's size in bytes.
///
/// # Safety
/// `h` came from `trellis_fio_open` and is not closed.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_size(h: *const Handle) -> u64 {
    // SAFETY: a live handle (caller contract).
    unsafe { (*h).dev.size_bytes() }
}

/// Queues one I/O. `kind`: 0 read, 1 write, 2 flush. Returns 0 (queued),
/// 1 (busy: reap first), -EINVAL (bad I/O) or -EIO (queue failed).
///
/// # Safety
/// `h` is live; for read and write `buf` is valid for `len` bytes until the
/// I/O's completion is returned by `trellis_fio_reap`; `err` as `set_err`.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_submit(
    h: *mut Handle,
    kind: c_int,
    offset: u64,
    len: u64,
    buf: *mut u8,
    cookie: u64,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    let kind = match kind {
        0 => IoKind::Read,
        1 => IoKind::Write,
        2 => IoKind::Flush,
        k => {
            // SAFETY: err as the caller promised.
            unsafe { set_err(err, err_len, &format!("unknown I/O kind {k}")) };
            return -EINVAL;
        }
    };
    // SAFETY: a live handle; buf's validity is the caller's contract.
    let r = guarded(|| Ok(unsafe { (*h).dev.submit(kind, offset, len, buf, cookie) }));
    let (code, msg) = match r {
        Ok(Ok(())) => return 0,
        Ok(Err(SubmitError::Busy)) => return 1,
        Ok(Err(SubmitError::Invalid(m))) => (-EINVAL, m),
        Ok(Err(SubmitError::Failed(m))) | Err(m) => (-EIO, m),
    };
    // SAFETY: err as the caller promised.
    unsafe { set_err(err, err_len, &msg) };
    code
}

/// fio's commit: sends the queued commands now or leaves them for the next
/// reap ([`crate::Device::commit`]). 0 or -EIO.
///
/// # Safety
/// `h` is live; `err` as `set_err`.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_send(
    h: *mut Handle,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    // SAFETY: a live handle (caller contract).
    match guarded(|| unsafe { (*h).dev.commit() }) {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: err as the caller promised.
            unsafe { set_err(err, err_len, &e) };
            -EIO
        }
    }
}

/// Polls once; writes up to `max` finished I/Os as (cookie, result) pairs,
/// result 0 or the NVMe status (SCT << 8 | SC). Returns how many, or -EIO.
///
/// # Safety
/// `h` is live; `cookies` and `results` hold `max` entries; `err` as `set_err`.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_reap(
    h: *mut Handle,
    cookies: *mut u64,
    results: *mut i32,
    max: u32,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    let r = guarded(|| {
        // SAFETY: a live handle (caller contract).
        let h = unsafe { &mut *h };
        h.done.clear();
        // At most the list's capacity (the queue depth): no allocation.
        let max = (max as usize).min(h.done.capacity());
        let n = h.dev.reap(&mut h.done, max)?;
        for (i, d) in h.done.iter().enumerate() {
            // SAFETY: both arrays hold the caller's max ≥ n entries (contract).
            unsafe {
                *cookies.add(i) = d.cookie;
                *results.add(i) = d.result;
            }
        }
        Ok(n as c_int)
    });
    match r {
        Ok(n) => n,
        Err(e) => {
            // SAFETY: err as the caller promised.
            unsafe { set_err(err, err_len, &e) };
            -EIO
        }
    }
}

/// Waits for what is in flight and disconnects; frees the handle. 0 or -EIO.
///
/// # Safety
/// `h` came from `trellis_fio_open` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn trellis_fio_close(
    h: *mut Handle,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    if h.is_null() {
        return 0;
    }
    // SAFETY: the handle is ours to take back (caller contract).
    let h = unsafe { Box::from_raw(h) };
    match guarded(move || h.dev.close()) {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: err as the caller promised.
            unsafe { set_err(err, err_len, &e) };
            -EIO
        }
    }
}
