"""A small Hugging Face Hub for tests: the HTTP API that huggingface_hub and mlx-hub use.

Speaks: repo create, model/dataset info (siblings, sha, /revision/<rev>), the recursive
tree listing, resolve (HEAD/GET; LFS files redirect to a CDN path with X-Linked-Etag /
X-Linked-Size, the CDN honours Range), preupload, the LFS batch API (basic transfers;
multipart ones, in 64 KiB parts, for objects over 100 kB; verify), and NDJSON commits.
Repos live in memory. Tests steer faults through POST /_control (see FAULTS).

usage:
  hub_server.py serve            prints "PORT <n>" then serves on 127.0.0.1
  hub_server.py upload ENDPOINT REPO_ID FOLDER [--type dataset]   (huggingface_hub upload_folder)
  hub_server.py snapshot ENDPOINT CACHE REPO_ID [--type dataset] [--mlx-lm-patterns]
  hub_server.py mlx-upload ENDPOINT FOLDER REPO_ID   (mlx_lm.utils.upload_to_hub)
"""

import base64
import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".parquet", ".npz")
LFS_MIN = 10 * 1024 * 1024
# LFS objects larger than this upload in parts of MULTIPART_CHUNK bytes (the Hub's
# multipart transfer, scaled down so that test files exercise it).
MULTIPART_MIN = 100_000
MULTIPART_CHUNK = 65_536
PARTS = {}  # oid -> {part number: bytes}

LOCK = threading.Lock()
REPOS = {}  # (type, id) -> {"commits": {sha: files}, "main": sha}; files: path -> entry
LFS = {}  # oid -> bytes
# Faults, keyed by etag (blob id or LFS oid) unless said otherwise:
#   truncate_once: {etag: n}  send the full Content-Length but only n bytes, once
#   corrupt: {etag: true}     flip a byte of the content
#   wrong_size: {etag: d}     announce size + d in HEAD
#   bad_etag: {etag: true}    announce another ETag in HEAD
#   extra_tree: {repo_id: [entries]}   add entries to the tree listing
#   private: [repo_id]        needs "Authorization: Bearer secret-token"
#   gated: [repo_id]          the same, answered as a gated repo
#   delay: seconds            sleep between 64 KiB chunks of CDN answers
FAULTS = {}
TOKEN = "secret-token"
GETS = {}  # etag -> the start offset of every GET of its bytes (tests check resume)


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(oid, size):
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n".encode()


def entry_for(data, lfs):
    if lfs:
        oid = hashlib.sha256(data).hexdigest()
        LFS[oid] = data
        ptr = lfs_pointer(oid, len(data))
        return {"lfs": oid, "size": len(data), "blob_id": git_sha1(ptr), "pointer": ptr}
    return {"content": data, "size": len(data), "blob_id": git_sha1(data)}


def new_commit(repo, files, summary):
    parent = repo["main"] or ""
    h = hashlib.sha1(parent.encode() + summary.encode())
    for p in sorted(files):
        h.update(p.encode() + b"\0" + files[p]["blob_id"].encode())
    sha = h.hexdigest()
    repo["commits"][sha] = files
    repo["main"] = sha
    return sha


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    # ---- helpers
    def send(self, code, body=b"", headers=None, ctype="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, code, xcode, msg):
        self.send(code, {"error": msg}, {"X-Error-Code": xcode, "X-Error-Message": msg})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def repo(self, rtype, rid):
        with LOCK:
            repo = REPOS.get((rtype, rid))
        if repo is None:
            self.error(401, "RepoNotFound", f"Repository Not Found for url: {self.path}")
            return None
        auth = self.headers.get("Authorization", "")
        for kind, code in (("private", "RepoNotFound"), ("gated", "GatedRepo")):
            if rid in FAULTS.get(kind, []) and auth != f"Bearer {TOKEN}":
                self.error(401, code, f"Access to {rid} is restricted")
                return None
        return repo

    def commit_of(self, repo, rev):
        rev = unquote(rev)
        if rev == "main":
            return repo["main"]
        if rev in repo["commits"]:
            return rev
        self.error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return None

    def base(self):
        return f"http://{self.headers.get('Host')}"

    def cdn_base(self):
        # Another host name for the same server: clients must not follow (or send the
        # token to) a redirect that leaves the Hub's host.
        port = self.server.server_address[1]
        host = self.headers.get("Host", "").split(":")[0]
        return f"http://{'localhost' if host != 'localhost' else '127.0.0.1'}:{port}"

    # ---- routing
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = urlparse(self.path).path
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self.info(m.group(1)[:-1], m.group(2), m.group(3) or "main")
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        if m:
            return self.tree(m.group(1)[:-1], m.group(2), m.group(3))
        m = re.fullmatch(r"/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self.resolve("dataset" if m.group(1) else "model", m.group(2), m.group(3), unquote(m.group(4)))
        m = re.fullmatch(r"/lfs-cdn/([0-9a-f]{64})", path)
        if m:
            return self.cdn(m.group(1))
        self.error(404, "EntryNotFound", f"no route {path}")

    def do_PUT(self):
        m = re.fullmatch(r"/lfs-part/([0-9a-f]{64})/(\d+)", urlparse(self.path).path)
        if m:
            data = self.body()
            with LOCK:
                PARTS.setdefault(m.group(1), {})[int(m.group(2))] = data
            return self.send(200, b"", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'}, ctype="text/plain")
        m = re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", urlparse(self.path).path)
        if not m:
            return self.error(404, "EntryNotFound", "no route")
        data = self.body()
        if hashlib.sha256(data).hexdigest() != m.group(1):
            return self.error(400, "BadRequest", "sha256 mismatch")
        with LOCK:
            LFS[m.group(1)] = data
        self.send(200, b"", ctype="text/plain")

    def do_POST(self):
        path = urlparse(self.path).path
        if path == "/_control":
            FAULTS.update(json.loads(self.body() or b"{}"))
            return self.send(200, {"ok": True})
        if path == "/_stats":
            self.body()
            return self.send(200, GETS)
        if path == "/api/validate-yaml":
            self.body()
            return self.send(200, {})
        if path == "/api/repos/create":
            return self.create(json.loads(self.body()))
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/preupload/([^/]+)", path)
        if m:
            return self.preupload(json.loads(self.body()))
        m = re.fullmatch(r"/(datasets/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch", path)
        if m:
            return self.lfs_batch(json.loads(self.body()))
        m = re.fullmatch(r"/lfs-multipart/([0-9a-f]{64})", path)
        if m:
            req = json.loads(self.body())
            parts = PARTS.pop(m.group(1), {})
            nums = [p["partNumber"] for p in req["parts"]]
            if req["oid"] != m.group(1) or nums != sorted(parts):
                return self.error(400, "BadRequest", f"parts {nums} do not match {sorted(parts)}")
            for p in req["parts"]:
                if p["etag"] != f'"{hashlib.md5(parts[p["partNumber"]]).hexdigest()}"':
                    return self.error(400, "BadRequest", f"part {p['partNumber']}: wrong etag")
            data = b"".join(parts[n] for n in nums)
            if hashlib.sha256(data).hexdigest() != m.group(1):
                return self.error(400, "BadRequest", "sha256 mismatch")
            with LOCK:
                LFS[m.group(1)] = data
            return self.send(200, {})
        m = re.fullmatch(r"/lfs-verify/([0-9a-f]{64})", path)
        if m:
            self.body()
            return self.send(200 if m.group(1) in LFS else 404, {})
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/commit/([^/]+)", path)
        if m:
            return self.commit(m.group(1)[:-1], m.group(2), self.body())
        self.error(404, "EntryNotFound", f"no route {path}")

    # ---- endpoints
    def create(self, req):
        rtype = req.get("type") or "model"
        rid = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
        with LOCK:
            if (rtype, rid) in REPOS:
                return self.send(409, {"error": "You already created this repo", "url": f"{self.base()}/{rid}"})
            repo = {"commits": {}, "main": None}
            new_commit(repo, {".gitattributes": entry_for(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n", False)}, "initial commit")
            REPOS[(rtype, rid)] = repo
        self.send(200, {"url": f"{self.base()}/{rid}", "name": rid})

    def info(self, rtype, rid, rev):
        repo = self.repo(rtype, rid)
        if repo is None:
            return
        sha = self.commit_of(repo, rev)
        if sha is None:
            return
        files = repo["commits"][sha]
        self.send(200, {"id": rid, "_id": rid, "sha": sha, "private": False, "disabled": False, "gated": False,
                        "tags": [], "downloads": 0, "likes": 0,
                        "siblings": [{"rfilename": p} for p in sorted(files)]})

    def tree(self, rtype, rid, rev):
        repo = self.repo(rtype, rid)
        if repo is None:
            return
        sha = self.commit_of(repo, rev)
        if sha is None:
            return
        out = []
        for p in sorted(repo["commits"][sha]):
            e = repo["commits"][sha][p]
            item = {"type": "file", "oid": e["blob_id"], "size": e["size"], "path": p}
            if "lfs" in e:
                item["lfs"] = {"oid": e["lfs"], "size": e["size"], "pointerSize": len(e["pointer"])}
            out.append(item)
        out.extend(FAULTS.get("extra_tree", {}).get(rid, []))
        self.send(200, out)

    def resolve(self, rtype, rid, rev, fpath):
        repo = self.repo(rtype, rid)
        if repo is None:
            return
        sha = self.commit_of(repo, rev)
        if sha is None:
            return
        e = repo["commits"][sha].get(fpath)
        if e is None:
            return self.error(404, "EntryNotFound", f"{fpath} does not exist")
        etag = e.get("lfs") or e["blob_id"]
        size = e["size"] + FAULTS.get("wrong_size", {}).get(etag, 0)
        shown = "0" * 40 if FAULTS.get("bad_etag", {}).get(etag) else etag
        headers = {"X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        if "lfs" in e:
            headers.update({"X-Linked-Etag": f'"{shown}"', "X-Linked-Size": size, "ETag": f'"{e["blob_id"]}"',
                            "Location": f"{self.cdn_base()}/lfs-cdn/{e['lfs']}"})
            return self.send(302, b"", headers, ctype="text/plain")
        headers["ETag"] = f'"{shown}"'
        if self.command == "HEAD":
            self.send_response(200)
            for k, v in headers.items():
                self.send_header(k, str(v))
            self.send_header("Content-Length", str(size))
            self.end_headers()
            return
        self.stream(etag, e["content"], headers)

    def cdn(self, oid):
        data = LFS.get(oid)
        if data is None:
            return self.error(404, "EntryNotFound", "no such object")
        self.stream(oid, data, {"ETag": f'"{oid}"', "Accept-Ranges": "bytes"})

    def stream(self, etag, data, headers):
        if FAULTS.get("corrupt", {}).get(etag) and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        rng = self.headers.get("Range")
        code = 200
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
            if not m or int(m.group(1)) >= len(data):
                return self.send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            start = int(m.group(1))
            code = 206
            headers = dict(headers, **{"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"})
        self.send_response(code)
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        with LOCK:
            GETS.setdefault(etag, []).append(start)
            cut = FAULTS.get("truncate_once", {}).pop(etag, None)
        body = data[start:]
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        delay = FAULTS.get("delay", 0)
        for i in range(0, len(body), 65536):
            self.wfile.write(body[i:i + 65536])
            if delay:
                time.sleep(delay)

    def preupload(self, req):
        files = []
        for f in req["files"]:
            lfs = f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False})
        self.send(200, {"files": files, "commitOid": None})

    def lfs_batch(self, req):
        objs = []
        for o in req["objects"]:
            item = {"oid": o["oid"], "size": o["size"], "authenticated": True}
            if o["oid"] not in LFS:
                upload = {"href": f"{self.base()}/lfs-upload/{o['oid']}"}
                if o["size"] > MULTIPART_MIN:
                    n = -(-o["size"] // MULTIPART_CHUNK)
                    header = {"chunk_size": str(MULTIPART_CHUNK)}
                    header.update({f"{i:05d}": f"{self.base()}/lfs-part/{o['oid']}/{i}" for i in range(1, n + 1)})
                    upload = {"href": f"{self.base()}/lfs-multipart/{o['oid']}", "header": header}
                item["actions"] = {"upload": upload, "verify": {"href": f"{self.base()}/lfs-verify/{o['oid']}"}}
            objs.append(item)
        self.send(200, {"transfer": "basic", "objects": objs}, ctype="application/vnd.git-lfs+json")

    def commit(self, rtype, rid, body):
        repo = self.repo(rtype, rid)
        if repo is None:
            return
        files = dict(repo["commits"][repo["main"]])
        summary = ""
        for line in body.decode().splitlines():
            if not line.strip():
                continue
            op = json.loads(line)
            v = op["value"]
            if op["key"] == "header":
                summary = v.get("summary", "")
            elif op["key"] == "file":
                files[v["path"]] = entry_for(base64.b64decode(v["content"]), False)
            elif op["key"] == "lfsFile":
                data = LFS.get(v["oid"])
                if data is None:
                    return self.error(400, "BadRequest", f"LFS object {v['oid']} was not uploaded")
                files[v["path"]] = entry_for(data, True)
            elif op["key"] in ("deletedFile", "deletedFolder"):
                for p in [p for p in files if p == v["path"] or p.startswith(v["path"].rstrip("/") + "/")]:
                    del files[p]
        with LOCK:
            sha = new_commit(repo, files, summary)
        self.send(200, {"success": True, "commitOid": sha, "commitUrl": f"{self.base()}/{rid}/commit/{sha}",
                        "commitMessage": summary, "commitDescription": ""})


def main():
    args = sys.argv[1:]
    rtype = "dataset" if "--type" in args and args[args.index("--type") + 1] == "dataset" else "model"
    if args[0] == "serve":
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        print(f"PORT {server.server_address[1]}", flush=True)
        server.serve_forever()
    elif args[0] == "upload":
        from huggingface_hub import HfApi

        api = HfApi(endpoint=args[1], token=TOKEN)
        api.create_repo(args[2], repo_type=rtype, exist_ok=True)
        api.upload_folder(folder_path=args[3], repo_id=args[2], repo_type=rtype)
    elif args[0] == "snapshot":
        from huggingface_hub import snapshot_download

        patterns = None
        if "--mlx-lm-patterns" in args:
            from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS as patterns
        print(snapshot_download(args[3], repo_type=rtype, cache_dir=args[2], endpoint=args[1],
                                token=TOKEN, allow_patterns=patterns))
    elif args[0] == "mlx-upload":
        from huggingface_hub import HfApi
        from mlx_lm.utils import upload_to_hub

        if not hasattr(HfApi, "upload_large_folder"):
            # mlx-lm 0.32.2 calls upload_large_folder, which huggingface_hub 2.x dropped:
            # upload_folder puts the same files in the repo.
            def upload_large_folder(self, folder_path, repo_id, repo_type="model", **_):
                return self.upload_folder(folder_path=folder_path, repo_id=repo_id, repo_type=repo_type)

            HfApi.upload_large_folder = upload_large_folder
        upload_to_hub(args[2], args[3])
    else:
        sys.exit(f"unknown command {args[0]}")


if __name__ == "__main__":
    main()
