//! The plans: what validated code (`ops`) hands a backend (`cpu`, `cuda`), one
//! module per op family. Plans carry addresses (`addr::Addr`) that only validated
//! code makes, and sizes already checked; they sit below both backends, which
//! import them and nothing of `ops`.

pub mod elementwise;
pub mod gaussian;
pub mod geodesic;
pub mod linalg;
pub mod mlp;
pub mod optim;
