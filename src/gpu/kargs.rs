//! Kernel argument structs, declared once.
//!
//! Every kernel takes one struct by value. `kernel_args!` declares it in Rust only: the
//! `#[repr(C)]` struct the launcher fills, and its C definition (`KernelArgs::c_struct`,
//! the C types spelled from the Rust field types by `CType`), which the module's source
//! puts ahead of the kernel text, next to the generated `#define`s (`c_structs`). The
//! kernel sees the launcher's struct by construction: the same fields, in the same
//! order, of the same sizes, so `repr(C)` and the C compiler lay them out alike.

/// A field type of a kernel argument struct, with its C spelling.
pub trait CType {
    /// The C declaration of a field `name` of this type: `long long n`,
    /// `long long shape[8]`, `KickArgs k`.
    fn c_decl(name: &str) -> String;
}

macro_rules! c_scalars {
    ($($t:ty => $c:literal),+ $(,)?) => {
        $(impl CType for $t {
            fn c_decl(name: &str) -> String {
                format!(concat!($c, " {}"), name)
            }
        })+
    };
}

c_scalars! {
    i64 => "long long",
    u64 => "unsigned long long",
    i32 => "int",
    u32 => "unsigned int",
    f64 => "double",
    f32 => "float",
}

impl<T: CType, const N: usize> CType for [T; N] {
    fn c_decl(name: &str) -> String {
        T::c_decl(&format!("{name}[{N}]"))
    }
}

/// A kernel argument struct made by `kernel_args!`.
pub trait KernelArgs {
    /// Its C definition: `struct Name {\n    long long n;\n ...};\n`.
    fn c_struct() -> String;
}

/// `kernel_args! { struct GeoArgs { B: i64, .. } }`: a kernel argument struct, declared
/// once, with the kernel's struct and field names: the `#[repr(C)]` struct (its fields
/// `pub`; attributes and doc comments pass through) and its `KernelArgs` and `CType`
/// implementations (a struct may hold another, `SwArgs { k: KickArgs, .. }`). Field
/// types: `i64`, `u64`, `i32`, `u32`, `f64`, `f32`, arrays of them, and other such
/// structs.
macro_rules! kernel_args {
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $f:ident: $t:ty),+ $(,)?
    }) => {
        $(#[$m])*
        #[repr(C)]
        #[allow(non_snake_case)]
        $vis struct $name {
            $($(#[$fm])* pub $f: $t),+
        }
        impl $crate::gpu::kargs::KernelArgs for $name {
            fn c_struct() -> String {
                let mut s = String::from(concat!("struct ", stringify!($name), " {\n"));
                $(
                    s.push_str("    ");
                    s.push_str(&<$t as $crate::gpu::kargs::CType>::c_decl(stringify!($f)));
                    s.push_str(";\n");
                )+
                s.push_str("};\n");
                s
            }
        }
        impl $crate::gpu::kargs::CType for $name {
            fn c_decl(name: &str) -> String {
                format!(concat!(stringify!($name), " {}"), name)
            }
        }
    };
}
pub(crate) use kernel_args;

/// The C definitions of a module's argument structs, in order (a struct another
/// holds first), for its source: `c_structs(&[KickArgs::c_struct, SwArgs::c_struct])`.
pub fn c_structs(structs: &[fn() -> String]) -> String {
    let mut s = String::from("// kernel argument structs, declared in Rust (kernel_args!)\n");
    for c in structs {
        s.push_str(&c());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    kernel_args! {
        /// A test struct.
        #[derive(Clone, Copy)]
        struct Inner {
            n: i64,
            /// a doc comment
            p: u64,
        }
    }
    kernel_args! {
        struct Outer {
            k: Inner,
            shape: [i64; 3],
            m: [[f32; 2]; 4],
            x: f64,
            B: i32,
            u: u32,
        }
    }

    #[test]
    fn c_definitions_follow_the_rust_fields() {
        assert_eq!(
            Outer::c_struct(),
            "struct Outer {\n    Inner k;\n    long long shape[3];\n    float m[4][2];\n    double x;\n    int B;\n    unsigned int u;\n};\n"
        );
        assert_eq!(
            c_structs(&[Inner::c_struct]),
            "// kernel argument structs, declared in Rust (kernel_args!)\nstruct Inner {\n    long long n;\n    unsigned long long p;\n};\n"
        );
        let o = Outer {
            k: Inner { n: 1, p: 2 },
            shape: [0; 3],
            m: [[0.0; 2]; 4],
            x: 0.0,
            B: 0,
            u: 0,
        };
        assert_eq!(o.k.n + o.k.p as i64 + i64::from(o.B) + i64::from(o.u), 3);
        assert_eq!(std::mem::size_of::<Outer>(), 16 + 24 + 32 + 8 + 8);
    }
}
