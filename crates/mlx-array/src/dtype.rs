//! Element types.
use mlx_sys as sys;
use std::fmt;

/// The element type of an [`Array`](crate::Array), MLX's `Dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// Boolean (`bool_`).
    Bool,
    /// Unsigned 8-bit integer.
    Uint8,
    /// Unsigned 16-bit integer.
    Uint16,
    /// Unsigned 32-bit integer (packed quantized weights use it).
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer (MLX's default integer type).
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// IEEE half precision.
    Float16,
    /// IEEE single precision (MLX's default float type).
    Float32,
    /// IEEE double precision (CPU only in MLX).
    Float64,
    /// Brain float: float32's exponent range with 8 bits of mantissa.
    Bfloat16,
    /// Complex number of two float32.
    Complex64,
}

impl Dtype {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
            Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
        }
    }

    /// Floating point (real or complex).
    pub fn is_floating(self) -> bool {
        matches!(
            self,
            Dtype::Float16 | Dtype::Float32 | Dtype::Float64 | Dtype::Bfloat16 | Dtype::Complex64
        )
    }

    /// Signed or unsigned integer.
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Dtype::Uint8
                | Dtype::Uint16
                | Dtype::Uint32
                | Dtype::Uint64
                | Dtype::Int8
                | Dtype::Int16
                | Dtype::Int32
                | Dtype::Int64
        )
    }

    /// The `(min, max)` values of an integer dtype; `None` for bool and floating dtypes.
    pub fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            Dtype::Uint8 => (0, u8::MAX.into()),
            Dtype::Uint16 => (0, u16::MAX.into()),
            Dtype::Uint32 => (0, u32::MAX.into()),
            Dtype::Uint64 => (0, u64::MAX.into()),
            Dtype::Int8 => (i8::MIN.into(), i8::MAX.into()),
            Dtype::Int16 => (i16::MIN.into(), i16::MAX.into()),
            Dtype::Int32 => (i32::MIN.into(), i32::MAX.into()),
            Dtype::Int64 => (i64::MIN.into(), i64::MAX.into()),
            _ => return None,
        })
    }

    /// The `(lowest, highest)` finite values of a floating dtype, like `mx.finfo(d).min`
    /// and `.max`; `None` for other dtypes.
    pub fn finfo(self) -> Option<(f64, f64)> {
        let max = match self {
            Dtype::Float16 => f64::from(half::f16::MAX),
            Dtype::Bfloat16 => f64::from(half::bf16::MAX),
            Dtype::Float32 | Dtype::Complex64 => f64::from(f32::MAX),
            Dtype::Float64 => f64::MAX,
            _ => return None,
        };
        Some((-max, max))
    }

    /// MLX's name for the dtype (`float32`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Uint8 => "uint8",
            Dtype::Uint16 => "uint16",
            Dtype::Uint32 => "uint32",
            Dtype::Uint64 => "uint64",
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::Float16 => "float16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Complex64 => "complex64",
        }
    }

    /// Parses MLX's name (also accepts `bool_`, `half`, `float`, `bf16`...).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Some(match name {
            "bool" | "bool_" => Dtype::Bool,
            "uint8" => Dtype::Uint8,
            "uint16" => Dtype::Uint16,
            "uint32" => Dtype::Uint32,
            "uint64" => Dtype::Uint64,
            "int8" => Dtype::Int8,
            "int16" => Dtype::Int16,
            "int32" => Dtype::Int32,
            "int64" => Dtype::Int64,
            "float16" | "half" | "f16" => Dtype::Float16,
            "float32" | "float" | "f32" => Dtype::Float32,
            "float64" | "double" | "f64" => Dtype::Float64,
            "bfloat16" | "bf16" => Dtype::Bfloat16,
            "complex64" => Dtype::Complex64,
            _ => return None,
        })
    }

    pub(crate) fn to_raw(self) -> i32 {
        (match self {
            Dtype::Bool => sys::MLXS_BOOL,
            Dtype::Uint8 => sys::MLXS_UINT8,
            Dtype::Uint16 => sys::MLXS_UINT16,
            Dtype::Uint32 => sys::MLXS_UINT32,
            Dtype::Uint64 => sys::MLXS_UINT64,
            Dtype::Int8 => sys::MLXS_INT8,
            Dtype::Int16 => sys::MLXS_INT16,
            Dtype::Int32 => sys::MLXS_INT32,
            Dtype::Int64 => sys::MLXS_INT64,
            Dtype::Float16 => sys::MLXS_FLOAT16,
            Dtype::Float32 => sys::MLXS_FLOAT32,
            Dtype::Float64 => sys::MLXS_FLOAT64,
            Dtype::Bfloat16 => sys::MLXS_BFLOAT16,
            Dtype::Complex64 => sys::MLXS_COMPLEX64,
        }) as i32
    }

    pub(crate) fn from_raw(v: i32) -> Dtype {
        match v as u32 {
            sys::MLXS_BOOL => Dtype::Bool,
            sys::MLXS_UINT8 => Dtype::Uint8,
            sys::MLXS_UINT16 => Dtype::Uint16,
            sys::MLXS_UINT32 => Dtype::Uint32,
            sys::MLXS_UINT64 => Dtype::Uint64,
            sys::MLXS_INT8 => Dtype::Int8,
            sys::MLXS_INT16 => Dtype::Int16,
            sys::MLXS_INT32 => Dtype::Int32,
            sys::MLXS_INT64 => Dtype::Int64,
            sys::MLXS_FLOAT16 => Dtype::Float16,
            sys::MLXS_FLOAT64 => Dtype::Float64,
            sys::MLXS_BFLOAT16 => Dtype::Bfloat16,
            sys::MLXS_COMPLEX64 => Dtype::Complex64,
            _ => Dtype::Float32,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A host type that maps to one MLX dtype, for building arrays and reading them back.
pub trait Element: Copy + Default + 'static {
    /// The matching dtype.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(
    bool => Bool, u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    half::f16 => Float16, f32 => Float32, f64 => Float64, half::bf16 => Bfloat16,
);
