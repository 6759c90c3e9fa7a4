//! A missing NCCL is `FK_ERROR_LIBRARY_NOT_FOUND` with a message saying what to
//! install, never a panic; the CPU's single-rank communicator needs no NCCL.
//! `FK_NCCL_PATH` set to a file that does not exist makes NCCL missing on any
//! machine (when set, only that file is tried). Its own test binary, because the
//! outcome of loading NCCL is cached for the process.

mod common;

use std::ptr::null;

use common::runtime::*;
use common::*;

#[test]
fn missing_nccl_is_a_status_and_cpu_comms_still_work() {
    // SAFETY: the only test of this binary, before any other thread exists.
    unsafe { std::env::set_var("FK_NCCL_PATH", "/nonexistent/fusekit-test/libnccl.so.2") };
    let mut id = [0u8; 128];
    let s = unsafe { fk_comm_unique_id(id.as_mut_ptr()) };
    expect_status(
        s,
        FK_ERROR_LIBRARY_NOT_FOUND,
        &[
            "fk_comm_unique_id",
            "NCCL (libnccl.so.2) could not be loaded",
            "FK_NCCL_PATH",
            "/nonexistent/fusekit-test/libnccl.so.2",
        ],
    );
    // Asked again: the same answer (cached), still no panic.
    expect_status(
        unsafe { fk_comm_unique_id(id.as_mut_ptr()) },
        FK_ERROR_LIBRARY_NOT_FOUND,
        &["fk_comm_unique_id"],
    );

    // CPU communicators, groups and collectives need no NCCL.
    let ctx = Ctx::cpu();
    let comm = Comm::init_rank(&ctx, 1, &id, 0).expect("CPU comm without NCCL");
    let all = Comm::init_all(&[&ctx]).expect("CPU init_all without NCCL");
    ok(fk_comm_group_start());
    let a = Buf::from_vals(&ctx, FK_DTYPE_F32, &[2], &f32s(&[3.0, 4.0]));
    let b = Buf::new(&ctx, FK_DTYPE_F32, &[2]);
    ok(unsafe { fk_all_reduce(comm.0, a.0, b.0, FK_REDUCE_SUM, null()) });
    ok(fk_comm_group_end());
    assert_eq!(b.read(), f32s(&[3.0, 4.0]));
    drop(all);

    // A CUDA communicator would need NCCL: on a GPU machine that is the status.
    if device_count() > 0 {
        let g = Ctx::cuda(0);
        let r = Comm::init_rank(&g, 1, &id, 0);
        assert_eq!(
            r.err(),
            Some(FK_ERROR_LIBRARY_NOT_FOUND),
            "{}",
            last_error()
        );
        assert!(last_error().contains("fk_comm_init_rank"));
        let r = Comm::init_all(&[&g]);
        assert_eq!(
            r.err(),
            Some(FK_ERROR_LIBRARY_NOT_FOUND),
            "{}",
            last_error()
        );
    }
}
