//! Uploads: create a repo and commit a folder to it through the Hub's commit API
//! (`preupload` to learn which files go through LFS, the LFS batch API with basic or
//! multipart transfers for those, then one NDJSON commit), and the model card mlx-lm's
//! `upload_to_hub` writes first.
use super::client::{error_chain, HubClient};
use super::repo::{check_relative, quote, RepoId, RepoType};
use crate::error::io_err;
use crate::{HubError, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The mlx-lm release whose model card this writes.
pub const MLX_LM_VERSION: &str = "0.32.2";

/// Files per preupload request (huggingface_hub's chunk).
const PREUPLOAD_CHUNK: usize = 256;

/// The model card mlx-lm's `upload_to_hub` writes: the YAML block of `README.md` (if any)
/// kept, the text replaced by the heading, the provenance line when the card names a
/// `base_model`, and the usage snippet.
pub fn model_card(existing: Option<&str>, upload_repo: &str) -> String {
    let yaml = existing.and_then(front_matter);
    let base = yaml.as_deref().and_then(base_model);
    let provenance = match base {
        Some(b) => format!(
            "\nThis model [{upload_repo}](https://huggingface.co/{upload_repo}) was\n\
             converted to MLX format from [{b}](https://huggingface.co/{b})\n\
             using mlx-lm version **{MLX_LM_VERSION}**.\n"
        ),
        None => String::new(),
    };
    let text = format!(
        "\n# {upload_repo}\n{provenance}\n## Use with mlx\n\n```bash\npip install mlx-lm\n```\n\n\
         ```python\nfrom mlx_lm import load, generate\n\nmodel, tokenizer = load(\"{upload_repo}\")\n\n\
         prompt = \"hello\"\n\nif tokenizer.chat_template is not None:\n    \
         messages = [{{\"role\": \"user\", \"content\": prompt}}]\n    \
         prompt = tokenizer.apply_chat_template(\n        \
         messages, add_generation_prompt=True, return_dict=False,\n    )\n\n\
         response = generate(model, tokenizer, prompt=prompt, verbose=True)\n```\n"
    );
    format!("---\n{}\n---\n{text}", yaml.unwrap_or_else(|| "{}".into()))
}

/// The YAML between a leading `---` line and the next `---` line.
fn front_matter(text: &str) -> Option<String> {
    let t = text.trim_start();
    let rest = t.strip_prefix("---")?;
    let rest = rest
        .strip_prefix("\r\n")
        .or_else(|| rest.strip_prefix('\n'))?;
    let mut yaml = Vec::new();
    for line in rest.lines() {
        if line.trim_end() == "---" {
            return Some(yaml.join("\n"));
        }
        yaml.push(line);
    }
    None
}

/// `base_model` of a YAML block, as Python's `str()` shows it (a list as `['a', 'b']`).
fn base_model(yaml: &str) -> Option<String> {
    let mut lines = yaml.lines();
    while let Some(line) = lines.next() {
        let Some(v) = line.strip_prefix("base_model:") else {
            continue;
        };
        let v = v.trim();
        if !v.is_empty() {
            return Some(v.trim_matches(['"', '\'']).to_string());
        }
        let items: Vec<String> = lines
            .by_ref()
            .take_while(|l| l.trim_start().starts_with("- "))
            .map(|l| format!("'{}'", l.trim_start()[2..].trim().trim_matches(['"', '\''])))
            .collect();
        return (!items.is_empty()).then(|| format!("[{}]", items.join(", ")));
    }
    None
}

/// Writes mlx-lm's card into `dir/README.md` (see [`model_card`]).
pub fn write_model_card(dir: &Path, upload_repo: &str) -> Result<()> {
    let path = dir.join("README.md");
    let existing = std::fs::read_to_string(&path).ok();
    std::fs::write(&path, model_card(existing.as_deref(), upload_repo)).map_err(io_err(&path))
}

fn upload_err(repo: &RepoId, why: impl Into<String>) -> HubError {
    HubError::Upload {
        repo: repo.id.clone(),
        why: why.into(),
    }
}

/// Creates `repo` (public) unless it exists.
pub fn create_repo(client: &HubClient, repo: &RepoId) -> Result<()> {
    if client.offline {
        return Err(upload_err(repo, "HF_HUB_OFFLINE is set"));
    }
    let (org, name) = repo.id.split_once('/').unwrap_or(("", &repo.id));
    let mut body = json!({"name": name, "organization": org});
    if repo.kind != RepoType::Model {
        body["type"] = json!(repo.kind.as_str());
    }
    let url = format!("{}/api/repos/create", client.endpoint);
    let resp = client.send(client.http.post(&url).json(&body), &url)?;
    if resp.status().as_u16() == 409 {
        return Ok(());
    }
    super::client::check_status(resp, &url, &repo.id, client.token.is_some()).map(|_| ())
}

/// A file to upload.
struct Item {
    path: String,
    local: PathBuf,
    size: u64,
    sample: Vec<u8>,
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Item>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        let rel = p
            .strip_prefix(root)
            .map(|r| r.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        // upload_folder's default ignores: git metadata and huggingface_hub's local cache.
        if rel == ".git" || rel.starts_with(".git/") || rel.starts_with(".cache/huggingface") {
            continue;
        }
        if p.is_dir() {
            walk(root, &p, out)?;
        } else if p.is_file() {
            check_relative("file to upload", &rel)?;
            let size = std::fs::metadata(&p).map_err(io_err(&p))?.len();
            let mut sample = Vec::with_capacity(512);
            std::fs::File::open(&p)
                .map_err(io_err(&p))?
                .take(512)
                .read_to_end(&mut sample)
                .map_err(io_err(&p))?;
            out.push(Item {
                path: rel,
                local: p,
                size,
                sample,
            });
        }
    }
    Ok(())
}

/// Standard base64 with padding.
pub(crate) fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn sha256_hex(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn json_of(resp: reqwest::blocking::Response, repo: &RepoId, what: &str) -> Result<Value> {
    resp.json().map_err(|e| {
        upload_err(
            repo,
            format!("unreadable {what} answer: {}", error_chain(&e)),
        )
    })
}

/// The URL the Hub gave, with its host swapped for `HF_ENDPOINT`'s when it names the
/// public Hub (huggingface_hub's `fix_hf_endpoint_in_url`).
fn fix_endpoint(client: &HubClient, url: &str) -> String {
    match url.strip_prefix(super::client::DEFAULT_ENDPOINT) {
        Some(rest) if client.endpoint != super::client::DEFAULT_ENDPOINT => {
            format!("{}{rest}", client.endpoint)
        }
        _ => url.to_string(),
    }
}

/// Uploads every file under `folder` to `repo`'s `main` branch in one commit; returns the
/// commit's URL as the Hub gives it.
pub fn upload_folder(
    client: &HubClient,
    repo: &RepoId,
    folder: &Path,
    summary: &str,
) -> Result<String> {
    if client.offline {
        return Err(upload_err(repo, "HF_HUB_OFFLINE is set"));
    }
    let mut items = Vec::new();
    walk(folder, folder, &mut items)?;
    if items.is_empty() {
        return Err(upload_err(
            repo,
            format!("{} holds no files", folder.display()),
        ));
    }
    let revision = "main";
    let api = format!(
        "{}/api/{}s/{}",
        client.endpoint,
        repo.kind.as_str(),
        repo.id
    );
    // 1. Which files go through LFS.
    let mut modes = std::collections::HashMap::new();
    for chunk in items.chunks(PREUPLOAD_CHUNK) {
        let body = json!({"files": chunk.iter().map(|i| json!({
            "path": i.path, "sample": base64(&i.sample), "size": i.size,
        })).collect::<Vec<_>>()});
        let url = format!("{api}/preupload/{}", quote(revision, ""));
        let resp = client.send_ok(client.http.post(&url).json(&body), &url, &repo.id)?;
        let v = json_of(resp, repo, "preupload")?;
        for f in v["files"].as_array().into_iter().flatten() {
            let (Some(p), Some(m)) = (f["path"].as_str(), f["uploadMode"].as_str()) else {
                return Err(upload_err(repo, format!("malformed preupload answer: {f}")));
            };
            modes.insert(
                p.to_string(),
                (m == "lfs", f["shouldIgnore"].as_bool().unwrap_or(false)),
            );
        }
    }
    // 2. LFS files: hash them, ask the batch API where to put them, put them.
    let mut lines =
        vec![json!({"key": "header", "value": {"summary": summary, "description": ""}})];
    let mut lfs = Vec::new();
    for it in &items {
        let Some(&(is_lfs, ignore)) = modes.get(&it.path) else {
            return Err(upload_err(
                repo,
                format!("the preupload answer does not mention {}", it.path),
            ));
        };
        if ignore {
            tracing::info!(file = %it.path, "the Hub ignores this file (.gitignore); not uploaded");
            continue;
        }
        if is_lfs {
            let oid = sha256_hex(&it.local)?;
            lines.push(json!({"key": "lfsFile", "value": {"path": it.path, "algo": "sha256", "oid": oid, "size": it.size}}));
            lfs.push((it, oid));
        } else {
            let data = std::fs::read(&it.local).map_err(io_err(&it.local))?;
            lines.push(json!({"key": "file", "value": {"content": base64(&data), "path": it.path, "encoding": "base64"}}));
        }
    }
    for chunk in lfs.chunks(256) {
        lfs_upload(client, repo, revision, chunk)?;
    }
    // 3. The commit.
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let url = format!("{api}/commit/{}", quote(revision, ""));
    let rb = client
        .http
        .post(&url)
        .header("Content-Type", "application/x-ndjson")
        .body(body);
    let resp = client.send_ok(rb, &url, &repo.id)?;
    let v = json_of(resp, repo, "commit")?;
    Ok(v["commitUrl"].as_str().unwrap_or_default().to_string())
}

fn lfs_upload(
    client: &HubClient,
    repo: &RepoId,
    revision: &str,
    files: &[(&Item, String)],
) -> Result<()> {
    let url = format!(
        "{}/{}{}.git/info/lfs/objects/batch",
        client.endpoint,
        repo.kind.url_prefix(),
        repo.id
    );
    let body = json!({
        "operation": "upload",
        "transfers": ["basic", "multipart"],
        "objects": files.iter().map(|(i, oid)| json!({"oid": oid, "size": i.size})).collect::<Vec<_>>(),
        "hash_algo": "sha256",
        "ref": {"name": revision},
    });
    let rb = client
        .http
        .post(&url)
        .header("Accept", "application/vnd.git-lfs+json")
        .header("Content-Type", "application/vnd.git-lfs+json")
        .json(&body);
    let resp = client.send_ok(rb, &url, &repo.id)?;
    let v = json_of(resp, repo, "LFS batch")?;
    for obj in v["objects"].as_array().into_iter().flatten() {
        let oid = obj["oid"].as_str().unwrap_or_default();
        if let Some(err) = obj.get("error") {
            return Err(upload_err(repo, format!("LFS object {oid}: {err}")));
        }
        let Some((item, _)) = files.iter().find(|(_, o)| o == oid) else {
            return Err(upload_err(
                repo,
                format!("the LFS batch answer names an unknown object {oid}"),
            ));
        };
        let Some(actions) = obj.get("actions") else {
            continue; // Already on the Hub.
        };
        let upload = &actions["upload"];
        let href = upload["href"]
            .as_str()
            .map(|h| fix_endpoint(client, h))
            .ok_or_else(|| upload_err(repo, format!("LFS object {oid}: no upload href")))?;
        let header = upload.get("header").cloned().unwrap_or(Value::Null);
        if let Some(chunk) = header.get("chunk_size") {
            let chunk: u64 = chunk
                .as_u64()
                .or_else(|| chunk.as_str().and_then(|s| s.parse().ok()))
                .filter(|&c| c > 0)
                .ok_or_else(|| {
                    upload_err(repo, format!("LFS object {oid}: bad chunk_size {chunk}"))
                })?;
            multipart(client, repo, item, oid, &header, chunk, &href)?;
        } else {
            // Streamed with its length: storage behind the href wants a Content-Length.
            let f = std::fs::File::open(&item.local).map_err(io_err(&item.local))?;
            let body = reqwest::blocking::Body::sized(f, item.size);
            // No token: the href is a presigned storage URL, not the Hub.
            let resp = client
                .http
                .put(&href)
                .body(body)
                .send()
                .map_err(|e| HubError::Network {
                    url: href.clone(),
                    detail: error_chain(&e),
                })?;
            super::client::check_status(resp, &href, &repo.id, false)?;
        }
        if let Some(verify) = actions.get("verify").and_then(|a| a["href"].as_str()) {
            let verify = fix_endpoint(client, verify);
            let rb = client
                .http
                .post(&verify)
                .json(&json!({"oid": oid, "size": item.size}));
            client.send_ok(rb, &verify, &repo.id)?;
        }
    }
    Ok(())
}

fn multipart(
    client: &HubClient,
    repo: &RepoId,
    item: &Item,
    oid: &str,
    header: &Value,
    chunk: u64,
    href: &str,
) -> Result<()> {
    let mut parts: Vec<(u32, String)> = header
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.parse::<u32>().ok()?, v.as_str()?.to_string())))
        .collect();
    parts.sort();
    if (parts.len() as u64) != item.size.div_ceil(chunk) {
        return Err(upload_err(
            repo,
            format!(
                "LFS object {oid}: {} part URLs for {} bytes in chunks of {chunk}",
                parts.len(),
                item.size
            ),
        ));
    }
    let mut f = std::fs::File::open(&item.local).map_err(io_err(&item.local))?;
    let mut etags = Vec::new();
    for (n, url) in &parts {
        let mut buf = Vec::with_capacity(chunk as usize);
        (&mut f)
            .take(chunk)
            .read_to_end(&mut buf)
            .map_err(io_err(&item.local))?;
        let resp = client
            .http
            .put(url)
            .body(buf)
            .send()
            .map_err(|e| HubError::Network {
                url: url.clone(),
                detail: error_chain(&e),
            })?;
        let resp = super::client::check_status(resp, url, &repo.id, false)?;
        let etag = resp
            .headers()
            .get("ETag")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| upload_err(repo, format!("LFS part {n} of {oid}: no ETag")))?;
        etags.push(json!({"partNumber": n, "etag": etag}));
    }
    let rb = client
        .http
        .post(href)
        .json(&json!({"oid": oid, "parts": etags}));
    client.send_ok(rb, href, &repo.id).map(|_| ())
}

/// mlx-lm's `upload_to_hub`: writes the model card into `path/README.md`, creates the
/// repo and uploads the folder. Returns the repo's URL.
pub fn upload_to_hub(path: &Path, upload_repo: &str) -> Result<String> {
    let repo = RepoId::new(upload_repo, RepoType::Model)?;
    let client = HubClient::from_env()?;
    write_model_card(path, upload_repo)?;
    create_repo(&client, &repo)?;
    upload_folder(&client, &repo, path, "Upload folder using huggingface_hub")?;
    Ok(format!("{}/{}", client.endpoint, repo.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn card_keeps_yaml_and_names_the_base_model() {
        let c = model_card(
            Some("---\nbase_model: a/b\nlibrary_name: mlx\n---\nold text"),
            "o/n",
        );
        assert!(c.starts_with(
            "---\nbase_model: a/b\nlibrary_name: mlx\n---\n\n# o/n\n\nThis model [o/n]"
        ));
        assert!(c.contains(
            "from [a/b](https://huggingface.co/a/b)\nusing mlx-lm version **0.32.2**.\n\n## Use"
        ));
        assert!(!c.contains("old text"));
        let c = model_card(None, "o/n");
        assert!(c.starts_with("---\n{}\n---\n\n# o/n\n\n## Use with mlx\n"));
        assert_eq!(
            base_model("base_model:\n- a/b\n- c/d\ntags: []").as_deref(),
            Some("['a/b', 'c/d']")
        );
    }
}
