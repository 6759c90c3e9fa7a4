//! The handlers on fake call frames, built here with the mirrored structs and a
//! fake API table (only `XLA_FFI_Error_Create`, which boxes the message): the
//! metadata probe, values on the CPU, fusekit's messages on bad input, caught
//! panics, the call counter.

use std::ffi::{CStr, c_void};

use super::api::*;

/// An error made by the fake `XLA_FFI_Error_Create`.
#[derive(Debug)]
pub(crate) struct FakeError {
    pub msg: String,
    pub errc: i32,
}

unsafe extern "C" fn fake_error_create(args: *mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the handler's arguments, of the mirrored layout.
    let a = unsafe { &*args };
    assert!(a.struct_size >= XLA_FFI_ERROR_CREATE_ARGS_STRUCT_SIZE);
    // SAFETY: a NUL-terminated message, copied here as XLA copies it.
    let msg = unsafe { CStr::from_ptr(a.message) }
        .to_string_lossy()
        .into_owned();
    Box::into_raw(Box::new(FakeError { msg, errc: a.errc })) as *mut XLA_FFI_Error
}

fn fake_api() -> Box<XLA_FFI_Api> {
    Box::new(XLA_FFI_Api {
        struct_size: std::mem::size_of::<XLA_FFI_Api>(),
        extension_start: std::ptr::null_mut(),
        api_version: XLA_FFI_Api_Version {
            struct_size: 24,
            extension_start: std::ptr::null_mut(),
            major_version: 0,
            minor_version: 3,
        },
        internal_api: std::ptr::null(),
        error_create: Some(fake_error_create),
        error_get_message: None,
        error_destroy: None,
        handler_register: None,
        stream_get: None,
        type_register: None,
        execution_context_get: None,
        state_set: None,
        state_get: None,
        device_memory_allocate: None,
        device_memory_free: None,
        thread_pool_schedule: None,
        thread_pool_num_threads: None,
        future_create: None,
        future_set_available: None,
        future_set_error: None,
        run_id_get: None,
        device_ordinal_get: None,
    })
}

pub(crate) type Handler = unsafe extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

/// One buffer: its descriptor, dims and bytes (boxed so pointers stay put).
struct Buf {
    desc: Box<XLA_FFI_Buffer>,
    _dims: Vec<i64>,
    data: Vec<u64>,
}

fn buf(dtype: i32, bytes: Vec<u8>, dims: &[i64]) -> Buf {
    // u64 storage: 8-byte aligned for every element type
    let mut data = vec![0u64; bytes.len().div_ceil(8).max(1)];
    // SAFETY: `data` holds at least `bytes.len()` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), data.as_mut_ptr() as *mut u8, bytes.len())
    };
    let mut dims = dims.to_vec();
    let desc = Box::new(XLA_FFI_Buffer {
        struct_size: std::mem::size_of::<XLA_FFI_Buffer>(),
        extension_start: std::ptr::null_mut(),
        dtype,
        data: data.as_mut_ptr() as *mut c_void,
        rank: dims.len() as i64,
        dims: dims.as_mut_ptr(),
    });
    Buf {
        desc,
        _dims: dims,
        data,
    }
}

fn bytes_of<T: Copy>(v: &[T]) -> Vec<u8> {
    // SAFETY: plain numbers viewed as bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        .to_vec()
}

/// A call frame under construction.
pub(crate) struct FakeCall {
    args: Vec<Buf>,
    rets: Vec<Buf>,
    /// (name, XLA dtype, value as 8 bytes)
    attrs: Vec<(String, i32, u64)>,
    api: Box<XLA_FFI_Api>,
}

impl FakeCall {
    pub fn new() -> Self {
        FakeCall {
            args: vec![],
            rets: vec![],
            attrs: vec![],
            api: fake_api(),
        }
    }
    pub fn arg_f64(mut self, v: &[f64], dims: &[i64]) -> Self {
        self.args.push(buf(XLA_FFI_DATATYPE_F64, bytes_of(v), dims));
        self
    }
    pub fn arg_f32(mut self, v: &[f32], dims: &[i64]) -> Self {
        self.args.push(buf(XLA_FFI_DATATYPE_F32, bytes_of(v), dims));
        self
    }
    pub fn arg_raw(mut self, dtype: i32, bytes: Vec<u8>, dims: &[i64]) -> Self {
        self.args.push(buf(dtype, bytes, dims));
        self
    }
    /// A result of `dims` with XLA element type `dtype`, filled with `nan`
    /// (uninitialised, as XLA's may be).
    fn ret_filled<T: Copy>(mut self, dtype: i32, nan: T, dims: &[i64]) -> Self {
        let n: i64 = dims.iter().product();
        self.rets
            .push(buf(dtype, bytes_of(&vec![nan; n as usize]), dims));
        self
    }
    pub fn ret_f64(self, dims: &[i64]) -> Self {
        self.ret_filled(XLA_FFI_DATATYPE_F64, f64::NAN, dims)
    }
    pub fn ret_f32(self, dims: &[i64]) -> Self {
        self.ret_filled(XLA_FFI_DATATYPE_F32, f32::NAN, dims)
    }
    pub fn attr_i64(mut self, name: &str, v: i64) -> Self {
        self.attrs
            .push((name.into(), XLA_FFI_DATATYPE_S64, v as u64));
        self
    }
    pub fn attr_f64(mut self, name: &str, v: f64) -> Self {
        self.attrs
            .push((name.into(), XLA_FFI_DATATYPE_F64, v.to_bits()));
        self
    }

    pub fn out_f64(&self, i: usize) -> Vec<f64> {
        let b = &self.rets[i];
        let n: i64 = b._dims.iter().product();
        // SAFETY: the result's storage holds n f64.
        unsafe { std::slice::from_raw_parts(b.data.as_ptr() as *const f64, n as usize) }.to_vec()
    }
    pub fn out_f32(&self, i: usize) -> Vec<f32> {
        let b = &self.rets[i];
        let n: i64 = b._dims.iter().product();
        // SAFETY: the result's storage holds n f32.
        unsafe { std::slice::from_raw_parts(b.data.as_ptr() as *const f32, n as usize) }.to_vec()
    }

    /// Calls `h` on this frame (execute stage, or the metadata probe when
    /// `metadata` is given); the error it returned, if any.
    pub fn call_with(
        &mut self,
        h: Handler,
        metadata: Option<&mut XLA_FFI_Metadata>,
    ) -> Option<FakeError> {
        let descs = |bufs: &mut [Buf]| -> Vec<*mut c_void> {
            bufs.iter_mut()
                .map(|b| &mut *b.desc as *mut XLA_FFI_Buffer as *mut c_void)
                .collect()
        };
        let mut arg_types = vec![XLA_FFI_ARGTYPE_BUFFER; self.args.len()];
        let mut arg_ptrs = descs(&mut self.args);
        let mut ret_types = vec![XLA_FFI_RETTYPE_BUFFER; self.rets.len()];
        let mut ret_ptrs = descs(&mut self.rets);
        // attributes sorted by name, as XLA passes them
        self.attrs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut values: Vec<u64> = self.attrs.iter().map(|a| a.2).collect();
        let mut scalars: Vec<XLA_FFI_Scalar> = self
            .attrs
            .iter()
            .zip(values.iter_mut())
            .map(|(a, v)| XLA_FFI_Scalar {
                dtype: a.1,
                value: v as *mut u64 as *mut c_void,
            })
            .collect();
        let mut spans: Vec<XLA_FFI_ByteSpan> = self
            .attrs
            .iter()
            .map(|a| XLA_FFI_ByteSpan {
                ptr: a.0.as_ptr() as *const _,
                len: a.0.len(),
            })
            .collect();
        let mut span_ptrs: Vec<*mut XLA_FFI_ByteSpan> =
            spans.iter_mut().map(|s| s as *mut _).collect();
        let mut attr_types = vec![XLA_FFI_ATTRTYPE_SCALAR; self.attrs.len()];
        let mut attr_ptrs: Vec<*mut c_void> = scalars
            .iter_mut()
            .map(|s| s as *mut _ as *mut c_void)
            .collect();
        let mut ext = metadata.map(|m| XLA_FFI_Metadata_Extension {
            extension_base: XLA_FFI_Extension_Base {
                struct_size: std::mem::size_of::<XLA_FFI_Metadata_Extension>(),
                type_: XLA_FFI_EXTENSION_METADATA,
                next: std::ptr::null_mut(),
            },
            metadata: m,
        });
        let mut frame = XLA_FFI_CallFrame {
            struct_size: XLA_FFI_CALL_FRAME_STRUCT_SIZE,
            extension_start: ext
                .as_mut()
                .map_or(std::ptr::null_mut(), |e| &mut e.extension_base as *mut _),
            api: &*self.api,
            ctx: std::ptr::null_mut(),
            stage: XLA_FFI_EXECUTION_STAGE_EXECUTE,
            args: XLA_FFI_Args {
                struct_size: 40,
                extension_start: std::ptr::null_mut(),
                size: arg_ptrs.len() as i64,
                types: arg_types.as_mut_ptr(),
                args: arg_ptrs.as_mut_ptr(),
            },
            rets: XLA_FFI_Rets {
                struct_size: 40,
                extension_start: std::ptr::null_mut(),
                size: ret_ptrs.len() as i64,
                types: ret_types.as_mut_ptr(),
                rets: ret_ptrs.as_mut_ptr(),
            },
            attrs: XLA_FFI_Attrs {
                struct_size: 48,
                extension_start: std::ptr::null_mut(),
                size: attr_ptrs.len() as i64,
                types: attr_types.as_mut_ptr(),
                names: span_ptrs.as_mut_ptr(),
                attrs: attr_ptrs.as_mut_ptr(),
            },
            future: std::ptr::null_mut(),
        };
        // SAFETY: a frame of the mirrored layout whose pointers all live until the
        // call returns.
        let e = unsafe { h(&mut frame) };
        if e.is_null() {
            None
        } else {
            // SAFETY: made by fake_error_create.
            Some(*unsafe { Box::from_raw(e as *mut FakeError) })
        }
    }

    pub fn call(&mut self, h: Handler) -> Option<FakeError> {
        self.call_with(h, None)
    }
}

/// A metadata struct as XLA prepares it for the probe (version unset).
pub(crate) fn blank_metadata() -> XLA_FFI_Metadata {
    XLA_FFI_Metadata {
        struct_size: end_of!(XLA_FFI_Metadata, traits),
        api_version: XLA_FFI_Api_Version {
            struct_size: 24,
            extension_start: std::ptr::null_mut(),
            major_version: 0,
            minor_version: 0,
        },
        traits: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xla::elementwise::*;
    use crate::xla::gaussian::*;
    use crate::xla::geodesic::*;
    use crate::xla::linalg::*;
    use crate::xla::mlp::*;
    use crate::xla::optim::*;

    fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "[{i}] {x} vs {y}");
        }
    }

    #[test]
    fn metadata_probe_is_answered() {
        for (h, traits) in [
            (
                fk_xla_add_cpu as Handler,
                XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
            ),
            (
                fk_xla_add_cuda,
                XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
            ),
            (fk_xla_linear_backward_cuda, 0),
            // the MLP forward with `saved` and the backward with `workspace`
            // allocate nothing
            (
                fk_xla_mlp_forward_cuda,
                XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
            ),
            (
                fk_xla_mlp_backward_cuda,
                XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
            ),
            (
                fk_xla_gaussian_field_backward_cpu,
                XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
            ),
            // docs/abi.md's "CUDA graphs" table: the geodesic ops, Shampoo, the
            // per-sample ops and Newton with tol <= 0 are capturable; the
            // eigendecomposition reads cuSOLVER's flags on the host: not
            (fk_xla_christoffel_forward_cuda, 0),
            (fk_xla_christoffel_backward_cuda, 0),
            (fk_xla_leapfrog_forward_cuda, 0),
            (fk_xla_leapfrog_backward_cuda, 0),
            (fk_xla_matrix_power_cuda, 0),
            (fk_xla_matrix_power_eigh_cuda, 0),
            (fk_xla_matrix_power_eigh_cpu, 0),
            (fk_xla_shampoo_stats_cuda, 0),
            (fk_xla_shampoo_precondition_cuda, 0),
            (fk_xla_per_sample_grads_cuda, 0),
            (fk_xla_per_sample_grad_norms_cuda, 0),
            (fk_xla_dp_clipped_grad_sum_cuda, 0),
        ] {
            let mut m = blank_metadata();
            // the probe carries no operands: nothing is decoded or run
            let e = FakeCall::new().call_with(h, Some(&mut m));
            assert!(e.is_none(), "{e:?}");
            assert_eq!(
                (m.api_version.major_version, m.api_version.minor_version),
                (API_MAJOR, API_MINOR)
            );
            assert_eq!((API_MAJOR, API_MINOR), (0, 1));
            assert_eq!(m.traits, traits);
        }
    }

    impl FakeCall {
        /// The operands `points [3, 3]`, `means [2, 3]`, `chol [2, 3, 3]` of `gaussians`.
        fn args_pml(self, p: &[f64], m: &[f64], l: &[f64]) -> Self {
            self.arg_f64(p, &[3, 3])
                .arg_f64(m, &[2, 3])
                .arg_f64(l, &[2, 3, 3])
        }
        /// The operands `v [2, 3]`, `U [3, 2]`, `W [3, 2]` of `geo_problem`.
        fn args_vuw(self, v: &[f64], u: &[f64], w: &[f64]) -> Self {
            self.arg_f64(v, &[2, 3])
                .arg_f64(u, &[3, 2])
                .arg_f64(w, &[3, 2])
        }
    }

    /// Central differences of `f` at `x` with step `h`, one per element of `x`.
    fn central_diff(x: &[f64], h: f64, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        (0..x.len())
            .map(|i| {
                let (mut p, mut m) = (x.to_vec(), x.to_vec());
                p[i] += h;
                m[i] -= h;
                (f(&p) - f(&m)) / (2.0 * h)
            })
            .collect()
    }

    /// The error `h` gives on `c`, whose message must pass `ok`.
    #[track_caller]
    fn error_of(c: &mut FakeCall, h: Handler, ok: impl Fn(&str) -> bool) -> FakeError {
        let e = c.call(h).expect("an error");
        assert!(ok(&e.msg), "{}", e.msg);
        e
    }

    #[test]
    fn add_broadcasts_on_the_cpu() {
        let mut c = FakeCall::new()
            .arg_f64(&[1., 2., 3., 4., 5., 6.], &[2, 3])
            .arg_f64(&[10., 20., 30.], &[3])
            .ret_f64(&[2, 3]);
        assert!(c.call(fk_xla_add_cpu).is_none());
        assert_eq!(c.out_f64(0), vec![11., 22., 33., 14., 25., 36.]);
    }

    #[test]
    fn axpby_and_unary() {
        let mut c = FakeCall::new()
            .arg_f32(&[1., 2.], &[2])
            .arg_f32(&[3., 4.], &[2])
            .ret_f32(&[2])
            .attr_f64("beta", -1.0)
            .attr_i64("alpha", 2);
        assert!(c.call(fk_xla_axpby_cpu).is_none());
        assert_eq!(c.out_f32(0), vec![-1., 0.]);
        let mut c = FakeCall::new().arg_f64(&[-1., 0.5], &[2]).ret_f64(&[2]);
        assert!(c.call(fk_xla_relu_cpu).is_none());
        assert_eq!(c.out_f64(0), vec![0., 0.5]);
        let mut c = FakeCall::new().arg_f64(&[0., 1.], &[2]).ret_f64(&[2]);
        assert!(c.call(fk_xla_exp_cpu).is_none());
        close(&c.out_f64(0), &[1.0, std::f64::consts::E], 1e-15);
    }

    #[test]
    fn bad_input_carries_fusekits_message() {
        let mut c = FakeCall::new()
            .arg_f64(&[1., 2., 3., 4., 5., 6.], &[2, 3])
            .arg_f64(&[10., 20., 30.], &[3])
            .ret_f64(&[2, 2]);
        let e = c.call(fk_xla_add_cpu).expect("an error");
        assert_eq!(e.errc, XLA_FFI_ERROR_CODE_INVALID_ARGUMENT);
        assert_eq!(
            e.msg,
            "fk_xla_add_cpu: out has shape [2, 2] but a [2, 3] and b [3] broadcast to [2, 3] (FK_ERROR_SHAPE_MISMATCH)"
        );
        // dtypes fusekit does not have
        let mut c = FakeCall::new()
            .arg_raw(XLA_FFI_DATATYPE_S32, vec![0; 8], &[2])
            .arg_f64(&[1., 2.], &[2])
            .ret_f64(&[2]);
        let e = error_of(&mut c, fk_xla_mul_cpu, |m| {
            m.contains("a has XLA element type 4, which is not a fusekit dtype")
        });
        assert!(e.msg.ends_with("(FK_ERROR_UNSUPPORTED_DTYPE)"), "{}", e.msg);
        // a missing attribute, wrong operand counts
        let mut c = FakeCall::new()
            .arg_f32(&[1.], &[1, 1])
            .arg_f32(&[1.], &[1, 1])
            .ret_f32(&[1, 1]);
        let e = c.call(fk_xla_linear_forward_cpu).expect("an error");
        assert_eq!(
            e.msg,
            "fk_xla_linear_forward_cpu: attribute act is missing (FK_ERROR_INVALID_ARGUMENT)"
        );
        let mut c = FakeCall::new().arg_f64(&[1.], &[1]).ret_f64(&[1]);
        error_of(&mut c, fk_xla_sub_cpu, |m| {
            m.contains("the call has 1 operands and 1 results; this handler takes 2 operands and 1 results")
        });
    }

    /// Points, means, Cholesky factors of two Gaussians and weights.
    fn gaussians() -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let p = vec![0.1, 0.2, 0.3, -0.5, 0.4, 1.0, 0.0, 0.0, 0.0];
        let m = vec![0.0, 0.0, 0.0, 0.5, -0.5, 0.25];
        let l = vec![
            1.0, 0.0, 0.0, 0.2, 0.8, 0.0, -0.1, 0.3, 1.5, //
            0.7, 0.0, 0.0, 0.0, 1.2, 0.0, 0.4, -0.2, 0.9,
        ];
        (p, m, l, vec![1.5, -0.5])
    }

    /// `|(L + eps I)^-1 (p - mu)|^2` by forward substitution.
    fn maha(p: &[f64], m: &[f64], l: &[f64], eps: f64) -> f64 {
        let d = [p[0] - m[0], p[1] - m[1], p[2] - m[2]];
        let a = |r: usize, c: usize| l[r * 3 + c] + if r == c { eps } else { 0.0 };
        let y0 = d[0] / a(0, 0);
        let y1 = (d[1] - a(1, 0) * y0) / a(1, 1);
        let y2 = (d[2] - a(2, 0) * y0 - a(2, 1) * y1) / a(2, 2);
        y0 * y0 + y1 * y1 + y2 * y2
    }

    #[test]
    fn gaussian_forwards_and_backward_on_the_cpu() {
        let (p, m, l, w) = gaussians();
        let eps = 0.05;
        let mut c = FakeCall::new()
            .args_pml(&p, &m, &l)
            .ret_f64(&[3, 2])
            .attr_f64("eps", eps);
        assert!(c.call(fk_xla_mahalanobis_forward_cpu).is_none());
        let want: Vec<f64> = (0..3)
            .flat_map(|b| (0..2).map(move |n| (b, n)))
            .map(|(b, n)| maha(&p[b * 3..], &m[n * 3..], &l[n * 9..], eps))
            .collect();
        close(&c.out_f64(0), &want, 1e-13);

        let mut c = FakeCall::new()
            .args_pml(&p, &m, &l)
            .arg_f64(&w, &[2])
            .ret_f64(&[3])
            .attr_f64("eps", eps);
        assert!(c.call(fk_xla_gaussian_field_forward_cpu).is_none());
        let field: Vec<f64> = (0..3)
            .map(|b| (0..2).map(|n| w[n] * (-0.5 * want[b * 2 + n]).exp()).sum())
            .collect();
        close(&c.out_f64(0), &field, 1e-13);

        // d(sum out)/d weights = sum_b exp(-m/2); the workspace is empty on the CPU
        let mut c = FakeCall::new()
            .args_pml(&p, &m, &l)
            .arg_f64(&w, &[2])
            .arg_f64(&[1.0, 1.0, 1.0], &[3])
            .ret_f64(&[3, 3])
            .ret_f64(&[2, 3])
            .ret_f64(&[2, 3, 3])
            .ret_f64(&[2])
            .ret_f64(&[0])
            .attr_f64("eps", eps);
        assert!(c.call(fk_xla_gaussian_field_backward_cpu).is_none());
        let dw: Vec<f64> = (0..2)
            .map(|n| (0..3).map(|b| (-0.5 * want[b * 2 + n]).exp()).sum())
            .collect();
        close(&c.out_f64(3), &dw, 1e-13);
        assert!(
            c.out_f64(0)
                .iter()
                .chain(c.out_f64(2).iter())
                .all(|v| v.is_finite())
        );
    }

    #[test]
    fn gaussian_bad_eps_is_fusekits_error() {
        let (p, m, l, _) = gaussians();
        let mut c = FakeCall::new()
            .args_pml(&p, &m, &l)
            .ret_f64(&[3, 2])
            .attr_f64("eps", -1.0);
        error_of(&mut c, fk_xla_mahalanobis_forward_cpu, |m| {
            m.starts_with("fk_xla_mahalanobis_forward_cpu: eps = -1")
        });
    }

    #[test]
    fn linear_and_gemm_on_the_cpu() {
        // x [2, 3], w [2, 3], b [2]: y = relu(x w^T + b)
        let x = [1.0f32, 2.0, 3.0, -1.0, 0.0, 1.0];
        let w = [0.5f32, -1.0, 0.25, 1.0, 1.0, 1.0];
        let b = [0.1f32, -7.0];
        let mut c = FakeCall::new()
            .arg_f32(&x, &[2, 3])
            .arg_f32(&w, &[2, 3])
            .arg_f32(&b, &[2])
            .ret_f32(&[2, 2])
            .attr_i64("act", 1);
        assert!(c.call(fk_xla_linear_forward_cpu).is_none());
        let y = c.out_f32(0);
        let z = [
            1.0 * 0.5 - 2.0 + 0.75 + 0.1,
            6.0 - 7.0,
            -0.5 + 0.25 + 0.1,
            0.0 - 7.0,
        ];
        let relu: Vec<f64> = z.iter().map(|v: &f64| v.max(0.0)).collect();
        close(
            &y.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &relu,
            1e-6,
        );

        // act none backward: dx = dy w, dw = dy^T x, db = column sums of dy
        let dy = [1.0f32, 2.0, -1.0, 0.5];
        let mut c = FakeCall::new()
            .arg_f32(&dy, &[2, 2])
            .arg_f32(&x, &[2, 3])
            .arg_f32(&w, &[2, 3])
            .ret_f32(&[2, 3])
            .ret_f32(&[2, 3])
            .ret_f32(&[2])
            .attr_i64("act", 0);
        assert!(c.call(fk_xla_linear_backward_cpu).is_none());
        let dx: Vec<f64> = (0..2)
            .flat_map(|i| (0..3).map(move |j| (i, j)))
            .map(|(i, j)| (0..2).map(|o| (dy[i * 2 + o] * w[o * 3 + j]) as f64).sum())
            .collect();
        close(
            &c.out_f32(0).iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &dx,
            1e-6,
        );
        close(
            &c.out_f32(2).iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &[0.0, 2.5],
            1e-6,
        );

        // gemm: c = 2 a^T b
        let mut c = FakeCall::new()
            .arg_f64(&[1., 2., 3., 4.], &[2, 2])
            .arg_f64(&[1., 0., 0., 1.], &[2, 2])
            .ret_f64(&[2, 2])
            .attr_i64("op_a", 1)
            .attr_f64("alpha", 2.0)
            .attr_i64("flags", 1);
        assert!(c.call(fk_xla_gemm_cpu).is_none());
        assert_eq!(c.out_f64(0), vec![2., 6., 4., 8.]);
    }

    #[test]
    fn a_panic_does_not_cross() {
        unsafe extern "C" fn panicking(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
            // SAFETY: the fake frame.
            unsafe {
                crate::xla::entry(
                    frame,
                    "fk_xla_test_panic",
                    crate::xla::Platform::Cpu,
                    crate::xla::Graph::Capturable,
                    |_| panic!("boom"),
                )
            }
        }
        let e = FakeCall::new().call(panicking).expect("an error");
        assert_eq!(e.errc, XLA_FFI_ERROR_CODE_INTERNAL);
        assert_eq!(
            e.msg,
            "fk_xla_test_panic: internal error (caught panic: boom); please report it (FK_ERROR_INTERNAL)"
        );
    }

    #[test]
    fn call_counter_counts_executions_only() {
        let was = crate::xla::fk_xla_set_call_counting(1);
        let before = crate::xla::fk_xla_call_count();
        let mut m = blank_metadata();
        FakeCall::new().call_with(fk_xla_neg_cpu, Some(&mut m));
        for _ in 0..3 {
            let mut c = FakeCall::new().arg_f64(&[1.], &[1]).ret_f64(&[1]);
            assert!(c.call(fk_xla_neg_cpu).is_none());
        }
        // other tests may run handlers meanwhile: at least these three
        assert!(crate::xla::fk_xla_call_count() >= before + 3);
        crate::xla::fk_xla_set_call_counting(was);
    }

    #[test]
    fn workspace_bytes() {
        let mut v = 7usize;
        let s = unsafe { crate::xla::fk_xla_gaussian_workspace_bytes(1, 4, 100, 10, &mut v) };
        assert_eq!((s, v), (0, 0));
        let s = unsafe { crate::xla::fk_xla_gaussian_workspace_bytes(2, 3, 100, 10, &mut v) };
        assert_eq!(s, 0);
        assert_eq!(
            v,
            crate::cuda::gaussian::workspace_bytes(crate::dtype::DType::F32, 100, 10)
        );
        let s = unsafe { crate::xla::fk_xla_gaussian_workspace_bytes(2, 1, 100, 10, &mut v) };
        assert_eq!(s, crate::error::FK_ERROR_UNSUPPORTED_DTYPE);
    }

    // ------------------------------------------------------------ geodesic

    /// `clamp((v U)^2 W^T, -c, c)` for one row.
    fn gamma_row(v: &[f64], u: &[f64], w: &[f64], r: usize, c: f64) -> Vec<f64> {
        let d = v.len();
        let s: Vec<f64> = (0..r)
            .map(|j| (0..d).map(|i| v[i] * u[i * r + j]).sum::<f64>().powi(2))
            .collect();
        (0..d)
            .map(|i| {
                (0..r)
                    .map(|j| s[j] * w[i * r + j])
                    .sum::<f64>()
                    .clamp(-c, c)
            })
            .collect()
    }

    fn geo_problem() -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        // B = 2, D = 3, R = 2
        let v = vec![0.3, -0.2, 0.5, 0.1, 0.4, -0.3];
        let u = vec![0.5, -0.1, 0.2, 0.3, -0.4, 0.6];
        let w = vec![0.7, 0.2, -0.5, 0.1, 0.3, -0.8];
        let x = vec![1.0, 2.0, 3.0, -1.0, 0.0, 0.5];
        (v, u, w, x)
    }

    #[test]
    fn christoffel_forward_and_backward_on_the_cpu() {
        let (v, u, w, _) = geo_problem();
        let mut c = FakeCall::new()
            .args_vuw(&v, &u, &w)
            .ret_f64(&[2, 3])
            .attr_f64("c", 0.05)
            .attr_i64("flags", 0);
        assert!(c.call(fk_xla_christoffel_forward_cpu).is_none());
        let want: Vec<f64> = (0..2)
            .flat_map(|b| gamma_row(&v[b * 3..b * 3 + 3], &u, &w, 2, 0.05))
            .collect();
        close(&c.out_f64(0), &want, 1e-14);

        // want = 4: dW alone, the only result; d(sum gamma)/dW[d, r] = sum_b s[b, r]
        // over the unclamped (d, b) (c = inf: all)
        let mut c = FakeCall::new()
            .args_vuw(&v, &u, &w)
            .arg_f64(&[1.0; 6], &[2, 3])
            .ret_f64(&[3, 2])
            .attr_f64("c", f64::INFINITY)
            .attr_i64("want", 4);
        assert!(c.call(fk_xla_christoffel_backward_cpu).is_none());
        let s: Vec<f64> = (0..4)
            .map(|e| {
                let (b, j) = (e / 2, e % 2);
                (0..3)
                    .map(|i| v[b * 3 + i] * u[i * 2 + j])
                    .sum::<f64>()
                    .powi(2)
            })
            .collect();
        let dw: Vec<f64> = (0..3)
            .flat_map(|_| (0..2).map(|j| s[j] + s[2 + j]))
            .collect();
        close(&c.out_f64(0), &dw, 1e-14);

        // dv against central differences of sum(gamma * g)
        let g = [0.5, -1.0, 2.0, 1.5, 0.25, -0.75];
        let mut c = FakeCall::new()
            .args_vuw(&v, &u, &w)
            .arg_f64(&g, &[2, 3])
            .ret_f64(&[2, 3])
            .ret_f64(&[3, 2])
            .ret_f64(&[3, 2])
            .attr_f64("c", 5.0);
        assert!(c.call(fk_xla_christoffel_backward_cpu).is_none());
        let loss = |v: &[f64]| -> f64 {
            (0..2)
                .flat_map(|b| gamma_row(&v[b * 3..b * 3 + 3], &u, &w, 2, 5.0))
                .zip(g)
                .map(|(a, b)| a * b)
                .sum()
        };
        close(&c.out_f64(0), &central_diff(&v, 1e-6, loss), 1e-8);
    }

    #[test]
    fn leapfrog_forward_and_backward_on_the_cpu() {
        let (v, u, w, x) = geo_problem();
        let f = [0.1, 0.0, -0.2, 0.3, 0.1, 0.0];
        let mu = [0.1, 0.2, 0.0];
        let (dt, steps, cl) = (0.1, 3i64, 5.0);
        // f and mu given; dt, steps, c
        let attrs = |c: FakeCall| {
            c.attr_i64("has_f", 1)
                .attr_i64("has_mu", 1)
                .attr_f64("dt", dt)
                .attr_i64("steps", steps)
                .attr_f64("c", cl)
        };
        let forward = |v0: &[f64], traj: bool| {
            let c = FakeCall::new()
                .arg_f64(&x, &[2, 3])
                .args_vuw(v0, &u, &w)
                .arg_f64(&f, &[2, 3])
                .arg_f64(&mu, &[3])
                .ret_f64(&[2, 3])
                .ret_f64(&[2, 3]);
            let mut c = attrs(c);
            if traj {
                c = c.ret_f64(&[steps, 2, 2, 3]);
            }
            assert!(c.call(fk_xla_leapfrog_forward_cpu).is_none());
            c
        };
        // the reference: the kick-drift-kick loop per row
        let (mut xr, mut vr) = (x.clone(), v.clone());
        let h = dt / 2.0;
        for _ in 0..steps {
            for b in 0..2 {
                let r = b * 3..b * 3 + 3;
                let gm = gamma_row(&vr[r.clone()], &u, &w, 2, cl);
                let vh: Vec<f64> = (0..3)
                    .map(|i| vr[b * 3 + i] + h * (f[b * 3 + i] - gm[i] - mu[i] * vr[b * 3 + i]))
                    .collect();
                let gh = gamma_row(&vh, &u, &w, 2, cl);
                for i in 0..3 {
                    xr[b * 3 + i] += dt * vh[i];
                    vr[b * 3 + i] = vh[i] + h * (f[b * 3 + i] - gh[i] - mu[i] * vh[i]);
                }
            }
        }
        let c = forward(&v, true);
        close(&c.out_f64(0), &xr, 1e-14);
        close(&c.out_f64(1), &vr, 1e-14);
        let traj = c.out_f64(2);
        close(&traj[(steps as usize - 1) * 12..][..6], &xr, 0.0);
        close(&forward(&v, false).out_f64(1), &vr, 0.0);

        // backward, from the trajectory and recomputed: the same gradients; want =
        // 2 | 4 | 8 (dv0, df, dU)
        let gx = [1.0, 0.5, -0.5, 0.0, 2.0, 1.0];
        let gv = [0.2, -0.3, 0.1, 0.4, 0.0, -0.1];
        let backward = |traj: Option<&[f64]>| {
            let mut c = FakeCall::new()
                .args_vuw(&v, &u, &w)
                .arg_f64(&f, &[2, 3])
                .arg_f64(&mu, &[3]);
            if let Some(t) = traj {
                c = c.arg_f64(t, &[steps, 2, 2, 3]).attr_i64("has_traj", 1);
            }
            let c = c
                .arg_f64(&gx, &[2, 3])
                .arg_f64(&gv, &[2, 3])
                .ret_f64(&[2, 3])
                .ret_f64(&[2, 3])
                .ret_f64(&[3, 2]);
            let mut c = attrs(c).attr_i64("want", 2 | 4 | 8);
            assert!(c.call(fk_xla_leapfrog_backward_cpu).is_none());
            c
        };
        let a = backward(Some(&traj));
        let b = backward(None);
        for i in 0..3 {
            close(&a.out_f64(i), &b.out_f64(i), 1e-13);
        }
        // dv0 against central differences of <gx, x_T> + <gv, v_T>
        let loss = |v0: &[f64]| -> f64 {
            let c = forward(v0, false);
            let (xt, vt) = (c.out_f64(0), c.out_f64(1));
            (0..6).map(|i| gx[i] * xt[i] + gv[i] * vt[i]).sum()
        };
        close(&a.out_f64(0), &central_diff(&v, 1e-6, loss), 1e-8);
    }

    #[test]
    fn geodesic_errors_are_fusekits() {
        let (v, u, w, x) = geo_problem();
        let mut c = FakeCall::new()
            .args_vuw(&v, &u, &w)
            .ret_f64(&[2, 3])
            .attr_f64("c", -1.0);
        error_of(&mut c, fk_xla_christoffel_forward_cpu, |m| {
            m.starts_with("fk_xla_christoffel_forward_cpu: c = -1")
                && m.ends_with("(FK_ERROR_INVALID_ARGUMENT)")
        });
        // want names more results than the call has
        let mut c = FakeCall::new()
            .args_vuw(&v, &u, &w)
            .arg_f64(&v, &[2, 3])
            .ret_f64(&[2, 3])
            .attr_f64("c", 1.0)
            .attr_i64("want", 3);
        error_of(&mut c, fk_xla_christoffel_backward_cpu, |m| {
            m.contains("the call has 4 operands and 1 results; this handler takes 4 operands and 2 results")
        });
        // has_f says f is there but the operands end early
        let mut c = FakeCall::new()
            .arg_f64(&x, &[2, 3])
            .args_vuw(&v, &u, &w)
            .ret_f64(&[2, 3])
            .ret_f64(&[2, 3])
            .attr_i64("has_f", 1)
            .attr_f64("dt", 0.1)
            .attr_i64("steps", 0)
            .attr_f64("c", 1.0);
        error_of(&mut c, fk_xla_leapfrog_forward_cpu, |m| {
            m.contains("this handler takes 5 operands")
        });
        let mut c = FakeCall::new()
            .arg_f64(&x, &[2, 3])
            .args_vuw(&v, &u, &w)
            .ret_f64(&[2, 3])
            .ret_f64(&[2, 3])
            .attr_f64("dt", 0.1)
            .attr_i64("steps", 0)
            .attr_f64("c", 1.0);
        let e = c.call(fk_xla_leapfrog_forward_cpu).expect("an error");
        assert_eq!(
            e.msg,
            "fk_xla_leapfrog_forward_cpu: steps (T) = 0 must be >= 1 (FK_ERROR_INVALID_ARGUMENT)"
        );
    }

    // ------------------------------------------------------------ optimizer math

    #[test]
    fn matrix_power_newton_and_eigh_on_the_cpu() {
        // a batch of two SPD matrices: diag(4, 9) and [[2, 1], [1, 2]]
        let a = [4.0, 0.0, 0.0, 9.0, 2.0, 1.0, 1.0, 2.0];
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 2, 2])
            .ret_f64(&[2, 2, 2])
            .attr_f64("power", -0.5)
            .attr_i64("max_iter", 40);
        assert!(c.call(fk_xla_matrix_power_cpu).is_none());
        // [[2,1],[1,2]]^(-1/2) = Q diag(3^-1/2, 1) Q^T with Q the (1,1), (1,-1) axes
        let (p, q) = (
            0.5 * (1.0 / 3f64.sqrt() + 1.0),
            0.5 * (1.0 / 3f64.sqrt() - 1.0),
        );
        let want = [0.5, 0.0, 0.0, 1.0 / 3.0, p, q, q, p];
        close(&c.out_f64(0), &want, 1e-12);
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 2, 2])
            .ret_f64(&[2, 2, 2])
            .attr_f64("power", -0.5);
        assert!(c.call(fk_xla_matrix_power_eigh_cpu).is_none());
        close(&c.out_f64(0), &want, 1e-13);
        // Newton computes inverse roots only: fusekit's message
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 2, 2])
            .ret_f64(&[2, 2, 2])
            .attr_f64("power", 0.5)
            .attr_i64("max_iter", 40);
        error_of(&mut c, fk_xla_matrix_power_cpu, |m| {
            m.starts_with("fk_xla_matrix_power_cpu: power = 0.5: the Newton method computes inverse roots only")
        });
    }

    #[test]
    fn shampoo_and_per_sample_ops_on_the_cpu() {
        // G [2, 3]; L = 0.5 L0 + 2 G G^T, R = 0.5 R0 + 2 G^T G
        let g = [1.0, 2.0, 0.0, -1.0, 0.5, 3.0];
        let l0 = [1.0, 0.5, 0.5, 2.0];
        let r0: Vec<f64> = (0..9).map(|i| if i % 4 == 0 { 1.0 } else { 0.0 }).collect();
        let mut c = FakeCall::new()
            .arg_f64(&g, &[2, 3])
            .arg_f64(&l0, &[2, 2])
            .arg_f64(&r0, &[3, 3])
            .ret_f64(&[2, 2])
            .ret_f64(&[3, 3])
            .attr_i64("has_l", 1)
            .attr_i64("has_r", 1)
            .attr_f64("alpha", 2.0)
            .attr_f64("beta", 0.5);
        assert!(c.call(fk_xla_shampoo_stats_cpu).is_none());
        let gg = |i: usize, j: usize| (0..3).map(|k| g[i * 3 + k] * g[j * 3 + k]).sum::<f64>();
        let l: Vec<f64> = (0..4)
            .map(|e| 0.5 * l0[e] + 2.0 * gg(e / 2, e % 2))
            .collect();
        close(&c.out_f64(0), &l, 1e-14);
        let gtg = |i: usize, j: usize| (0..2).map(|k| g[k * 3 + i] * g[k * 3 + j]).sum::<f64>();
        let r: Vec<f64> = (0..9)
            .map(|e| 0.5 * r0[e] + 2.0 * gtg(e / 3, e % 3))
            .collect();
        close(&c.out_f64(1), &r, 1e-14);
        // only R; beta = 0 reads nothing of R0 (NaN there is ignored)
        let mut c = FakeCall::new()
            .arg_f64(&g, &[2, 3])
            .arg_f64(&[f64::NAN; 9], &[3, 3])
            .ret_f64(&[3, 3])
            .attr_i64("has_r", 1)
            .attr_f64("alpha", 1.0)
            .attr_f64("beta", 0.0);
        assert!(c.call(fk_xla_shampoo_stats_cpu).is_none());
        let r: Vec<f64> = (0..9).map(|e| gtg(e / 3, e % 3)).collect();
        close(&c.out_f64(0), &r, 1e-14);

        // precondition with the left root only: out = L G
        let mut c = FakeCall::new()
            .arg_f64(&g, &[2, 3])
            .arg_f64(&l0, &[2, 2])
            .ret_f64(&[2, 3])
            .attr_i64("has_l", 1);
        assert!(c.call(fk_xla_shampoo_precondition_cpu).is_none());
        let lg: Vec<f64> = (0..6)
            .map(|e| (0..2).map(|k| l0[(e / 3) * 2 + k] * g[k * 3 + e % 3]).sum())
            .collect();
        close(&c.out_f64(0), &lg, 1e-14);

        // per-sample: a [2, 3], g [2, 2]; |G_b|^2 = |g_b|^2 |a_b|^2
        let a = [1.0, 2.0, 2.0, 0.0, 3.0, 4.0];
        let gs = [3.0, 4.0, 1.0, 0.0];
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 3])
            .arg_f64(&gs, &[2, 2])
            .ret_f64(&[2]);
        assert!(c.call(fk_xla_per_sample_grad_norms_cpu).is_none());
        close(&c.out_f64(0), &[225.0, 25.0], 1e-14);
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 3])
            .arg_f64(&gs, &[2, 2])
            .ret_f64(&[2, 2, 3]);
        assert!(c.call(fk_xla_per_sample_grads_cpu).is_none());
        assert_eq!(&c.out_f64(0)[..6], &[3.0, 6.0, 6.0, 4.0, 8.0, 8.0]);
        // clipped at 5: sample 0 (norm 15) scaled by 1/3, sample 1 (norm 5) kept
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 3])
            .arg_f64(&gs, &[2, 2])
            .ret_f64(&[2, 3])
            .ret_f64(&[2])
            .attr_f64("max_norm", 5.0);
        assert!(c.call(fk_xla_dp_clipped_grad_sum_cpu).is_none());
        let want: Vec<f64> = (0..6)
            .map(|e| {
                let (o, i) = (e / 3, e % 3);
                gs[o] * a[i] / 3.0 + gs[2 + o] * a[3 + i]
            })
            .collect();
        close(&c.out_f64(0), &want, 1e-14);
        close(&c.out_f64(1), &[225.0, 25.0], 1e-14);
        let mut c = FakeCall::new()
            .arg_f64(&a, &[2, 3])
            .arg_f64(&gs, &[2, 2])
            .ret_f64(&[2, 3])
            .attr_f64("max_norm", -1.0);
        error_of(&mut c, fk_xla_dp_clipped_grad_sum_cpu, |m| {
            m.starts_with("fk_xla_dp_clipped_grad_sum_cpu: max_norm")
        });
    }

    // ------------------------------------------------------------ MLP

    /// `a [m, k]` times `b^T` (`b [n, k]`): `[m, n]`.
    fn mm_t(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        (0..m)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| (0..k).map(|t| a[i * k + t] * b[j * k + t]).sum())
            .collect()
    }

    /// `a^T [k, m]` (`a [m, k]`).
    fn tr(a: &[f64], m: usize, k: usize) -> Vec<f64> {
        (0..k)
            .flat_map(|j| (0..m).map(move |i| (i, j)))
            .map(|(i, j)| a[i * k + j])
            .collect()
    }

    fn f64s(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&v| v as f64).collect()
    }

    fn saved_bytes(kind: i32, widths: &[i64], rows: i64, hidden: i32, out: i32) -> (i32, usize) {
        let mut v = usize::MAX;
        let n = widths.len() as i32 - 1;
        // SAFETY: widths holds n + 1 entries; v is writable.
        let s = unsafe {
            fk_xla_mlp_saved_bytes(kind, n, widths.as_ptr(), rows, 3, hidden, out, &mut v)
        };
        (s, v)
    }

    fn mlp_workspace(kind: i32, widths: &[i64], rows: i64, dtype: i32) -> (i32, usize) {
        let mut v = usize::MAX;
        let n = widths.len() as i32 - 1;
        // SAFETY: widths holds n + 1 entries; v is writable.
        let s =
            unsafe { fk_xla_mlp_workspace_bytes(kind, n, widths.as_ptr(), rows, dtype, &mut v) };
        (s, v)
    }

    #[test]
    fn mlp_workspace_query() {
        use crate::error::{FK_ERROR_INVALID_ARGUMENT, FK_OK};
        // the CPU needs none; CUDA at least every layer's dz (bf16: 2 bytes) and
        // grows with the rows
        assert_eq!(mlp_workspace(1, &[32, 64, 64, 16], 1000, 2), (FK_OK, 0));
        let (s, small) = mlp_workspace(2, &[32, 64, 64, 16], 1000, 2);
        assert_eq!(s, FK_OK);
        assert!(small >= 1000 * (64 + 64 + 16) * 2, "{small}");
        let (_, large) = mlp_workspace(2, &[32, 64, 64, 16], 100_000, 2);
        assert!(large > 50 * small, "{small} -> {large}");
        // bad layer counts, widths, rows, dtypes
        assert_eq!(mlp_workspace(2, &[3], 8, 3).0, FK_ERROR_INVALID_ARGUMENT);
        assert_eq!(
            mlp_workspace(2, &[3, -4], 8, 3).0,
            FK_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            mlp_workspace(2, &[3, 4], -8, 3).0,
            FK_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            mlp_workspace(2, &[3, 4], 8, 99).0,
            FK_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(mlp_workspace(7, &[3, 4], 8, 3).0, FK_ERROR_INVALID_ARGUMENT);
        // SAFETY: a NULL out-parameter is refused, not written
        let s = unsafe {
            fk_xla_mlp_workspace_bytes(2, 1, [3i64, 4].as_ptr(), 8, 3, std::ptr::null_mut())
        };
        assert_eq!(s, crate::error::FK_ERROR_NULL_POINTER);
    }

    #[test]
    fn mlp_forward_and_backward_on_the_cpu() {
        // x [2, 3] -> relu(x W0^T) [2, 4] -> h W1^T + b1 [2, 2]; layer 0 has no bias
        let x = [1.0f32, -2.0, 0.5, 0.25, 1.5, -1.0];
        let w0: Vec<f32> = (0..12).map(|i| ((i * 7 % 11) as f32 - 5.0) / 8.0).collect();
        let w1: Vec<f32> = (0..8).map(|i| ((i * 5 % 9) as f32 - 4.0) / 6.0).collect();
        let b1 = [0.3f32, -0.7];
        let (xd, w0d, w1d) = (f64s(&x), f64s(&w0), f64s(&w1));
        let z0 = mm_t(&xd, &w0d, 2, 3, 4);
        assert!(z0.iter().any(|&v| v < 0.0) && z0.iter().any(|&v| v > 0.0));
        let h: Vec<f64> = z0.iter().map(|v| v.max(0.0)).collect();
        let y: Vec<f64> = mm_t(&h, &w1d, 2, 4, 2)
            .iter()
            .enumerate()
            .map(|(i, v)| v + b1[i % 2] as f64)
            .collect();

        let (s, nbytes) = saved_bytes(1, &[3, 4, 2], 2, 1, 0);
        assert_eq!(s, 0);
        assert!(nbytes > 0);
        // the same size on both kinds (no device opened)
        assert_eq!(saved_bytes(2, &[3, 4, 2], 2, 1, 0), (0, nbytes));
        let words = nbytes.div_ceil(4) as i64;
        let mut c = FakeCall::new()
            .arg_f32(&x, &[2, 3])
            .arg_f32(&w0, &[4, 3])
            .arg_f32(&w1, &[2, 4])
            .arg_f32(&b1, &[2])
            .ret_f32(&[2, 2])
            .ret_f32(&[words])
            .attr_i64("n_layers", 2)
            .attr_i64("hidden_act", 1)
            .attr_i64("out_act", 0)
            .attr_i64("bias_mask", 0b10);
        assert!(c.call(fk_xla_mlp_forward_cpu).is_none());
        close(&f64s(&c.out_f32(0)), &y, 1e-6);
        let saved = c.out_f32(1);

        // backward: dx, dW0, dW1, db1
        let dy = [1.0f32, -0.5, 0.25, 2.0];
        let dyd = f64s(&dy);
        let dw1 = mm_t(&tr(&dyd, 2, 2), &tr(&h, 2, 4), 2, 2, 4);
        let db1 = [dyd[0] + dyd[2], dyd[1] + dyd[3]];
        let dh = mm_t(&dyd, &tr(&w1d, 2, 4), 2, 2, 4);
        let dz0: Vec<f64> = dh
            .iter()
            .zip(&z0)
            .map(|(g, z)| if *z > 0.0 { *g } else { 0.0 })
            .collect();
        let dw0 = mm_t(&tr(&dz0, 2, 4), &tr(&xd, 2, 3), 4, 2, 3);
        let dx = mm_t(&dz0, &tr(&w0d, 4, 3), 2, 4, 3);
        let backward = |want_dx: bool, dw_mask: i64, db_mask: i64, rets: &[&[i64]]| {
            let mut c = FakeCall::new()
                .arg_f32(&dy, &[2, 2])
                .arg_f32(&x, &[2, 3])
                .arg_f32(&w0, &[4, 3])
                .arg_f32(&w1, &[2, 4])
                .arg_f32(&saved, &[words]);
            for r in rets {
                c = c.ret_f32(r);
            }
            // the workspace (empty: the CPU needs none)
            let mut c = c
                .ret_f32(&[0])
                .attr_i64("n_layers", 2)
                .attr_i64("hidden_act", 1)
                .attr_i64("out_act", 0)
                .attr_i64("want_dx", want_dx as i64)
                .attr_i64("dw_mask", dw_mask)
                .attr_i64("db_mask", db_mask);
            let e = c.call(fk_xla_mlp_backward_cpu);
            assert!(e.is_none(), "{e:?}");
            c
        };
        let c = backward(true, 0b11, 0b10, &[&[2, 3], &[4, 3], &[2, 4], &[2]]);
        close(&f64s(&c.out_f32(0)), &dx, 1e-6);
        close(&f64s(&c.out_f32(1)), &dw0, 1e-6);
        close(&f64s(&c.out_f32(2)), &dw1, 1e-6);
        close(&f64s(&c.out_f32(3)), &db1, 1e-6);
        // only some gradients: dW0 alone, then dx alone
        let c = backward(false, 0b01, 0, &[&[4, 3]]);
        close(&f64s(&c.out_f32(0)), &dw0, 1e-6);
        let c = backward(true, 0, 0, &[&[2, 3]]);
        close(&f64s(&c.out_f32(0)), &dx, 1e-6);
    }

    #[test]
    fn mlp_errors_are_fusekits() {
        let forward = |w1: &[i64], bias_mask: i64, saved: i64| {
            let n: i64 = w1.iter().product();
            FakeCall::new()
                .arg_f32(&[0.0; 6], &[2, 3])
                .arg_f32(&[0.0; 12], &[4, 3])
                .arg_f32(&vec![0.0; n as usize], w1)
                .ret_f32(&[2, w1[0]])
                .ret_f32(&[saved])
                .attr_i64("n_layers", 2)
                .attr_i64("hidden_act", 3)
                .attr_i64("out_act", 0)
                .attr_i64("bias_mask", bias_mask)
        };
        // layers that do not chain: the ops layer's message
        let mut c = forward(&[2, 5], 0, 64);
        let e = error_of(&mut c, fk_xla_mlp_forward_cpu, |m| {
            m == "fk_xla_mlp_forward_cpu: weights[1] has shape [2, 5] but layer 1 takes 4 inputs (layer 0 gives 4) (FK_ERROR_SHAPE_MISMATCH)"
        });
        assert_eq!(e.errc, XLA_FFI_ERROR_CODE_INVALID_ARGUMENT);
        // saved too small
        let (_, need) = saved_bytes(1, &[3, 4, 2], 2, 3, 0);
        let mut c = forward(&[2, 4], 0, (need / 4) as i64 - 1);
        error_of(&mut c, fk_xla_mlp_forward_cpu, |m| {
            m.starts_with("fk_xla_mlp_forward_cpu: saved holds")
                && m.ends_with("(FK_ERROR_BUFFER_TOO_SMALL)")
        });
        // a bias bit with no operand for it: the operand count
        let mut c = forward(&[2, 4], 0b01, 64);
        error_of(&mut c, fk_xla_mlp_forward_cpu, |m| {
            m.contains("the call has 3 operands and 2 results; this handler takes 4 operands")
        });
        // a mask bit beyond the layers, n_layers out of range, an unknown activation
        let mut c = forward(&[2, 4], 0b100, 64);
        error_of(&mut c, fk_xla_mlp_forward_cpu, |m| {
            m.contains("bias_mask = 0x4 has a bit at or above n_layers = 2")
        });
        let mut c = FakeCall::new()
            .arg_f32(&[0.0; 6], &[2, 3])
            .ret_f32(&[2, 3])
            .ret_f32(&[1])
            .attr_i64("n_layers", 65)
            .attr_i64("hidden_act", 0)
            .attr_i64("out_act", 0);
        error_of(&mut c, fk_xla_mlp_forward_cpu, |m| {
            m == "fk_xla_mlp_forward_cpu: n_layers = 65 is outside 1..=64 (FK_MLP_MAX_LAYERS) (FK_ERROR_INVALID_ARGUMENT)"
        });
        // a backward without its workspace result: the result count
        let mut c = FakeCall::new()
            .arg_f32(&[0.0; 2], &[2, 1])
            .arg_f32(&[0.0; 6], &[2, 3])
            .arg_f32(&[0.0; 3], &[1, 3])
            .arg_f32(&[0.0; 1], &[1])
            .ret_f32(&[2, 3])
            .attr_i64("n_layers", 1)
            .attr_i64("hidden_act", 0)
            .attr_i64("out_act", 0);
        error_of(&mut c, fk_xla_mlp_backward_cpu, |m| {
            m.contains("the call has 4 operands and 1 results; this handler takes 4 operands and 2 results")
        });
        let mut c = FakeCall::new()
            .attr_i64("n_layers", 1)
            .attr_i64("hidden_act", 0)
            .attr_i64("out_act", 7);
        error_of(&mut c, fk_xla_mlp_backward_cpu, |m| {
            m.starts_with("fk_xla_mlp_backward_cpu: out_act = 7 is not a valid fk_activation")
        });
        // the size query's checks
        assert_eq!(
            saved_bytes(1, &[3, -1], 2, 0, 0).0,
            crate::error::FK_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            saved_bytes(7, &[3, 4], 2, 0, 0).0,
            crate::error::FK_ERROR_INVALID_ARGUMENT
        );
        // one layer without activation saves nothing
        assert_eq!(saved_bytes(1, &[3, 4], 2, 0, 0), (0, 0));
    }
}
