//! The CUDA devices of the global registry (feature `cuda`): `cuda:N` (stream-ordered BFC
//! arenas over expandable device memory), `cuda_async:N` (CUDA's stream-ordered pool),
//! `cuda_host` (pinned host memory), registered at [`DEVICE_PRIORITY`](crate::DEVICE_PRIORITY) when a driver and devices
//! are present; and the devices' free/total memory for telemetry.

use std::sync::{Arc, OnceLock};

use crate::allocators::cuda::{
    CudaAsyncAllocator, CudaDevice, CudaEvents, CudaHostAllocator, CudaSubAllocator, device_count,
};
use crate::allocators::{Allocator, BfcAllocator, StreamOrderedBfc};
use crate::{AllocConf, RegistryError};

/// The devices opened by the global registry.
static DEVICES: OnceLock<Vec<Arc<CudaDevice>>> = OnceLock::new();

/// The devices the global registry opened (none without a driver or before it is first used).
pub fn devices() -> &'static [Arc<CudaDevice>] {
    DEVICES.get().map_or(&[], Vec::as_slice)
}

/// Registry entries: a name and an allocator.
pub(crate) type Entries = Vec<(String, Arc<dyn Allocator>)>;

/// The allocators for every device, and the errors met making them.
pub(crate) fn entries(conf: &AllocConf) -> (Entries, Vec<RegistryError>) {
    let mut out: Entries = Vec::new();
    let mut errors = Vec::new();
    let mut opened = Vec::new();
    for ordinal in 0..device_count() {
        let device = match CudaDevice::open(ordinal) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(%e, "tensormem: CUDA device not registered");
                continue;
            }
        };
        let total = device.memory_info().map(|(_, t)| t).unwrap_or(0);
        let limit = conf.cuda_limit(total);
        let template = BfcAllocator::builder()
            .name(format!("cuda:{ordinal}"))
            .memory_limit(limit)
            .allow_growth(true)
            .sub_allocator(Arc::new(CudaSubAllocator::new(device.clone())));
        match StreamOrderedBfc::new(template, CudaEvents::new(device.clone())) {
            Ok(b) => out.push((format!("cuda:{ordinal}"), Arc::new(b))),
            Err(e) => errors.push(RegistryError::Config(crate::ConfigError::Build(e))),
        }
        let threshold = conf.cuda_async_release_threshold.unwrap_or(u64::MAX);
        match CudaAsyncAllocator::new(device.clone(), threshold) {
            Ok(a) => out.push((format!("cuda_async:{ordinal}"), Arc::new(a))),
            Err(e) => tracing::warn!(%e, ordinal, "tensormem: cuda_async allocator not registered"),
        }
        if ordinal == 0 {
            out.push(("cuda_host".to_owned(), Arc::new(CudaHostAllocator::new(device.clone()))));
        }
        opened.push(device);
    }
    let _ = DEVICES.set(opened);
    (out, errors)
}
