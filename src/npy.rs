//! Minimal `.npy` (format 1.0/2.0) reading and writing: little-endian f32, f64, i32, i64, C order.
//! Used by `--dump` and by the parity tests against the golden intermediates.

use std::path::Path;

use ndarray::{ArrayD, IxDyn};

use crate::error::{Error, Result};

/// Element types that can be stored in an `.npy` file.
pub trait NpyElem: Copy + Default + 'static {
    const DESCR: &'static str;
    fn from_le(bytes: &[u8]) -> Self;
    fn write_le(self, out: &mut Vec<u8>);
}

macro_rules! npy_elem {
    ($t:ty, $descr:expr) => {
        impl NpyElem for $t {
            const DESCR: &'static str = $descr;
            fn from_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}
npy_elem!(f32, "<f4");
npy_elem!(f64, "<f8");
npy_elem!(i32, "<i4");
npy_elem!(i64, "<i8");

/// A loaded array whose element type is only known at run time.
#[derive(Debug, Clone)]
pub enum NpyArray {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
}

impl NpyArray {
    pub fn shape(&self) -> &[usize] {
        match self {
            NpyArray::F32(a) => a.shape(),
            NpyArray::F64(a) => a.shape(),
            NpyArray::I32(a) => a.shape(),
            NpyArray::I64(a) => a.shape(),
        }
    }
    /// Converts any element type to f32 (ids convert exactly below 2^24).
    pub fn to_f32(&self) -> ArrayD<f32> {
        match self {
            NpyArray::F32(a) => a.clone(),
            NpyArray::F64(a) => a.mapv(|v| v as f32),
            NpyArray::I32(a) => a.mapv(|v| v as f32),
            NpyArray::I64(a) => a.mapv(|v| v as f32),
        }
    }
    /// Converts integer arrays to i64; float arrays are refused.
    pub fn to_i64(&self, path: &Path) -> Result<ArrayD<i64>> {
        match self {
            NpyArray::I32(a) => Ok(a.mapv(i64::from)),
            NpyArray::I64(a) => Ok(a.clone()),
            _ => Err(Error::invalid(format!("{}: expected an integer array", path.display()))),
        }
    }
}

fn bad(path: &Path, msg: &str) -> Error {
    Error::invalid(format!("{}: not a supported .npy file ({msg})", path.display()))
}

/// Reads an `.npy` file of f32, f64, i32 or i64 in C order.
pub fn read(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad(path, "missing magic"));
    }
    let major = bytes[6];
    let (header_len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad(path, "truncated header"));
            }
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        _ => return Err(bad(path, "unknown version")),
    };
    let header = bytes
        .get(start..start + header_len)
        .ok_or_else(|| bad(path, "truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad(path, "header is not text"))?;
    let descr = dict_value(header, "descr").ok_or_else(|| bad(path, "no descr"))?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    if dict_value(header, "fortran_order").map(|v| v.starts_with("True")) == Some(true) {
        return Err(bad(path, "fortran order"));
    }
    let shape_src = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad(path, "no shape"))?;
    let shape: Vec<usize> = shape_src
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad(path, "bad shape")))
        .collect::<Result<_>>()?;
    let data = &bytes[start + header_len..];
    match descr {
        "<f4" => Ok(NpyArray::F32(decode(data, &shape, path)?)),
        "<f8" => Ok(NpyArray::F64(decode(data, &shape, path)?)),
        "<i4" => Ok(NpyArray::I32(decode(data, &shape, path)?)),
        "<i8" => Ok(NpyArray::I64(decode(data, &shape, path)?)),
        other => Err(bad(path, &format!("dtype {other}"))),
    }
}

fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("'{key}':");
    let rest = header.split(pat.as_str()).nth(1)?.trim_start();
    Some(rest.split(',').next()?.trim())
}

fn decode<T: NpyElem>(data: &[u8], shape: &[usize], path: &Path) -> Result<ArrayD<T>> {
    let n: usize = shape.iter().product();
    let size = std::mem::size_of::<T>();
    if data.len() < n * size {
        return Err(bad(path, "truncated data"));
    }
    let values: Vec<T> = data[..n * size].chunks_exact(size).map(T::from_le).collect();
    ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|_| bad(path, "shape/data mismatch"))
}

/// Encodes an array as `.npy` bytes (version 1.0, C order).
pub fn encode<T: NpyElem>(shape: &[usize], values: &[T]) -> Vec<u8> {
    let shape_txt = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", T::DESCR, shape_txt);
    // Pad so that the data starts on a 64-byte boundary, ending the header with '\n'.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + std::mem::size_of_val(values));
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &v in values {
        v.write_le(&mut out);
    }
    out
}

/// Writes an array to `path` as `.npy`.
pub fn write<T: NpyElem>(path: &Path, shape: &[usize], values: &[T]) -> Result<()> {
    crate::fsx::Dest::new(path, "the array file").write(&encode(shape, values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_f32_and_i64() {
        let dir = std::env::temp_dir().join(format!("cosy-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.npy");
        write(&p, &[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, -6.5]).unwrap();
        match read(&p).unwrap() {
            NpyArray::F32(a) => {
                assert_eq!(a.shape(), &[2, 3]);
                assert_eq!(a[[1, 2]], -6.5);
            }
            other => panic!("wrong type {other:?}"),
        }
        let q = dir.join("b.npy");
        write(&q, &[3], &[7i64, -1, 6561]).unwrap();
        let back = read(&q).unwrap().to_i64(&q).unwrap();
        assert_eq!(back.as_slice().unwrap(), &[7, -1, 6561]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn refuses_garbage() {
        let dir = std::env::temp_dir().join(format!("cosy-npy-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.npy");
        std::fs::write(&p, b"hello").unwrap();
        assert!(read(&p).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
