//! The CUDA side of the runtime: the context's memory pool, pinned host memory,
//! events, copies (same device, host and device, across devices) and peer access.
//!
//! - Memory pool: each fusekit context creates its own pool on its device
//!   (`cuMemPoolCreate`, pinned device memory, no IPC handle type) and allocates every
//!   owned buffer from it with `cuMemAllocFromPoolAsync`; frees are
//!   `cuMemFreeAsync`. The release threshold starts at `u64::MAX` (the pool keeps
//!   what it has reserved, like PyTorch's caching allocator);
//!   `fk_context_set_release_threshold` lowers it and `fk_context_trim` gives
//!   memory back (`cuMemPoolTrimTo`).
//! - Pinned host memory: `cuMemHostAlloc(PORTABLE)`, so it is pinned for every
//!   context of the process (a copy to any GPU is a true DMA), freed with
//!   `cuMemFreeHost`.
//! - Peer copies: `cuMemcpyPeerAsync`. When `cuDeviceCanAccessPeer` says yes the
//!   first copy between two devices enables peer access between their primary
//!   contexts (`cuCtxEnablePeerAccess`, both ways) and grants each device access to
//!   the other's pool (`cuMemPoolSetAccess`; pool allocations do not follow context
//!   peer access): the copy then goes over NVLink / PCIe directly. Without peer
//!   access the driver stages the copy through host memory itself.

use cudarc::driver::{result, sys};

use super::CudaDevice;
use crate::error::{CudaContext as _, Error, FK_ERROR_OUT_OF_MEMORY, Result, lock};

/// Creates the memory pool of a context on device `ordinal` (the primary context
/// `cu_ctx` is made current first).
pub(super) fn pool_create(cu_ctx: sys::CUcontext, ordinal: usize) -> Result<sys::CUmemoryPool> {
    // SAFETY: the context was retained by the caller.
    unsafe { result::ctx::set_current(cu_ctx) }.cuda("cuCtxSetCurrent")?;
    // SAFETY: all-zero is a valid bit pattern for this plain C struct.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = ordinal as i32;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: props is fully initialised; pool is a valid out-parameter.
    unsafe { sys::cuMemPoolCreate(&mut pool, &props) }
        .result()
        .cuda("cuMemPoolCreate")?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: RELEASE_THRESHOLD takes a cuuint64_t.
    let r = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut _,
        )
    }
    .result()
    .cuda("cuMemPoolSetAttribute(RELEASE_THRESHOLD)");
    if let Err(e) = r {
        // SAFETY: created above, nothing allocated from it.
        let _ = unsafe { sys::cuMemPoolDestroy(pool) };
        return Err(e);
    }
    Ok(pool)
}

/// Statistics of a context's pool, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolStats {
    pub reserved: u64,
    pub reserved_high: u64,
    pub used: u64,
    pub release_threshold: u64,
}

/// A CUDA event handle (`CUevent`) as an integer, so holders stay `Send`.
pub type RawEvent = usize;

impl CudaDevice {
    fn pool_attr(&self, attr: sys::CUmemPool_attribute, name: &str) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: these attributes are cuuint64_t.
        unsafe { sys::cuMemPoolGetAttribute(self.pool, attr, &mut v as *mut u64 as *mut _) }
            .result()
            .cuda(&format!("cuMemPoolGetAttribute({name})"))?;
        Ok(v)
    }

    /// Reserved, high-water reserved, used bytes and the release threshold.
    pub fn pool_stats(&self) -> Result<PoolStats> {
        self.bind()?;
        use sys::CUmemPool_attribute as A;
        Ok(PoolStats {
            reserved: self.pool_attr(
                A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                "RESERVED_MEM_CURRENT",
            )?,
            reserved_high: self
                .pool_attr(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, "RESERVED_MEM_HIGH")?,
            used: self.pool_attr(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, "USED_MEM_CURRENT")?,
            release_threshold: self
                .pool_attr(A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, "RELEASE_THRESHOLD")?,
        })
    }

    /// Sets how many reserved bytes the pool keeps at a synchronisation point before
    /// releasing memory to the system.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.bind()?;
        let mut v = bytes;
        // SAFETY: RELEASE_THRESHOLD takes a cuuint64_t.
        unsafe {
            sys::cuMemPoolSetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut v as *mut u64 as *mut _,
            )
        }
        .result()
        .cuda("cuMemPoolSetAttribute(RELEASE_THRESHOLD)")
    }

    /// Releases reserved memory the pool does not use until at most `keep` bytes stay
    /// reserved (memory behind live buffers, or frees still queued, stays).
    pub fn trim(&self, keep: u64) -> Result<()> {
        self.bind()?;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // SAFETY: the pool of this context.
        unsafe { sys::cuMemPoolTrimTo(self.pool, keep) }
            .result()
            .cuda("cuMemPoolTrimTo")
    }

    // ------------------------------------------------------------ pinned host memory

    /// Page-locked host memory, portable to every context (`cuMemHostAlloc`).
    pub fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-parameter.
        let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .result();
        match r {
            Ok(()) => Ok(p as *mut u8),
            Err(e) => {
                let mut err = Error::from(e);
                let (free, _) = crate::host::host_memory();
                err.status = FK_ERROR_OUT_OF_MEMORY;
                err.message = format!(
                    "cuMemHostAlloc of {bytes} bytes of pinned host memory failed ({free} bytes of host memory free): {}",
                    err.message
                );
                Err(err)
            }
        }
    }

    /// Frees memory from `host_alloc`.
    pub fn host_free(&self, p: *mut u8) {
        if p.is_null() || self.bind().is_err() {
            return;
        }
        // SAFETY: p came from host_alloc and is freed once.
        let _ = unsafe { sys::cuMemFreeHost(p as *mut _) };
    }

    // ------------------------------------------------------------ copies

    /// `cuMemcpyAsync` on `stream` (a stream of this context): the driver infers the
    /// direction from the addresses (unified addressing), so this covers host to
    /// device, device to host, device to device and host to host.
    pub fn memcpy_async(&self, dst: u64, src: u64, bytes: usize, stream: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller checked that both ranges hold `bytes` bytes.
        unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream as sys::CUstream) }
            .result()
            .cuda("cuMemcpyAsync")
    }

    /// Whether `self`'s device can read and write memory of `peer`'s device directly.
    pub fn can_access_peer(&self, peer: &CudaDevice) -> Result<bool> {
        can_access_peer(self.ordinal, peer.ordinal)
    }

    /// Enables what a direct copy between `self` and `peer` needs (once per pair):
    /// peer access of the primary contexts both ways, and access of each device to
    /// the other's pool. Returns whether the devices are peer capable (false: the
    /// driver will stage copies through host memory).
    pub fn ensure_peer(&self, peer: &CudaDevice) -> Result<bool> {
        if self.ordinal == peer.ordinal {
            return Ok(true);
        }
        if !(can_access_peer(self.ordinal, peer.ordinal)?
            && can_access_peer(peer.ordinal, self.ordinal)?)
        {
            return Ok(false);
        }
        self.enable_ctx_peer(peer)?;
        peer.enable_ctx_peer(self)?;
        self.grant_pool_access(peer.ordinal)?;
        peer.grant_pool_access(self.ordinal)?;
        Ok(true)
    }

    /// `cuCtxEnablePeerAccess` from this context to `peer`'s (already enabled, e.g.
    /// by PyTorch, counts as success).
    fn enable_ctx_peer(&self, peer: &CudaDevice) -> Result<()> {
        let mut done = lock(&self.peers_enabled);
        if done.contains(&peer.ordinal) {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: peer.cu_ctx is retained by peer for its lifetime.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx, 0) };
        if r != sys::CUresult::CUDA_SUCCESS
            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        {
            r.result().cuda(&format!(
                "cuCtxEnablePeerAccess(cuda:{} -> cuda:{})",
                self.ordinal, peer.ordinal
            ))?;
        }
        done.insert(peer.ordinal);
        Ok(())
    }

    /// Lets device `accessor` read and write allocations of this context's pool.
    fn grant_pool_access(&self, accessor: usize) -> Result<()> {
        let mut done = lock(&self.pool_access);
        if done.contains(&accessor) {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: all-zero is a valid bit pattern for this plain C struct.
        let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        desc.location.id = accessor as i32;
        desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: one valid descriptor.
        unsafe { sys::cuMemPoolSetAccess(self.pool, &desc, 1) }
            .result()
            .cuda(&format!(
                "cuMemPoolSetAccess(pool of cuda:{}, cuda:{})",
                self.ordinal, accessor
            ))?;
        done.insert(accessor);
        Ok(())
    }

    /// `cuMemcpyPeerAsync` from `src` (memory of `src_dev`) to `dst` (memory of
    /// `self`), queued on `stream`, a stream of `stream_dev` (one of the two).
    pub fn memcpy_peer_async(
        &self,
        dst: u64,
        src_dev: &CudaDevice,
        src: u64,
        bytes: usize,
        stream_dev: &CudaDevice,
        stream: usize,
    ) -> Result<()> {
        stream_dev.bind()?;
        // SAFETY: both contexts are retained; the caller checked the sizes.
        unsafe {
            sys::cuMemcpyPeerAsync(
                dst,
                self.cu_ctx,
                src,
                src_dev.cu_ctx,
                bytes,
                stream as sys::CUstream,
            )
        }
        .result()
        .cuda(&format!(
            "cuMemcpyPeerAsync(cuda:{} -> cuda:{})",
            src_dev.ordinal, self.ordinal
        ))
    }

    // ------------------------------------------------------------ events

    /// A new event of this context (timing enabled).
    pub fn event_create(&self) -> Result<RawEvent> {
        self.bind()?;
        let ev =
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).cuda("cuEventCreate")?;
        Ok(ev as RawEvent)
    }

    pub fn event_destroy(&self, ev: RawEvent) {
        if self.bind().is_ok() {
            // SAFETY: an event of this context, destroyed once.
            let _ = unsafe { result::event::destroy(ev as sys::CUevent) };
        }
    }

    /// Records `ev` (an event of this context) on `stream` (a stream of this context).
    pub fn event_record(&self, ev: RawEvent, stream: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both handles belong to this context.
        unsafe { result::event::record(ev as sys::CUevent, stream as sys::CUstream) }
            .cuda("cuEventRecord")
    }

    /// Makes `stream` (of this context) wait for `ev` (an event of any context).
    pub fn stream_wait_event(&self, stream: usize, ev: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: valid handles; cross-device waits are allowed by CUDA.
        unsafe { sys::cuStreamWaitEvent(stream as sys::CUstream, ev as sys::CUevent, 0) }
            .result()
            .cuda("cuStreamWaitEvent")
    }

    pub fn event_synchronize(&self, ev: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: an event of this context.
        unsafe { sys::cuEventSynchronize(ev as sys::CUevent) }
            .result()
            .cuda("cuEventSynchronize")
    }

    /// Whether all work captured by `ev` has completed.
    pub fn event_query(&self, ev: RawEvent) -> Result<bool> {
        self.bind()?;
        // SAFETY: an event of this context.
        let r = unsafe { sys::cuEventQuery(ev as sys::CUevent) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => e.result().cuda("cuEventQuery").map(|_| false),
        }
    }

    /// Milliseconds between two completed events of this context.
    pub fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        self.bind()?;
        // SAFETY: events of this context, both recorded and complete.
        unsafe { result::event::elapsed(start as sys::CUevent, end as sys::CUevent) }
            .cuda("cuEventElapsedTime")
    }
}

/// `cuDeviceCanAccessPeer(device, peer)`; true when `device == peer`.
pub fn can_access_peer(device: usize, peer: usize) -> Result<bool> {
    if device == peer {
        return Ok(true);
    }
    super::driver()?;
    let d = result::device::get(device as i32).cuda("cuDeviceGet")?;
    let p = result::device::get(peer as i32).cuda("cuDeviceGet")?;
    let mut v: i32 = 0;
    // SAFETY: valid device handles and out-parameter.
    unsafe { sys::cuDeviceCanAccessPeer(&mut v, d, p) }
        .result()
        .cuda("cuDeviceCanAccessPeer")?;
    Ok(v != 0)
}
