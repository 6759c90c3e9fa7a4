//! A CUDA graph captured from a raw stream (cudarc's driver API), for the GPU tests
//! that check fusekit's calls replay correctly inside a graph; the raw stream
//! itself, made by the caller rather than by fusekit.

use std::ffi::c_void;

use cudarc::driver::{result as cu, sys};

use super::{Ctx, Stream};

/// A non-blocking `CUstream` made by the caller (cudarc), not by fusekit;
/// synchronised and destroyed on drop, so fusekit's wraps of it (and the buffers
/// allocated on it) must be gone first.
pub struct RawStream(pub sys::CUstream);

impl RawStream {
    pub fn create() -> RawStream {
        RawStream(cu::stream::create(cu::stream::StreamKind::NonBlocking).expect("cuStreamCreate"))
    }
    /// The stream wrapped by `ctx` (`fk_stream_wrap`: borrowed, not owned).
    pub fn wrap(&self, ctx: &Ctx) -> Stream {
        Stream::wrap(ctx, self.0 as *mut c_void)
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        let synced = unsafe { cu::stream::synchronize(self.0) };
        let destroyed = unsafe { cu::stream::destroy(self.0) };
        if !std::thread::panicking() {
            synced.expect("cuStreamSynchronize");
            destroyed.expect("cuStreamDestroy");
        }
    }
}

/// An instantiated graph; destroyed (executable and graph) on drop.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl Graph {
    /// Captures what `work` enqueues on `raw` (thread-local capture mode) and
    /// instantiates it; panics when the capture was invalidated or came back empty.
    pub fn capture(raw: sys::CUstream, work: impl FnOnce()) -> Graph {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        unsafe { cu::stream::begin_capture(raw, mode) }.expect("cuStreamBeginCapture");
        work();
        let graph = unsafe { cu::stream::end_capture(raw) }
            .expect("cuStreamEndCapture: the capture was invalidated");
        assert!(!graph.is_null(), "the capture recorded an empty graph");
        let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .expect("cuGraphInstantiate");
        Graph { graph, exec }
    }
    /// Launches the graph on `raw` (asynchronously).
    pub fn launch(&self, raw: sys::CUstream) {
        unsafe { cu::graph::launch(self.exec, raw) }.expect("cuGraphLaunch");
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let exec = unsafe { cu::graph::exec_destroy(self.exec) };
        let graph = unsafe { cu::graph::destroy(self.graph) };
        if !std::thread::panicking() {
            exec.expect("cuGraphExecDestroy");
            graph.expect("cuGraphDestroy");
        }
    }
}
