//! Null backend: writes are discarded and reads return zeroes. It measures
//! the target's own cost per I/O, like SPDK's null bdev.

use super::{Backend, BackendQueue, IoReq, Op, Tag};
use trellis_nvme::Status;

pub struct NullBackend {
    size_bytes: u64,
}

impl NullBackend {
    pub fn new(size_bytes: u64) -> NullBackend {
        NullBackend { size_bytes }
    }
}

impl Backend for NullBackend {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    /// Nothing is stored: any size serves.
    fn grow(&self, _bytes: u64) -> anyhow::Result<()> {
        Ok(())
    }
    fn reads_zero(&self) -> bool {
        true
    }
    fn synchronous(&self) -> bool {
        true
    }
    /// No drive: Gimbal's rate ceiling must not stand for one ([`super::NO_DRIVE_LINK_BYTES_PER_S`]).
    fn device_model(&self) -> Option<trellis_qos::DeviceModel> {
        Some(super::no_drive_model())
    }
    fn open_queue(&self) -> anyhow::Result<Box<dyn BackendQueue>> {
        Ok(Box::new(NullQueue))
    }
    fn describe(&self) -> String {
        format!("null {} bytes", self.size_bytes)
    }
}

struct NullQueue;

impl BackendQueue for NullQueue {
    fn completes_in_submit(&self) -> bool {
        true
    }
    /// Nothing is stored, so nothing is zeroed: the reactor's null queue is
    /// not wrapped in the chunking queue, and Dataset Management ends here.
    fn submit_ranges(
        &mut self,
        _op: Op,
        _ranges: &[(u64, u64)],
        _fua: bool,
        _tag: Tag,
    ) -> Option<Status> {
        Some(Status::SUCCESS)
    }
    unsafe fn submit(&mut self, req: &IoReq, _tag: Tag) -> Option<Status> {
        crate::sys::fault::io_panic_point();
        if req.op == Op::Read {
            // SAFETY: by this function's contract req.buf is valid for
            // len_bytes bytes and ours alone during the call.
            // Reads return zeroes; slot buffers are reused, so clear them.
            std::ptr::write_bytes(req.buf, 0, req.len_bytes as usize);
        }
        Some(Status::SUCCESS)
    }
}
