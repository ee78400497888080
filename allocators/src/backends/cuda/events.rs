//! [`CudaEvents`]: the events a stream-ordered allocator records on CUDA streams and polls.

use core::fmt;
use std::io;
use std::sync::Arc;

use cudarc::driver::sys;

use super::CudaDevice;
use super::driver::check;
use crate::{StreamEvents, StreamId};

/// Events on the streams of one device: `cuEventRecord` (timing off) to record,
/// `cuEventQuery` to poll, `cuEventSynchronize` to wait, for a
/// [`StreamOrderedBfc`](crate::StreamOrderedBfc).
#[derive(Debug, Clone)]
pub struct CudaEvents {
    device: Arc<CudaDevice>,
}

/// A recorded CUDA event.
#[derive(Debug)]
pub struct CudaEvent(sys::CUevent);

// SAFETY: a CUevent handle may be used from any thread with its context current (every call
// binds it first).
unsafe impl Send for CudaEvent {}

impl CudaEvents {
    /// Events of `device`'s streams.
    pub fn new(device: Arc<CudaDevice>) -> Self {
        Self { device }
    }

    fn io(&self, call: &'static str, r: sys::CUresult) -> io::Result<()> {
        check(call, self.device.ordinal(), r).map_err(io::Error::other)
    }
}

impl StreamEvents for CudaEvents {
    type Event = CudaEvent;

    fn record(&self, stream: StreamId) -> io::Result<CudaEvent> {
        self.device.bind().map_err(io::Error::other)?;
        let mut event: sys::CUevent = core::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `event` is a valid place; the context is current.
        self.io("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags) })?;
        // SAFETY: the event was created above; the stream handle is the caller's stream of this
        // device (`StreamId::LEGACY` is the null stream).
        let recorded = unsafe { sys::cuEventRecord(event, stream.raw() as sys::CUstream) };
        if let Err(e) = self.io("cuEventRecord", recorded) {
            // SAFETY: created above, recorded nowhere.
            unsafe { sys::cuEventDestroy_v2(event) };
            return Err(e);
        }
        Ok(CudaEvent(event))
    }

    fn query(&self, event: &CudaEvent) -> io::Result<bool> {
        self.device.bind().map_err(io::Error::other)?;
        // SAFETY: a live event of this device.
        match unsafe { sys::cuEventQuery(event.0) } {
            sys::cudaError_enum::CUDA_SUCCESS => Ok(true),
            sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            r => self.io("cuEventQuery", r).map(|()| false),
        }
    }

    fn wait(&self, event: &CudaEvent) -> io::Result<()> {
        self.device.bind().map_err(io::Error::other)?;
        // SAFETY: a live event of this device.
        self.io("cuEventSynchronize", unsafe { sys::cuEventSynchronize(event.0) })
    }

    fn destroy(&self, event: CudaEvent) {
        let _ = self.device.bind();
        // SAFETY: a live event, destroyed once (it is consumed).
        unsafe { sys::cuEventDestroy_v2(event.0) };
    }
}

impl fmt::Display for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaEvent({:p})", self.0)
    }
}
