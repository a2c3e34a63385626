//! A small GGUF writer and reference (de)quantizers, written from the GGUF spec, to build
//! test files without llama.cpp.
#![allow(dead_code)]
use half::f16;
use std::path::{Path, PathBuf};

/// A metadata value to write.
pub enum Kv {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
}

/// A tensor to write: GGML type id, GGML dims (`[cols, rows]`) and raw bytes.
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Serializes a GGUF v3 file (alignment 32).
pub fn gguf_bytes(kvs: &[(&str, Kv)], tensors: &[Tensor]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut out, k);
        match v {
            Kv::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Kv::F32(x) => {
                out.extend(6u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Kv::Bool(b) => {
                out.extend(7u32.to_le_bytes());
                out.push(*b as u8);
            }
            Kv::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Kv::Strs(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for s in items {
                    put_str(&mut out, s);
                }
            }
            Kv::F32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(6u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for x in items {
                    out.extend(x.to_le_bytes());
                }
            }
            Kv::I32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for x in items {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.ggml_type.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += (t.data.len() as u64).div_ceil(32) * 32;
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    for t in tensors {
        out.extend(&t.data);
        out.resize(out.len().div_ceil(32) * 32, 0);
    }
    out
}

/// Deterministic pseudo-random floats in [-1, 1).
pub fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect()
}

/// Q8_0 blocks: f16 scale, 32 int8.
pub fn q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        out.extend(f16::from_f32(d).to_le_bytes());
        for v in b {
            let q = if d == 0.0 { 0.0 } else { (v / d).round() };
            out.push(q.clamp(-127.0, 127.0) as i8 as u8);
        }
    }
    out
}

/// Q4_0 blocks: f16 scale, 16 bytes (low nibbles: elements 0..16, high: 16..32), offset 8.
pub fn q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let max = b
            .iter()
            .fold(0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
        let d = max / -8.0;
        out.extend(f16::from_f32(d).to_le_bytes());
        let q = |v: f32| {
            if d == 0.0 {
                8
            } else {
                ((v / d) + 8.5).clamp(0.0, 15.0) as u8
            }
        };
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Q4_1 blocks: f16 scale, f16 min, 16 bytes of nibbles.
pub fn q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let min = b.iter().fold(f32::INFINITY, |m, v| m.min(*v));
        let max = b.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let d = (max - min) / 15.0;
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(min).to_le_bytes());
        let q = |v: f32| {
            if d == 0.0 {
                0
            } else {
                (((v - min) / d) + 0.5).clamp(0.0, 15.0) as u8
            }
        };
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Reference dequantization of the blocks above (GGUF spec), row-major values.
pub fn dequant(ggml_type: u32, data: &[u8]) -> Vec<f32> {
    let h = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    let mut out = Vec::new();
    match ggml_type {
        0 => out.extend(
            data.chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        1 => out.extend(data.chunks(2).map(h)),
        8 => {
            for b in data.chunks(34) {
                let d = h(&b[0..2]);
                out.extend(b[2..].iter().map(|q| d * (*q as i8) as f32));
            }
        }
        2 | 3 => {
            let block = if ggml_type == 2 { 18 } else { 20 };
            for b in data.chunks(block) {
                let d = h(&b[0..2]);
                let (m, qs) = if ggml_type == 2 {
                    (-8.0 * d, &b[2..])
                } else {
                    (h(&b[2..4]), &b[4..])
                };
                let mut vals = [0f32; 32];
                for j in 0..16 {
                    vals[j] = d * (qs[j] & 15) as f32 + m;
                    vals[j + 16] = d * (qs[j] >> 4) as f32 + m;
                }
                out.extend(vals);
            }
        }
        t => panic!("no reference dequantization for type {t}"),
    }
    out
}

/// llama.cpp's Q/K row permutation (convert_hf_to_gguf `permute`), rows of `cols` values.
pub fn permute_rows(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = w.len() / cols;
    let d = rows / heads;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for half in 0..2 {
            for j in 0..d / 2 {
                let src = h * d + half * (d / 2) + j;
                let dst = h * d + 2 * j + half;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "mlx-gguf-test-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("MLX_GGUF_KEEP_TMP").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Shapes of the tiny llama used by the tests.
pub const HIDDEN: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 16;
pub const FFN: usize = 256;
pub const LAYERS: usize = 2;

/// A byte-level vocabulary: 3 specials, the 256 byte symbols, and a few merges.
pub fn vocab() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let table = mlx_gguf::tokenizer::bytes_to_unicode();
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3, 3, 3];
    for c in table {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges: Vec<String> = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<think>".into());
    types.push(4);
    (tokens, merges, types)
}

/// One HF-layout weight of the tiny model and how to store it.
pub struct Weight {
    pub gguf_name: String,
    pub hf_name: String,
    /// Row-major HF values, `rows x cols` (norms: 1 x n).
    pub values: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
    pub ggml_type: u32,
    /// Heads to permute for (llama Q/K), or 0.
    pub permute_heads: usize,
}

/// The tiny llama's weights; `embed_type`/`lm_head` choose the embedding type and whether
/// an untied `output` exists.
pub fn tiny_llama_weights(embed_type: u32, lm_head: Option<u32>) -> Vec<Weight> {
    tiny_weights("llama", embed_type, lm_head)
}

/// The tiny model's weights for `arch` (`llama`: Q/K rows permuted in the file; `qwen2`:
/// Q/K/V biases; `qwen3`: Q/K norms).
pub fn tiny_weights(arch: &str, embed_type: u32, lm_head: Option<u32>) -> Vec<Weight> {
    tiny_weights_n(arch, embed_type, lm_head, vocab().0.len())
}

/// [`tiny_weights`] with a vocabulary of `vocab` rows.
pub fn tiny_weights_n(
    arch: &str,
    embed_type: u32,
    lm_head: Option<u32>,
    vocab: usize,
) -> Vec<Weight> {
    let llama = arch == "llama";
    let mut seed = 0u64;
    let mut w = |g: &str, hf: &str, rows: usize, cols: usize, ty: u32, heads: usize| {
        seed += 1;
        Weight {
            gguf_name: g.into(),
            hf_name: hf.into(),
            values: noise(seed, rows * cols),
            rows,
            cols,
            ggml_type: ty,
            permute_heads: heads,
        }
    };
    let mut out = vec![w(
        "token_embd.weight",
        "model.embed_tokens.weight",
        vocab,
        HIDDEN,
        embed_type,
        0,
    )];
    for l in 0..LAYERS {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        let m = |s: &str| format!("model.layers.{l}.{s}.weight");
        out.push(w(&b("attn_norm"), &m("input_layernorm"), 1, HIDDEN, 0, 0));
        let (qh, kh) = if llama { (HEADS, KV_HEADS) } else { (0, 0) };
        out.push(w(
            &b("attn_q"),
            &m("self_attn.q_proj"),
            HEADS * HEAD_DIM,
            HIDDEN,
            3,
            qh,
        ));
        out.push(w(
            &b("attn_k"),
            &m("self_attn.k_proj"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
            0,
            kh,
        ));
        if arch == "qwen2" {
            let biases = [
                ("attn_q", "self_attn.q_proj", HEADS),
                ("attn_k", "self_attn.k_proj", KV_HEADS),
                ("attn_v", "self_attn.v_proj", KV_HEADS),
            ];
            for (g, hf, n) in biases {
                let (gn, hn) = (
                    format!("blk.{l}.{g}.bias"),
                    format!("model.layers.{l}.{hf}.bias"),
                );
                out.push(w(&gn, &hn, 1, n * HEAD_DIM, 0, 0));
            }
        }
        if arch == "qwen3" {
            out.push(w(
                &b("attn_q_norm"),
                &m("self_attn.q_norm"),
                1,
                HEAD_DIM,
                0,
                0,
            ));
            out.push(w(
                &b("attn_k_norm"),
                &m("self_attn.k_norm"),
                1,
                HEAD_DIM,
                0,
                0,
            ));
        }
        out.push(w(
            &b("attn_v"),
            &m("self_attn.v_proj"),
            KV_HEADS * HEAD_DIM,
            HIDDEN,
            2,
            0,
        ));
        out.push(w(
            &b("attn_output"),
            &m("self_attn.o_proj"),
            HIDDEN,
            HEADS * HEAD_DIM,
            1,
            0,
        ));
        out.push(w(
            &b("ffn_norm"),
            &m("post_attention_layernorm"),
            1,
            HIDDEN,
            0,
            0,
        ));
        out.push(w(&b("ffn_gate"), &m("mlp.gate_proj"), FFN, HIDDEN, 3, 0));
        out.push(w(&b("ffn_up"), &m("mlp.up_proj"), FFN, HIDDEN, 8, 0));
        out.push(w(&b("ffn_down"), &m("mlp.down_proj"), HIDDEN, FFN, 3, 0));
    }
    out.push(w(
        "output_norm.weight",
        "model.norm.weight",
        1,
        HIDDEN,
        0,
        0,
    ));
    if let Some(ty) = lm_head {
        out.push(w("output.weight", "lm_head.weight", vocab, HIDDEN, ty, 0));
    }
    out
}

/// Encodes one weight the way llama.cpp would store it (rows permuted, then quantized).
pub fn encode(w: &Weight) -> Tensor {
    let vals = if w.permute_heads > 0 {
        permute_rows(&w.values, w.permute_heads, w.cols)
    } else {
        w.values.clone()
    };
    let data = match w.ggml_type {
        0 => f32_bytes(&vals),
        1 => f16_bytes(&vals),
        2 => q4_0(&vals),
        3 => q4_1(&vals),
        8 => q8_0(&vals),
        t => panic!("no encoder for type {t}"),
    };
    let dims = if w.rows == 1 {
        vec![w.cols as u64]
    } else {
        vec![w.cols as u64, w.rows as u64]
    };
    Tensor {
        name: w.gguf_name.clone(),
        dims,
        ggml_type: w.ggml_type,
        data,
    }
}

/// The metadata of the tiny llama.
pub fn tiny_llama_kvs(arch: &str) -> Vec<(&'static str, Kv)> {
    let (tokens, merges, types) = vocab();
    let a = |k: &str| -> &'static str { Box::leak(format!("{arch}.{k}").into_boxed_str()) };
    vec![
        ("general.architecture", Kv::Str(arch.into())),
        (a("block_count"), Kv::U32(LAYERS as u32)),
        (a("context_length"), Kv::U32(2048)),
        (a("embedding_length"), Kv::U32(HIDDEN as u32)),
        (a("feed_forward_length"), Kv::U32(FFN as u32)),
        (a("attention.head_count"), Kv::U32(HEADS as u32)),
        (a("attention.head_count_kv"), Kv::U32(KV_HEADS as u32)),
        (a("attention.layer_norm_rms_epsilon"), Kv::F32(1e-5)),
        (a("rope.freq_base"), Kv::F32(100000.0)),
        (a("rope.dimension_count"), Kv::U32(HEAD_DIM as u32)),
        ("tokenizer.ggml.model", Kv::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Kv::Str("smollm".into())),
        ("tokenizer.ggml.tokens", Kv::Strs(tokens)),
        ("tokenizer.ggml.merges", Kv::Strs(merges)),
        ("tokenizer.ggml.token_type", Kv::I32s(types)),
        ("tokenizer.ggml.bos_token_id", Kv::U32(1)),
        ("tokenizer.ggml.eos_token_id", Kv::U32(2)),
        ("tokenizer.ggml.padding_token_id", Kv::U32(2)),
        ("tokenizer.ggml.add_bos_token", Kv::Bool(false)),
        ("tokenizer.chat_template", Kv::Str("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}".into())),
    ]
}

/// Writes a tiny llama GGUF into `dir` and returns its path and the HF-layout weights.
pub fn write_tiny_llama(
    dir: &Path,
    embed_type: u32,
    lm_head: Option<u32>,
) -> (PathBuf, Vec<Weight>) {
    write_tiny(dir, "llama", embed_type, lm_head)
}

/// Writes a tiny GGUF of `arch` into `dir` and returns its path and the HF-layout weights.
pub fn write_tiny(
    dir: &Path,
    arch: &str,
    embed_type: u32,
    lm_head: Option<u32>,
) -> (PathBuf, Vec<Weight>) {
    let weights = tiny_weights(arch, embed_type, lm_head);
    let tensors: Vec<Tensor> = weights.iter().map(encode).collect();
    let path = dir.join(format!("tiny-{arch}.gguf"));
    std::fs::write(&path, gguf_bytes(&tiny_llama_kvs(arch), &tensors)).unwrap();
    (path, weights)
}

/// One entry of goldens/gguf/blocks.json: 512 values of a block type, with their bytes.
pub struct Golden {
    pub ggml_type: u32,
    pub name: String,
    pub bytes: Vec<u8>,
    pub values: Vec<f32>,
}

/// Blocks of every type with llama.cpp's reference values (see xtask/py/gguf_check.py).
pub fn goldens() -> Vec<Golden> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../goldens/gguf/blocks.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let hex = t["hex"].as_str().unwrap();
            Golden {
                ggml_type: t["type"].as_u64().unwrap() as u32,
                name: t["name"].as_str().unwrap().to_string(),
                bytes: (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect(),
                values: t["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect(),
            }
        })
        .collect()
}
