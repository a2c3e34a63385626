//! Repo ids, revisions and file names as the Hub and its cache name them, validated so that
//! nothing a server or a user sends can point outside the cache.
use crate::HubError;

/// What kind of repo: models and datasets are what this workspace reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoType {
    /// A model repo (`models--org--name`, `/api/models/...`).
    Model,
    /// A dataset repo (`datasets--org--name`, `/api/datasets/...`).
    Dataset,
}

impl RepoType {
    /// `model` or `dataset`.
    pub fn as_str(self) -> &'static str {
        match self {
            RepoType::Model => "model",
            RepoType::Dataset => "dataset",
        }
    }
    /// The URL prefix of resolve URLs (`""` for models, `"datasets/"` for datasets).
    pub(crate) fn url_prefix(self) -> &'static str {
        match self {
            RepoType::Model => "",
            RepoType::Dataset => "datasets/",
        }
    }
}

/// A validated `org/name` repo id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoId {
    /// The repo id.
    pub id: String,
    /// Its type.
    pub kind: RepoType,
}

fn id_part_ok(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with(['.', '-'])
        && !p.ends_with(['.', '-'])
        && !p.contains("--")
        && !p.contains("..")
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Whether `s` is an `org/name` id (the rules of `huggingface_hub.validate_repo_id`, with
/// the namespace required).
pub fn is_repo_id(s: &str) -> bool {
    s.len() <= 96
        && matches!(s.split_once('/'), Some((org, name)) if id_part_ok(org) && id_part_ok(name))
}

impl RepoId {
    /// Validates `id` (see [`is_repo_id`]).
    pub fn new(id: &str, kind: RepoType) -> Result<RepoId, HubError> {
        if !is_repo_id(id) {
            return Err(HubError::BadRepoId {
                id: id.to_string(),
                why:
                    "a repo id is `org/name`: letters, digits, `-`, `_` and `.`, no `--` or `..`, \
                      not starting or ending with `-` or `.`, at most 96 characters"
                        .into(),
            });
        }
        Ok(RepoId {
            id: id.to_string(),
            kind,
        })
    }

    /// The cache folder's name: `models--org--name` or `datasets--org--name`.
    pub fn folder_name(&self) -> String {
        format!("{}s--{}", self.kind.as_str(), self.id.replace('/', "--"))
    }
}

/// Checks a path relative to a repo or to `refs/` (a file name from a server, or a
/// revision): `/`-separated, no empty, `.` or `..` component, no backslash, no NUL, not
/// absolute.
pub fn check_relative(what: &str, p: &str) -> Result<(), HubError> {
    let why = if p.is_empty() {
        Some("it is empty")
    } else if p.starts_with('/') {
        Some("it is absolute")
    } else if p.contains('\\') || p.contains('\0') {
        Some("it contains a backslash or a NUL")
    } else if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        Some("it has an empty, `.` or `..` component")
    } else {
        None
    };
    match why {
        Some(why) => Err(HubError::BadPath {
            what: what.to_string(),
            path: p.to_string(),
            why: why.to_string(),
        }),
        None => Ok(()),
    }
}

/// Whether `s` is a full commit hash (40 lowercase hex digits).
pub fn is_commit_hash(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Percent-encodes `s` like Python's `urllib.parse.quote(s, safe)`.
pub(crate) fn quote(s: &str, safe: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"_.-~".contains(&b) || safe.as_bytes().contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Python's `fnmatch.fnmatchcase` for `*`, `?` and `[...]` (where `*` crosses `/`), with
/// huggingface_hub's rule that a pattern ending in `/` means everything under it.
pub fn fnmatch(pattern: &str, name: &str) -> bool {
    let pattern = if pattern.ends_with('/') {
        format!("{pattern}*")
    } else {
        pattern.to_string()
    };
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    match_from(&p, &n)
}

fn match_from(p: &[char], n: &[char]) -> bool {
    let Some((&c, rest)) = p.split_first() else {
        return n.is_empty();
    };
    match c {
        '*' => (0..=n.len()).any(|i| match_from(rest, &n[i..])),
        '?' => !n.is_empty() && match_from(rest, &n[1..]),
        '[' => {
            let Some(end) = rest.iter().skip(1).position(|&x| x == ']').map(|i| i + 1) else {
                return n.first() == Some(&'[') && match_from(rest, &n[1..]);
            };
            let Some(&ch) = n.first() else { return false };
            let (neg, set) = match rest[..end].split_first() {
                Some(('!', s)) => (true, s),
                _ => (false, &rest[..end]),
            };
            let mut hit = false;
            let mut i = 0;
            while i < set.len() {
                if i + 2 < set.len() && set[i + 1] == '-' {
                    hit |= set[i] <= ch && ch <= set[i + 2];
                    i += 3;
                } else {
                    hit |= set[i] == ch;
                    i += 1;
                }
            }
            hit != neg && match_from(&rest[end + 1..], &n[1..])
        }
        _ => n.first() == Some(&c) && match_from(rest, &n[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_org_slash_name() {
        assert!(is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(is_repo_id("mlx-community/Qwen2.5-0.5B-Instruct-4bit"));
        for bad in [
            "name",
            "/abs/path",
            "a/b/c",
            "./x",
            "../x",
            "org/",
            "org/na me",
            "a--b/c",
            "a/b..c",
            "org/.x",
            "org/x-",
        ] {
            assert!(!is_repo_id(bad), "{bad}");
        }
    }

    #[test]
    fn relative_paths() {
        for ok in ["config.json", "sub/dir/x.txt", "refs/pr/1", "main"] {
            check_relative("file", ok).unwrap();
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a\\b",
            "x/",
        ] {
            assert!(check_relative("file", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fnmatch_like_python() {
        assert!(fnmatch("*.json", "config.json"));
        assert!(fnmatch("*.json", "sub/config.json"));
        assert!(fnmatch(
            "model*.safetensors",
            "model-00001-of-00002.safetensors"
        ));
        assert!(!fnmatch("model*.safetensors", "consolidated.safetensors"));
        assert!(fnmatch("tokenizer.model", "tokenizer.model"));
        assert!(!fnmatch("tokenizer.model", "xtokenizer.model"));
        assert!(fnmatch("data/", "data/train.jsonl"));
        assert!(fnmatch("[ab]?.txt", "b1.txt"));
        assert!(!fnmatch("[!ab]?.txt", "b1.txt"));
        assert_eq!(quote("refs/pr/1", ""), "refs%2Fpr%2F1");
        assert_eq!(quote("a b/c.json", "/"), "a%20b/c.json");
    }
}
