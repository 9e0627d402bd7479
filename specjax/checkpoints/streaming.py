"""Streamed loading of transformers-format weights: tensor by tensor, slice by slice.

`open_tensors(path)` gives a `LazyTensors` mapping: shapes and dtypes come from the file headers,
and `tensors.read(name)` returns a read-only numpy memory map of the bytes on disk (bfloat16
through `ml_dtypes`), so nothing is read until a slice is used. safetensors files (an 8-byte
header length, a JSON header of name → dtype, shape and byte range, then the raw little-endian
data) and sharded `model.safetensors.index.json` checkpoints are parsed here; PyTorch `.bin`
files are memory-mapped by `torch.load(mmap=True, weights_only=True)`.

`place(entries, tensors, dtype, sharding_for)` builds a params tree from `Entry`s. Each leaf is
made by `jax.make_array_from_callback`: every device's slice is read from the map, converted to
the target dtype and handed over, and the map is released before the next tensor, so host memory
beyond the placed arrays stays near one tensor's slices, never a float32 copy of the model. With
several processes, each reads only the slices of its addressable devices.

Checkpoints on an object store (`gs://bucket/llama`, any URL `etils.epath` opens) are read the
same way without a local copy: headers and index files are read through epath's file objects,
and `read(name)` fetches exactly that tensor's byte range (ranged reads of at most
`REMOTE_CHUNK_BYTES` into one buffer), so the bytes transferred are the headers plus each tensor
once, and the host holds one stored tensor at a time (a memory map of a remote object does not
exist: the slice-by-slice bound of local files becomes tensor by tensor). With several processes,
each fetches every tensor it needs whole. A PyTorch `.bin` / `.pt` on an object store is copied to
a local temporary file first (torch memory-maps only local files), in chunks.

PyTorch pickles need torch (`pip install "specjax[torch]"`); without it opening one raises
`MissingTorchError` naming the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import tempfile
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from specjax.atomic_io import as_path, is_local

__all__ = ["Entry", "LazyTensors", "open_tensors", "lazy_from_mapping", "place",
           "check_float_tensors", "tensors_equal", "stored_bytes", "MissingTorchError", "REMOTE_CHUNK_BYTES",
           "DIGEST_KEY", "tensors_digest", "safetensors_metadata", "check_digest"]

# Largest single read from an object store: a tensor's byte range is fetched in pieces of this
# size into one buffer (bounding what the file object buffers beside it).
REMOTE_CHUNK_BYTES = 64 << 20

TORCH_INSTALL = 'pip install "specjax[torch]"'


class MissingTorchError(ImportError):
  """A PyTorch pickle (`.bin` / `.pt` / `.pth`) was asked for and torch is not installed.

  Attributes:
    path: the checkpoint file.
  """

  def __init__(self, path: str, reason: str = "not installed"):
    self.path = path
    super().__init__(f"{path} is a PyTorch pickle, which needs torch to read ({reason}): "
                     f"{TORCH_INSTALL} (or convert it to safetensors where torch is installed)",
                     name="torch")


def _import_torch(path: str):
  """The torch module, or a `MissingTorchError` naming `path` (and why the import failed)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise MissingTorchError(path, f"import torch: {err}") from err
  return torch

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


@dataclasses.dataclass(frozen=True)
class Entry:
  """One stored tensor: its transformers name, its params path, and `view`, which turns the stored
  array into the params layout by reshapes and transposes only (numpy views: no copy)."""

  name: str
  path: Tuple[str, ...]
  view: Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class _Stored:
  file: str
  dtype: Any
  shape: Tuple[int, ...]
  offset: int  # absolute byte offset in the file


class LazyTensors(Mapping):
  """Name → `jax.ShapeDtypeStruct` of stored tensors (nothing read); `read(name)` maps one."""

  def __init__(self, reader: Callable[[str], np.ndarray],
               meta: Mapping[str, Tuple[Tuple[int, ...], Any]], source: str,
               files: Optional[Mapping[str, str]] = None):
    self._reader = reader
    self._meta = dict(meta)
    self.source = source
    self._files = dict(files or {})

  def file_of(self, name: str) -> str:
    """The file holding tensor `name` (a shard of a sharded checkpoint), else `source`."""
    return self._files.get(name, self.source)

  def __getitem__(self, name: str) -> jax.ShapeDtypeStruct:
    shape, dtype = self._meta[name]
    return jax.ShapeDtypeStruct(shape, dtype)

  def __iter__(self) -> Iterator[str]:
    return iter(self._meta)

  def __len__(self) -> int:
    return len(self._meta)

  def read(self, name: str) -> np.ndarray:
    """A read-only numpy array of the stored tensor (memory-mapped where the format allows)."""
    if name not in self._meta:
      raise KeyError(f"{self.source} holds no tensor {name!r}")
    return self._reader(name)

  def without(self, names: Sequence[str]) -> "LazyTensors":
    """The same tensors minus `names` (e.g. ignored buffers)."""
    drop = set(names)
    return LazyTensors(self._reader, {k: v for k, v in self._meta.items() if k not in drop},
                       self.source, self._files)

  def with_alias(self, name: str, existing: str) -> "LazyTensors":
    """The same tensors plus `name`, reading `existing` (a tied copy)."""
    meta = dict(self._meta)
    meta[name] = self._meta[existing]
    files = dict(self._files)
    files[name] = self.file_of(existing)
    reader = self._reader
    return LazyTensors(lambda n: reader(existing if n == name else n), meta, self.source, files)


def _open_binary(path: str):
  """A binary file object of a local path or a URL (epath)."""
  return open(path, "rb") if is_local(path) else as_path(path).open("rb")


def _size(path: str) -> int:
  return os.path.getsize(path) if is_local(path) else int(as_path(path).stat().length)


def _exists(path: str) -> bool:
  return os.path.exists(path) if is_local(path) else as_path(path).exists()


def _isdir(path: str) -> bool:
  return os.path.isdir(path) if is_local(path) else as_path(path).is_dir()


def _join(directory: str, name: str) -> str:
  return os.path.join(directory, name) if is_local(directory) else (
      f"{directory.rstrip('/')}/{name}")


# The `__metadata__` of each safetensors file as its header was last parsed (so that reading
# the digest after opening a file reads no byte twice).
_HEADER_METADATA: Dict[str, Dict[str, str]] = {}


def _safetensors_header(path: str) -> Dict[str, _Stored]:
  size = _size(path)
  with _open_binary(path) as f:
    raw = f.read(8)
    if len(raw) < 8:
      raise ValueError(f"{path} is not a safetensors file: {size} bytes, no header length")
    (n,) = struct.unpack("<Q", raw)
    if n > size - 8:
      raise ValueError(f"{path} is truncated or not a safetensors file: its header claims "
                       f"{n} bytes, the file has {size}")
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
      raise ValueError(f"{path} is not a safetensors file: unreadable header ({err})") from None
  meta = header.get("__metadata__")
  _HEADER_METADATA[str(path)] = dict(meta) if isinstance(meta, dict) else {}
  out: Dict[str, _Stored] = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    dtype = _ST_DTYPES.get(info.get("dtype"))
    if dtype is None:
      raise ValueError(f"{path}: tensor {name} has dtype {info.get('dtype')!r}; readable: "
                       f"{sorted(_ST_DTYPES)}")
    begin, end = info["data_offsets"]
    shape = tuple(int(s) for s in info["shape"])
    if end - begin != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
      raise ValueError(f"{path}: tensor {name}'s byte range does not match its shape {shape}")
    if 8 + n + end > size:
      raise ValueError(f"{path} is truncated: tensor {name} ends at byte {8 + n + end}, "
                       f"the file has {size}")
    out[name] = _Stored(path, np.dtype(dtype), shape, 8 + n + begin)
  return out


# The safetensors metadata key under which specjax's exporters store `tensors_digest` of a file.
DIGEST_KEY = "specjax_tensors_sha256"


def tensors_digest(named: Iterable[Tuple[str, np.ndarray]]) -> str:
  """sha256 of named tensors: every name, dtype, shape and the bytes, in name order (what
  `save_safetensors` writes and `check_digest` reads back)."""
  h = hashlib.sha256()
  for name, x in sorted(named, key=lambda kv: kv[0]):
    x = np.ascontiguousarray(np.asarray(x))
    h.update(f"{name}|{x.dtype.str}|{x.shape}|".encode())
    h.update(x.reshape(-1).view(np.uint8))
  return h.hexdigest()


def safetensors_metadata(path: str) -> Dict[str, str]:
  """The `__metadata__` of a safetensors file's header ({} where there is none); the one
  parsed when the file was opened, when it was."""
  if str(path) in _HEADER_METADATA:
    return dict(_HEADER_METADATA[str(path)])
  with _open_binary(path) as f:
    (n,) = struct.unpack("<Q", f.read(8))
    meta = json.loads(f.read(n)).get("__metadata__") or {}
  return dict(meta) if isinstance(meta, dict) else {}


def check_digest(tensors: "LazyTensors") -> bool:
  """For every safetensors file of `tensors` whose metadata carries `DIGEST_KEY` (written by
  `export_hf_decoder` / `export_hf_t5`), its tensors as read now against that digest: a
  ValueError naming the file where a byte changed since it was written. Returns whether any
  file was verified (files from elsewhere carry no digest: nothing vouches for their values)."""
  by_file: Dict[str, list] = {}
  for name in tensors:
    by_file.setdefault(tensors.file_of(name), []).append(name)
  verified = False
  for file, names in by_file.items():
    if not str(file).endswith(".safetensors"):
      continue
    want = safetensors_metadata(file).get(DIGEST_KEY)
    if want is None:
      continue
    got = tensors_digest((n, tensors.read(n)) for n in names)
    if got != want:
      raise ValueError(f"{file} is corrupt: its tensors' sha256 is {got[:16]}..., the export "
                       f"wrote {want[:16]}... (a byte changed since it was written); export it "
                       "again or restore a copy")
    verified = True
  return verified


def _read_range(path: str, offset: int, nbytes: int) -> bytearray:
  """Bytes [offset, offset + nbytes) of a file on any filesystem, read in chunks of
  `REMOTE_CHUNK_BYTES` into one buffer."""
  buf = bytearray(nbytes)
  view = memoryview(buf)
  got = 0
  with _open_binary(path) as f:
    f.seek(offset)
    while got < nbytes:
      chunk = f.read(min(nbytes - got, REMOTE_CHUNK_BYTES))
      if not chunk:
        raise ValueError(f"{path} is truncated: byte {offset + got} could not be read "
                         f"(wanted {nbytes} bytes from offset {offset})")
      view[got:got + len(chunk)] = chunk
      got += len(chunk)
  return buf


def _map(stored: _Stored) -> np.ndarray:
  """The stored tensor: a read-only memory map of a local file, the fetched bytes of a remote
  one (read-only too)."""
  if int(np.prod(stored.shape, dtype=np.int64)) == 0:
    return np.zeros(stored.shape, stored.dtype)
  if is_local(stored.file):
    return np.memmap(stored.file, dtype=stored.dtype, mode="r", offset=stored.offset,
                     shape=stored.shape)
  nbytes = int(np.prod(stored.shape, dtype=np.int64)) * stored.dtype.itemsize
  out = np.frombuffer(_read_range(stored.file, stored.offset, nbytes), stored.dtype)
  out = out.reshape(stored.shape)
  out.flags.writeable = False
  return out


def _open_safetensors(files: Sequence[str], source: str) -> LazyTensors:
  stored: Dict[str, _Stored] = {}
  for file in files:
    for name, s in _safetensors_header(file).items():
      if name in stored:
        raise ValueError(f"tensor {name} is stored twice ({stored[name].file}, {file})")
      stored[name] = s
  return LazyTensors(lambda n: _map(stored[n]), {k: (s.shape, s.dtype) for k, s in stored.items()},
                     source, {k: s.file for k, s in stored.items()})


def _torch_to_numpy(t) -> np.ndarray:
  import torch  # pylint: disable=import-outside-toplevel  (a torch tensor was given)
  t = t.detach().cpu()
  if t.dtype == torch.bfloat16:
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return t.numpy()


def lazy_from_mapping(tensors: Mapping[str, Any], source: str = "state dict") -> LazyTensors:
  """An in-memory state dict (torch tensors or arrays) as `LazyTensors`."""
  arrays = {str(k): _torch_to_numpy(v) if hasattr(v, "detach") else np.asarray(v)
            for k, v in tensors.items()}
  return LazyTensors(arrays.__getitem__, {k: (a.shape, a.dtype) for k, a in arrays.items()},
                     source)


def _load_torch(path: str) -> Mapping[str, Any]:
  """A PyTorch state dict, memory-mapped (`weights_only`: tensors and containers, never code);
  a remote file is first copied to a local temporary file, which is unlinked once mapped."""
  torch = _import_torch(path)
  if not is_local(path):
    with tempfile.TemporaryDirectory(prefix="specjax-torch-", ignore_cleanup_errors=True) as d:
      local = os.path.join(d, os.path.basename(path))
      with _open_binary(path) as src, open(local, "wb") as dst:
        shutil.copyfileobj(src, dst, REMOTE_CHUNK_BYTES)
      return _load_torch(local)  # the mapping outlives the unlinked file (POSIX)
  try:
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
  except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
    return torch.load(path, map_location="cpu", weights_only=True)


def open_tensors(path: Any) -> LazyTensors:
  """The tensors of a checkpoint file or directory, lazily.

  Accepts a `.safetensors` file, a sharded `*.safetensors.index.json`, a PyTorch `.bin` / `.pt` /
  `.pth` state dict (memory-mapped by torch, never unpickled beyond tensors; needs torch), or a
  directory holding `model.safetensors`, `model.safetensors.index.json` or `pytorch_model.bin`;
  a local path or a URL (`gs://...`, read through `etils.epath`: see the module doc).

  Raises:
    FileNotFoundError: no such file, or a directory without weights / an index naming absent
      shards.
    ValueError: an unknown format, a damaged file (named).
    MissingTorchError: a PyTorch pickle where torch is not installed.
  """
  path = os.fspath(path)
  if _isdir(path):
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
      candidate = _join(path, name)
      if _exists(candidate):
        return open_tensors(candidate)
    raise FileNotFoundError(
        f"{path} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
  if not _exists(path):
    raise FileNotFoundError(f"checkpoint file {path} does not exist")
  if path.endswith(".index.json"):
    with _open_binary(path) as f:
      try:
        index = json.loads(f.read())
      except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a valid index file: {err}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
      raise ValueError(f"{path} has no weight_map")
    folder = os.path.dirname(path)
    files = [_join(folder, f) for f in sorted(set(weight_map.values()))]
    missing = [f for f in files if not _exists(f)]
    if missing:
      raise FileNotFoundError(f"{path} names shards that do not exist: {missing}")
    lazy = _open_safetensors(files, path)
    absent = sorted(set(weight_map) - set(lazy))
    if absent:
      raise ValueError(f"{path} maps tensors that its shards do not hold: {absent[:5]}")
    return lazy
  if path.endswith(".safetensors"):
    return _open_safetensors([path], path)
  if path.endswith((".bin", ".pt", ".pth")):
    state = _load_torch(path)
    if not isinstance(state, Mapping):
      raise ValueError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return lazy_from_mapping(state, path)
  raise ValueError(f"unknown checkpoint format for {path}: expected .safetensors, "
                   ".safetensors.index.json, .bin, .pt or .pth")


def check_float_tensors(tensors: LazyTensors, names: Sequence[str], dtype: Any) -> None:
  """Every tensor of `names` present in `tensors` is stored as a float (F16 / BF16 / F32 / F64).

  An integer or bool tensor where a float weight is expected (a quantized or mis-exported
  checkpoint) would be cast to `dtype` silently and give a model of wrong values: refused.

  Raises:
    ValueError: naming the file, the tensor, its stored dtype and the expected one.
  """
  target = np.dtype(jnp.dtype(dtype))
  for name in names:
    if name not in tensors:
      continue
    stored = np.dtype(tensors[name].dtype)
    if not jnp.issubdtype(stored, jnp.floating):
      raise ValueError(
          f"{tensors.file_of(name)}: tensor {name} is stored as {stored.name}, expected a float "
          f"weight (float16 / bfloat16 / float32 / float64, read as {target.name}); an integer "
          "or bool tensor here is a quantized or mis-exported checkpoint and is not cast")


def tensors_equal(tensors: LazyTensors, a: str, b: str, rows: int = 4096) -> bool:
  """Whether two stored tensors hold the same values (compared in blocks of rows, so a tied
  embedding check never holds two whole copies)."""
  x, y = tensors.read(a), tensors.read(b)
  if x.shape != y.shape:
    return False
  if x.ndim == 0:
    return bool(np.array_equal(x, y))
  for start in range(0, x.shape[0], rows):
    if not np.array_equal(np.asarray(x[start:start + rows], np.float32),
                          np.asarray(y[start:start + rows], np.float32)):
      return False
  return True


def _set(tree: Dict[str, Any], path: Tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _owned(x: np.ndarray, dtype) -> np.ndarray:
  """A C-contiguous copy in `dtype` owning its memory (never a view of a map: jax may keep a
  host buffer it is given without copying)."""
  return np.array(x, dtype=dtype, copy=True, order="C")


def place(entries: Sequence[Entry], tensors: LazyTensors, dtype: Any,
          sharding_for: Optional[Callable[[Tuple[str, ...], Tuple[int, ...]], Any]] = None
          ) -> Dict[str, Any]:
  """The params tree of `entries`, read from `tensors` and cast to `dtype`.

  `sharding_for(path, shape)` → the `jax.sharding.Sharding` each leaf is placed with, slice by
  slice; None: the default device.
  """
  np_dtype = np.dtype(jnp.dtype(dtype))
  check_float_tensors(tensors, [entry.name for entry in entries], dtype)
  params: Dict[str, Any] = {}
  if sharding_for is None:
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    sharding_for = lambda path, shape: one
  for entry in entries:
    stored = tensors.read(entry.name)
    view = entry.view(stored)
    sharding = sharding_for(entry.path, tuple(view.shape))
    value = jax.make_array_from_callback(
        tuple(view.shape), sharding, lambda index, v=view: _owned(v[index], np_dtype))
    _set(params, entry.path, value)
    del stored, view  # release the map before the next tensor
  return params


def stored_bytes(tensors: LazyTensors) -> Tuple[int, int]:
  """(total, largest) bytes of the stored tensors."""
  sizes = [int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.dtype).itemsize
           for s in tensors.values()]
  return sum(sizes), max(sizes, default=0)
