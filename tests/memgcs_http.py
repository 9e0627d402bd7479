"""The in-memory `gs://` of tests/memgcs.py over HTTP, for code that reaches GCS without fsspec.

orbax writes and reads array data through tensorstore's own GCS driver (C++, HTTP to the GCS JSON
API), not through fsspec, so `MemGCS` alone cannot hold an orbax checkpoint. `GcsServer` serves
the same `MemGCS.store` over the part of the JSON API tensorstore uses (media reads with byte
ranges and generation conditions, metadata, media uploads with `ifGenerationMatch`, deletes,
listings), and the `memgcs_http` fixture points tensorstore at it (`TENSORSTORE_GCS_HTTP_URL`,
a fixed test token, so no credentials and no metadata server are looked for). Objects written
either way are visible both ways. One server per process (tensorstore may keep the URL it read
first); the store is emptied around each test by `memgcs`.
"""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from typing import Dict, Optional, Tuple

import pytest
from fsspec.implementations.memory import MemoryFile

from memgcs import MemGCS, memgcs  # noqa: F401  (memgcs: the fixture this one builds on)

_generations: Dict[str, Tuple[int, int]] = {}  # key -> (id of the MemoryFile, generation)
_lock = threading.Lock()
_counter = [0]


def _generation(key: str) -> Optional[int]:
  """The object's generation: a new one whenever its MemoryFile changed (a write either way)."""
  with _lock:
    return _generation_unlocked(key)


def _generation_unlocked(key: str) -> Optional[int]:
  obj = MemGCS.store.get(key)
  if obj is None:
    return None
  known = _generations.get(key)
  if known is None or known[0] != id(obj):
    _counter[0] += 1
    known = (id(obj), _counter[0])
    _generations[key] = known
  return known[1]


def _metadata(bucket: str, name: str) -> dict:
  key = f"{bucket}/{name}"
  size = MemGCS.store[key].getbuffer().nbytes
  gen = _generation(key)
  return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(size),
          "generation": str(gen), "metageneration": "1",
          "updated": "2026-01-01T00:00:00.000Z", "timeCreated": "2026-01-01T00:00:00.000Z"}


class _Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"

  def log_message(self, *args):  # quiet
    pass

  def _send(self, code: int, body: bytes = b"", headers: Optional[dict] = None,
            content_type: str = "application/json") -> None:
    self.send_response(code)
    self.send_header("Content-Type", content_type)
    self.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.end_headers()
    if body and self.command != "HEAD":
      self.wfile.write(body)

  def _json(self, code: int, value) -> None:
    self._send(code, json.dumps(value).encode())

  def _error(self, code: int, message: str) -> None:
    self._json(code, {"error": {"code": code, "message": message}})

  def _parse(self):
    url = urllib.parse.urlsplit(self.path)
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
    parts = url.path.split("/")
    return parts, query

  def _conditions_fail(self, query: dict, gen: Optional[int]) -> Optional[int]:
    """412 / 304 when a generation condition does not hold, else None."""
    match = query.get("ifGenerationMatch")
    if match is not None and int(match) != (gen or 0):
      return 412
    not_match = query.get("ifGenerationNotMatch")
    if not_match is not None and gen is not None and int(not_match) == gen:
      return 304
    return None

  def do_GET(self):  # noqa: N802
    parts, query = self._parse()
    # /storage/v1/b/{bucket}[/o[/{object}]]
    if parts[1:4] != ["storage", "v1", "b"] or len(parts) < 5:
      return self._error(400, f"unsupported GET {self.path}")
    bucket = urllib.parse.unquote(parts[4])
    if len(parts) == 5:
      return self._json(200, {"kind": "storage#bucket", "name": bucket})
    if len(parts) == 6 and parts[5] == "o":
      return self._list(bucket, query)
    name = urllib.parse.unquote("/".join(parts[6:]))
    key = f"{bucket}/{name}"
    gen = _generation(key)
    if gen is None:
      return self._error(404, f"no object {key}")
    failed = self._conditions_fail(query, gen)
    if failed:
      return self._send(failed, headers={"x-goog-generation": str(gen)})
    if query.get("alt") != "media":
      return self._json(200, _metadata(bucket, name))
    data = MemGCS.store[key].getvalue()
    headers = {"x-goog-generation": str(gen), "x-goog-metageneration": "1",
               "x-goog-stored-content-length": str(len(data))}
    ranged = self.headers.get("Range")
    if ranged:
      first, _, last = ranged.split("=", 1)[1].partition("-")
      if first == "":  # a suffix: bytes=-N
        start, end = max(0, len(data) - int(last)), len(data) - 1
      else:
        start, end = int(first), (int(last) if last else len(data) - 1)
      if start >= len(data) and len(data) > 0:
        return self._send(416, headers=headers)
      end = min(end, len(data) - 1)
      headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
      return self._send(206, data[start:end + 1], headers, "application/octet-stream")
    return self._send(200, data, headers, "application/octet-stream")

  def _list(self, bucket: str, query: dict) -> None:
    prefix = query.get("prefix", "")
    start = query.get("startOffset", "")
    end = query.get("endOffset")
    items = []
    for key in sorted(MemGCS.store):
      b, _, name = key.partition("/")
      if b != bucket or not name.startswith(prefix) or name < start:
        continue
      if end is not None and name >= end:
        continue
      items.append(_metadata(bucket, name))
    return self._json(200, {"kind": "storage#objects", "items": items})

  def _body(self) -> bytes:
    if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
      out = bytearray()
      while True:
        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
          self.rfile.readline()
          return bytes(out)
        out += self.rfile.read(size)
        self.rfile.readline()
    return self.rfile.read(int(self.headers.get("Content-Length", 0)))

  def do_POST(self):  # noqa: N802
    parts, query = self._parse()
    # /upload/storage/v1/b/{bucket}/o?uploadType=media&name=...
    if parts[1:5] != ["upload", "storage", "v1", "b"] or query.get("uploadType") != "media":
      return self._error(400, f"unsupported POST {self.path}")
    bucket = urllib.parse.unquote(parts[5])
    name = query["name"]
    key = f"{bucket}/{name}"
    data = self._body()
    with _lock:
      gen = _generation_unlocked(key)
      match = query.get("ifGenerationMatch")
      if match is not None and int(match) != (gen or 0):
        return self._error(412, f"precondition failed for {key}")
      MemGCS.store[key] = MemoryFile(None, key, data)
    return self._json(200, _metadata(bucket, name))

  def do_DELETE(self):  # noqa: N802
    parts, query = self._parse()
    if parts[1:4] != ["storage", "v1", "b"] or len(parts) < 7:
      return self._error(400, f"unsupported DELETE {self.path}")
    bucket = urllib.parse.unquote(parts[4])
    key = f"{bucket}/{urllib.parse.unquote('/'.join(parts[6:]))}"
    with _lock:
      gen = _generation_unlocked(key)
      if gen is None:
        return self._error(404, f"no object {key}")
      match = query.get("ifGenerationMatch")
      if match is not None and int(match) != gen:
        return self._error(412, f"precondition failed for {key}")
      del MemGCS.store[key]
    return self._send(204)


_server: list = []


def server_url() -> str:
  """The URL of this process's server (started on first use)."""
  if not _server:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _server.append(httpd)
  host, port = _server[0].server_address[:2]
  return f"http://{host}:{port}"


@pytest.fixture
def memgcs_http(memgcs, monkeypatch):  # noqa: F811
  """`memgcs`, and tensorstore's GCS driver (orbax's array data) served from the same store."""
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", server_url())
  monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "memgcs")
  yield memgcs
