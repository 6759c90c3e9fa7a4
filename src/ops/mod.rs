//! One module per op family: argument validation (shapes, dtypes, devices,
//! aliasing), then dispatch to `cpu/` or `cuda/`.

pub mod check;
pub mod elementwise;
pub mod gaussian;
pub mod geodesic;
pub mod linalg;
pub mod mlp;
pub mod optim;
