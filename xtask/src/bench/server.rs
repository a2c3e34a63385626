//! `cargo xtask bench --server`: `mlx-server` against `mlx_lm.server` under 1, 8 and 32
//! concurrent streaming requests.
//!
//! Both servers are started on free local ports with the same model. For each
//! concurrency level (ours and theirs alternating, after one untimed request each, and
//! one untimed round at that level, so kernels built for a new batch size are not
//! timed), N
//! threads each send one streaming `POST /v1/completions` (greedy, `max_tokens` = `-g`,
//! a prompt of about `-p` tokens with a real tokenizer, starting with a number unique to
//! the request so that no prompt cache is reused, usage requested in the last chunk) at
//! the same time.
//! Reported: aggregate decode throughput (completion tokens of all streams / wall time
//! from the first request sent to the last stream closed) and time to first token (send
//! to the first chunk carrying text: the servers send none while the detokenizer holds
//! back an incomplete character) at p50 and p99. The client is plain HTTP/1.1 over
//! `std::net` with one thread a stream, so it needs no async runtime.
use super::{append, our_bins, provenance, python, Cmd, Opts};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A server child process, killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    port: u16,
    cmd: Cmd,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start(name: &'static str, cmd: Cmd, port: u16, log: &Path) -> Result<Server> {
    let file = std::fs::File::create(log)?;
    let child = cmd
        .command()
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting `{cmd}`"))?;
    let mut server = Server {
        name,
        child,
        port,
        cmd,
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            bail!(
                "{name} exited ({status}) before serving:\n{}",
                super::tail(&text, 20)
            );
        }
        if let Ok((200, _)) = request(port, "GET", "/v1/models", None) {
            return Ok(server);
        }
        if Instant::now() > deadline {
            bail!(
                "{name} did not answer GET /v1/models within 600 s (log: {})",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One request, whole body (de-chunked). Returns (status, body).
fn request(port: u16, method: &str, path: &str, body: Option<&str>) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    send(&mut s, port, method, path, body)?;
    let mut reader = Response::new(s)?;
    let mut out = Vec::new();
    while let Some(chunk) = reader.next_chunk()? {
        out.extend(chunk);
    }
    Ok((reader.status, out))
}

fn send(s: &mut TcpStream, port: u16, method: &str, path: &str, body: Option<&str>) -> Result<()> {
    let body = body.unwrap_or("");
    // One write: a server that closes after answering must not leave unread bytes.
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    Ok(s.flush()?)
}

/// An HTTP/1.x response read incrementally: chunked or close-delimited body.
struct Response {
    stream: TcpStream,
    buf: Vec<u8>,
    status: u16,
    chunked: bool,
    done: bool,
}

impl Response {
    fn new(stream: TcpStream) -> Result<Self> {
        let mut r = Response {
            stream,
            buf: Vec::new(),
            status: 0,
            chunked: false,
            done: false,
        };
        let end = loop {
            if let Some(i) = find(&r.buf, b"\r\n\r\n") {
                break i;
            }
            if !r.fill()? {
                bail!("connection closed inside the response head");
            }
        };
        let head = String::from_utf8_lossy(&r.buf[..end]).into_owned();
        r.buf.drain(..end + 4);
        let status_line = head.lines().next().unwrap_or("");
        r.status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow!("bad status line `{status_line}`"))?;
        r.chunked = head.lines().any(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with("transfer-encoding:") && l.contains("chunked")
        });
        Ok(r)
    }

    fn fill(&mut self) -> Result<bool> {
        let mut tmp = [0u8; 16384];
        let n = self.stream.read(&mut tmp)?;
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n > 0)
    }

    /// The next piece of the body as it arrives; None at its end.
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        if !self.chunked {
            if self.buf.is_empty() && !self.fill()? {
                self.done = true;
                return Ok(None);
            }
            return Ok(Some(std::mem::take(&mut self.buf)));
        }
        let line_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                break i;
            }
            if !self.fill()? {
                bail!("connection closed inside a chunk header");
            }
        };
        let size_text = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| anyhow!("bad chunk size `{size_text}`"))?;
        while self.buf.len() < line_end + 2 + size + 2 {
            if !self.fill()? {
                if size == 0 {
                    break;
                }
                bail!("connection closed inside a chunk");
            }
        }
        if size == 0 {
            self.done = true;
            return Ok(None);
        }
        let data = self.buf[line_end + 2..line_end + 2 + size].to_vec();
        self.buf.drain(..line_end + 2 + size + 2);
        Ok(Some(data))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What one stream saw.
#[derive(Debug, Clone, Copy)]
struct Stream {
    ttft: f64,
    tokens: u64,
}

/// Sends one streaming completion and reads it to the end.
fn one_stream(port: u16, body: &str) -> Result<(Stream, Instant)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(900)))?;
    let sent = Instant::now();
    send(&mut s, port, "POST", "/v1/completions", Some(body))?;
    let mut r = Response::new(s)?;
    if r.status != 200 {
        let mut text = Vec::new();
        while let Some(c) = r.next_chunk()? {
            text.extend(c);
        }
        bail!("HTTP {}: {}", r.status, String::from_utf8_lossy(&text));
    }
    let (mut pending, mut ttft, mut chunks, mut usage) = (String::new(), None, 0u64, None);
    while let Some(c) = r.next_chunk()? {
        pending.push_str(&String::from_utf8_lossy(&c));
        while let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                continue;
            }
            let v: Value =
                serde_json::from_str(data).with_context(|| format!("SSE data `{data}`"))?;
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
            {
                usage = Some(n);
            }
            let has_text = v
                .pointer("/choices/0/text")
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty());
            if has_text {
                chunks += 1;
                ttft.get_or_insert_with(|| sent.elapsed().as_secs_f64());
            }
        }
    }
    let ttft = ttft.ok_or_else(|| anyhow!("the stream carried no text"))?;
    Ok((
        Stream {
            ttft,
            tokens: usage.unwrap_or(chunks),
        },
        Instant::now(),
    ))
}

/// Stands for a number unique to each request (nine digits) at the start of the
/// prompt, so that no request reuses another's prompt cache.
const REQUEST_ID: &str = "@@REQUEST@@";

/// Aggregate tok/s, TTFT p50, TTFT p99 of `n` concurrent streams.
fn level(port: u16, body: &str, n: u32) -> Result<(f64, f64, f64)> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let id = NEXT.fetch_add(1, Ordering::Relaxed);
            // Fixed width: every prompt has the same token count (tokenizers that
            // split digits, like Qwen's, would otherwise give a 4-digit id one token
            // fewer than a 5-digit one, and a server meeting a new length pays for new
            // kernels and graphs that the warm-up did not build).
            let tag = format!("{}{:08}", id % 9 + 1, (id * 7919) % 100_000_000);
            let body = body.replace(REQUEST_ID, &tag);
            std::thread::spawn(move || one_stream(port, &body))
        })
        .collect();
    let mut streams = Vec::new();
    let mut end = t0;
    for h in handles {
        let (s, done) = h
            .join()
            .map_err(|_| anyhow!("a client thread panicked"))??;
        end = end.max(done);
        streams.push(s);
    }
    let wall = (end - t0).as_secs_f64();
    let tokens: u64 = streams.iter().map(|s| s.tokens).sum();
    let mut ttfts: Vec<f64> = streams.iter().map(|s| s.ttft).collect();
    ttfts.sort_by(f64::total_cmp);
    Ok((
        tokens as f64 / wall,
        percentile(&ttfts, 0.50),
        percentile(&ttfts, 0.99),
    ))
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs `--server` (see the module docs).
pub fn run(root: &Path, o: &Opts) -> Result<()> {
    let bins = match our_bins(root, o.ours.as_deref(), &["mlx-server", "mlx-generate"]) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bench --server: skipped, our mlx-server is not available ({e:#})");
            return Ok(());
        }
    };
    let py = python(root, o)?;
    let model = super::resolve_model(&o.model, &bins[2], &o.ours_args)?;
    let model_s = model.to_string_lossy().into_owned();
    let logs = std::env::temp_dir().join(format!("mlx-bench-server-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    let (p1, p2) = (free_port()?, free_port()?);
    let ours_cmd = Cmd::new(&bins[1])
        .args(["--model", &model_s, "--port", &p1.to_string()])
        .args(o.ours_args.iter().cloned());
    let theirs_cmd = Cmd::new(&py).args([
        "-m",
        "mlx_lm",
        "server",
        "--model",
        &model_s,
        "--port",
        &p2.to_string(),
    ]);
    eprintln!("bench --server: starting\n  ours:   {ours_cmd}\n  mlx-lm: {theirs_cmd}");
    let ours = start("ours", ours_cmd, p1, &logs.join("ours.log"))?;
    let theirs = start("mlx-lm", theirs_cmd, p2, &logs.join("mlx-lm.log"))?;
    let prompt = format!(
        "{REQUEST_ID}{}",
        " hello".repeat(o.prompt_tokens.saturating_sub(1) as usize)
    );
    let body = serde_json::json!({
        "model": model_s,
        "prompt": prompt,
        "max_tokens": o.generation_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    for s in [&ours, &theirs] {
        level(s.port, &body, 1).with_context(|| format!("warm-up request to {}", s.name))?;
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### server: {} (prompt ~{} tokens, {} generated a stream)\n",
        model
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        o.prompt_tokens,
        o.generation_tokens
    );
    let _ = writeln!(
        s,
        "| streams | ours tok/s | mlx-lm tok/s | ratio | ours TTFT p50 / p99 s | mlx-lm TTFT p50 / p99 s |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for (i, &n) in o.streams.iter().enumerate() {
        let order = if i % 2 == 0 {
            [&ours, &theirs]
        } else {
            [&theirs, &ours]
        };
        let mut res = [(0.0, 0.0, 0.0); 2];
        for srv in order {
            // An untimed round at the same concurrency first: a new batch size makes
            // MLX build (on CUDA: JIT-compile) kernels for new shapes, which would
            // otherwise land on whichever server meets that size first.
            if n > 1 {
                level(srv.port, &body, n)
                    .with_context(|| format!("warm-up of {} at {n} streams", srv.name))?;
            }
            let r = level(srv.port, &body, n)
                .with_context(|| format!("{} at {n} streams", srv.name))?;
            eprintln!(
                "  {n:3} streams {:6}: {:.1} tok/s, TTFT p50 {:.3} s p99 {:.3} s",
                srv.name, r.0, r.1, r.2
            );
            res[usize::from(srv.name != "ours")] = r;
        }
        let [a, b] = res;
        let _ = writeln!(
            s,
            "| {n} | {:.1} | {:.1} | {} | {:.3} / {:.3} | {:.3} / {:.3} |",
            a.0,
            b.0,
            super::ratio(a.0, b.0),
            a.1,
            a.2,
            b.1,
            b.2
        );
    }
    let _ = writeln!(s);
    s.push_str(&provenance(root, &py));
    let _ = writeln!(s, "- ours: `{}`\n- mlx-lm: `{}`", ours.cmd, theirs.cmd);
    let _ = writeln!(s, "- request: `POST /v1/completions` {body}");
    drop((ours, theirs));
    println!("{s}");
    if let Some(out) = &o.out {
        append(out, &s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn response_reader_dechunks_a_split_stream() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            while find(&req, b"\r\n\r\n").is_none() {
                let mut b = [0u8; 256];
                let n = c.read(&mut b).unwrap();
                assert!(n > 0, "request head cut short");
                req.extend_from_slice(&b[..n]);
            }
            let parts: [&[u8]; 4] = [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nf",
                b"\r\ndata: {\"a\": 1}\n\r\n",
                b"5\r\nhello\r",
                b"\n0\r\n\r\n",
            ];
            for p in parts {
                c.write_all(p).unwrap();
                c.flush().unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let (status, body) = request(port, "GET", "/", None).unwrap();
        server.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(String::from_utf8(body).unwrap(), "data: {\"a\": 1}\nhello");
    }
}
