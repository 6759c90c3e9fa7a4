//! A CUDA graph captured from a raw stream (cudarc's driver API), for the GPU tests
//! that check fusekit's calls replay correctly inside a graph.

use cudarc::driver::{result as cu, sys};

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
