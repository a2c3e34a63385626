//! A Rust decoder for GGUF tensor data, used when a file holds types that MLX's loader
//! gets wrong or cannot load (K-quants, Q5_0/Q5_1, BF16).
//!
//! Block formats whose values are `scale * q + bias` per group of 32 (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K) become MLX affine-quantized triples exactly (the K-quant sub-block
//! scale `d * sc` and min `dmin * m` are rounded to float16 like the other scales); Q2_K,
//! Q3_K and Q6_K, whose groups are 16 wide (MLX's smallest group is 32), are dequantized to
//! float16. MLX packs `bits`-wide values as one little-endian bit stream per row of uint32
//! words, which is what [`pack_row`] writes.
use crate::error::{io_err, mlx_err, GgufError, Result};
use crate::header::{GgmlType, GgufHeader, TensorInfo};
use half::f16;
use mlx_array::{Array, Dtype};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};

/// How a tensor type is represented in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// A plain array of this dtype.
    Plain(Dtype),
    /// An affine-quantized triple.
    Affine {
        /// Bits per value.
        bits: i32,
        /// Values per group (always 32 here).
        group_size: i32,
    },
    /// Dequantized to float16.
    Dequantized,
}

/// The output form of `t`, or `None` when this crate cannot decode it.
pub fn form(t: GgmlType) -> Option<Form> {
    let affine = |bits| {
        Some(Form::Affine {
            bits,
            group_size: 32,
        })
    };
    match t.0 {
        0 => Some(Form::Plain(Dtype::Float32)),
        1 => Some(Form::Plain(Dtype::Float16)),
        30 => Some(Form::Plain(Dtype::Bfloat16)),
        24 => Some(Form::Plain(Dtype::Int8)),
        25 => Some(Form::Plain(Dtype::Int16)),
        26 => Some(Form::Plain(Dtype::Int32)),
        2 | 3 | 12 => affine(4),
        6 | 7 | 13 => affine(5),
        8 => affine(8),
        10 | 11 | 14 => Some(Form::Dequantized),
        _ => None,
    }
}

fn h(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// One block decoded as `(values q, scale and bias per group of 32)`.
struct Affine {
    q: Vec<u8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

/// The 6-bit scale and min of sub-block `j` in a Q4_K/Q5_K `scales[12]` array.
fn scale_min_k4(j: usize, sc: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((sc[j] & 63) as f32, (sc[j + 4] & 63) as f32)
    } else {
        (
            ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)) as f32,
            ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) as f32,
        )
    }
}

/// Decodes one block of an affine-representable type into `out`.
fn affine_block(t: u32, b: &[u8], out: &mut Affine) {
    match t {
        // Q4_0: d, 16 bytes of nibbles (low: 0..16, high: 16..32), values (q - 8) * d.
        2 | 3 => {
            let d = h(b);
            let (bias, qs) = if t == 2 {
                (-8.0 * d, &b[2..18])
            } else {
                (h(&b[2..]), &b[4..20])
            };
            out.q.extend(qs.iter().map(|x| x & 15));
            out.q.extend(qs.iter().map(|x| x >> 4));
            out.scales.push(d);
            out.biases.push(bias);
        }
        // Q5_0/Q5_1: like Q4_0/Q4_1 with a fifth bit from a 32-bit mask.
        6 | 7 => {
            let d = h(b);
            let (bias, rest) = if t == 6 {
                (-16.0 * d, &b[2..])
            } else {
                (h(&b[2..]), &b[4..])
            };
            let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let qs = &rest[4..20];
            out.q.extend(
                qs.iter()
                    .enumerate()
                    .map(|(j, x)| (x & 15) | ((((qh >> j) & 1) as u8) << 4)),
            );
            out.q.extend(
                qs.iter()
                    .enumerate()
                    .map(|(j, x)| (x >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4)),
            );
            out.scales.push(d);
            out.biases.push(bias);
        }
        // Q8_0: d, 32 int8; shifted to unsigned with bias -128 d.
        8 => {
            let d = h(b);
            out.q
                .extend(b[2..34].iter().map(|x| (*x as i8 as i16 + 128) as u8));
            out.scales.push(d);
            out.biases.push(-128.0 * d);
        }
        // Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales/mins, [Q5_K: 32 bytes of high
        // bits], 128 bytes of nibbles; 4 chunks of 64 = two sub-blocks (low, high nibbles).
        12 | 13 => {
            let (d, dmin, sc) = (h(b), h(&b[2..]), &b[4..16]);
            let (qh, qs) = if t == 13 {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for j in 0..4 {
                let ql = &qs[32 * j..32 * j + 32];
                for (half, shift) in [(0usize, 0u8), (1, 4)] {
                    let (s, m) = scale_min_k4(2 * j + half, sc);
                    out.scales.push(d * s);
                    out.biases.push(-dmin * m);
                    let bit = 1u8 << (2 * j + half);
                    out.q.extend(ql.iter().enumerate().map(|(l, x)| {
                        let hi = if t == 13 && qh[l] & bit != 0 { 16 } else { 0 };
                        ((x >> shift) & 15) + hi
                    }));
                }
            }
        }
        _ => {}
    }
}

/// Dequantizes one Q2_K/Q3_K/Q6_K block (256 values) into `y`.
fn dequant_block(t: u32, b: &[u8], y: &mut Vec<f32>) {
    match t {
        // Q2_K: scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin.
        10 => {
            let (sc, qs, d, dmin) = (&b[0..16], &b[16..80], h(&b[80..]), h(&b[82..]));
            let mut is = 0;
            for n in 0..2 {
                let q = &qs[32 * n..32 * n + 32];
                for shift in [0u32, 2, 4, 6] {
                    for part in 0..2 {
                        let s = sc[is];
                        is += 1;
                        let (dl, ml) = (d * (s & 0xF) as f32, dmin * (s >> 4) as f32);
                        y.extend(
                            q[16 * part..16 * part + 16]
                                .iter()
                                .map(|x| dl * ((x >> shift) & 3) as f32 - ml),
                        );
                    }
                }
            }
        }
        // Q3_K: hmask[32], qs[64], scales[12] (16 6-bit scales), d.
        11 => {
            let (hm, qs, raw, d) = (&b[0..32], &b[32..96], &b[96..108], h(&b[108..]));
            let word = |i: usize| {
                u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]])
            };
            let (a0, a1, tmp) = (word(0), word(1), word(2));
            let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
            let aux = [
                (a0 & k2) | ((tmp & k1) << 4),
                (a1 & k2) | (((tmp >> 2) & k1) << 4),
                ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
            ];
            let scale = |i: usize| (aux[i / 4].to_le_bytes()[i % 4] as i8 as i32 - 32) as f32;
            let mut is = 0;
            let mut m = 1u8;
            for n in 0..2 {
                let q = &qs[32 * n..32 * n + 32];
                for shift in [0u32, 2, 4, 6] {
                    for part in 0..2 {
                        let dl = d * scale(is);
                        is += 1;
                        for l in 16 * part..16 * part + 16 {
                            let low = ((q[l] >> shift) & 3) as i32;
                            let v = low - if hm[l] & m != 0 { 0 } else { 4 };
                            y.push(dl * v as f32);
                        }
                    }
                    m <<= 1;
                }
            }
        }
        // Q6_K: ql[128], qh[64], scales[16] (int8), d.
        14 => {
            let d = h(&b[208..]);
            for n in 0..2 {
                let (ql, qh, sc) = (
                    &b[64 * n..64 * n + 64],
                    &b[128 + 32 * n..160 + 32 * n],
                    &b[192 + 8 * n..200 + 8 * n],
                );
                let mut out = [0f32; 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q = |low: u8, shift: u32| {
                        ((low | (((qh[l] >> shift) & 3) << 4)) as i32 - 32) as f32
                    };
                    let s = |k: usize| d * sc[k] as i8 as f32;
                    out[l] = s(is) * q(ql[l] & 0xF, 0);
                    out[l + 32] = s(is + 2) * q(ql[l + 32] & 0xF, 2);
                    out[l + 64] = s(is + 4) * q(ql[l] >> 4, 4);
                    out[l + 96] = s(is + 6) * q(ql[l + 32] >> 4, 6);
                }
                y.extend(out);
            }
        }
        _ => {}
    }
}

/// Packs one row of `bits`-wide values as MLX does: a little-endian bit stream in u32 words.
pub fn pack_row(q: &[u8], bits: u32, out: &mut Vec<u32>) {
    let (mut acc, mut filled) = (0u64, 0u32);
    for &v in q {
        acc |= (v as u64) << filled;
        filled += bits;
        if filled >= 32 {
            out.push(acc as u32);
            acc >>= 32;
            filled -= 32;
        }
    }
    if filled > 0 {
        out.push(acc as u32);
    }
}

/// The values a block-encoded tensor holds (for tests and checks), row-major.
pub fn dequantize_bytes(t: GgmlType, data: &[u8]) -> Result<Vec<f32>> {
    let bad = || GgufError::BadTensor {
        tensor: format!("<{} data>", t.name()),
        problem: "cannot decode".into(),
    };
    let (per_block, block_bytes) = t.block().ok_or_else(bad)?;
    let mut y = Vec::with_capacity(data.len() / block_bytes as usize * per_block as usize);
    match form(t).ok_or_else(bad)? {
        Form::Affine { .. } => {
            for b in data.chunks_exact(block_bytes as usize) {
                let mut a = Affine {
                    q: Vec::new(),
                    scales: Vec::new(),
                    biases: Vec::new(),
                };
                affine_block(t.0, b, &mut a);
                for (i, q) in a.q.iter().enumerate() {
                    y.push(a.scales[i / 32] * *q as f32 + a.biases[i / 32]);
                }
            }
        }
        Form::Dequantized => data
            .chunks_exact(block_bytes as usize)
            .for_each(|b| dequant_block(t.0, b, &mut y)),
        Form::Plain(_) => return Err(bad()),
    }
    Ok(y)
}

fn shape_i32(info: &TensorInfo) -> Result<Vec<i32>> {
    info.shape()
        .iter()
        .map(|d| i32::try_from(*d))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| GgufError::BadTensor {
            tensor: info.name.clone(),
            problem: "a dimension exceeds i32".into(),
        })
}

fn f16_array(v: &[f32], shape: &[i32], name: &str) -> Result<Array> {
    let bytes: Vec<u8> = v
        .iter()
        .flat_map(|x| f16::from_f32(*x).to_le_bytes())
        .collect();
    Array::from_bytes(&bytes, shape, Dtype::Float16).map_err(mlx_err(format!("building `{name}`")))
}

/// Decodes one tensor from its raw bytes into MLX's naming: `name` for plain tensors,
/// `<module>.weight`, `<module>.scales`, `<module>.biases` for affine ones.
fn decode(info: &TensorInfo, data: &[u8], out: &mut BTreeMap<String, Array>) -> Result<()> {
    let unsupported = || GgufError::UnsupportedTensorType {
        tensor: info.name.clone(),
        type_name: info.ggml_type.name(),
    };
    let shape = shape_i32(info)?;
    let cols = info.dims.first().copied().unwrap_or(1) as usize;
    let rows = (info.elements() as usize).checked_div(cols).unwrap_or(0);
    let ctx = |what: &str| format!("decoding `{}` ({what})", info.name);
    match form(info.ggml_type).ok_or_else(unsupported)? {
        Form::Plain(dtype) => {
            let a = Array::from_bytes(data, &shape, dtype).map_err(mlx_err(ctx("plain")))?;
            out.insert(info.name.clone(), a);
        }
        Form::Dequantized => {
            let v = dequantize_bytes(info.ggml_type, data)?;
            out.insert(info.name.clone(), f16_array(&v, &shape, &info.name)?);
        }
        Form::Affine { bits, .. } => {
            let (_, block_bytes) = info.ggml_type.block().ok_or_else(unsupported)?;
            let mut a = Affine {
                q: Vec::with_capacity(cols),
                scales: Vec::with_capacity(rows * cols / 32),
                biases: Vec::with_capacity(rows * cols / 32),
            };
            let mut words = Vec::with_capacity(rows * cols * bits as usize / 32);
            let row_bytes = data.len() / rows.max(1);
            for r in 0..rows {
                a.q.clear();
                for b in data[r * row_bytes..(r + 1) * row_bytes].chunks_exact(block_bytes as usize)
                {
                    affine_block(info.ggml_type.0, b, &mut a);
                }
                pack_row(&a.q, bits as u32, &mut words);
            }
            let module = info.name.strip_suffix(".weight").unwrap_or(&info.name);
            let mut wshape = shape.clone();
            let groups = (cols / 32) as i32;
            if let Some(last) = wshape.last_mut() {
                *last = (cols * bits as usize / 32) as i32;
            }
            let w = Array::from_slice(&words, &wshape).map_err(mlx_err(ctx("weights")))?;
            let mut gshape = shape;
            if let Some(last) = gshape.last_mut() {
                *last = groups;
            }
            out.insert(format!("{module}.weight"), w);
            out.insert(
                format!("{module}.scales"),
                f16_array(&a.scales, &gshape, &info.name)?,
            );
            out.insert(
                format!("{module}.biases"),
                f16_array(&a.biases, &gshape, &info.name)?,
            );
        }
    }
    Ok(())
}

/// Reads and decodes every tensor of the file described by `header`.
pub fn load_tensors(header: &GgufHeader) -> Result<BTreeMap<String, Array>> {
    let mut f = std::fs::File::open(&header.path).map_err(io_err(&header.path))?;
    let mut out = BTreeMap::new();
    for info in &header.tensors {
        let (per_block, block_bytes) =
            info.ggml_type
                .block()
                .ok_or_else(|| GgufError::UnsupportedTensorType {
                    tensor: info.name.clone(),
                    type_name: info.ggml_type.name(),
                })?;
        let n = (info.elements() / per_block * block_bytes) as usize;
        let mut data = vec![0u8; n];
        f.seek(SeekFrom::Start(header.data_offset + info.offset))
            .map_err(io_err(&header.path))?;
        f.read_exact(&mut data).map_err(io_err(&header.path))?;
        decode(info, &data, &mut out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_row_is_a_little_endian_bit_stream() {
        let mut w = Vec::new();
        pack_row(&[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut w);
        assert_eq!(w, vec![0x8765_4321]);
        w.clear();
        // 5-bit values straddle words: the ones at 6 and 7 fill bits 30..40.
        let mut q = [0u8; 32];
        q[6] = 31;
        q[7] = 31;
        pack_row(&q, 5, &mut w);
        assert_eq!(w, vec![0xC000_0000, 0xFF, 0, 0, 0]);
    }
}
