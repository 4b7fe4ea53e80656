#!/usr/bin/env python3
"""Reads a sharded checkpoint of this project into whole numpy arrays (numpy only).

    checkpoint_read.py DIR                 the checksum state of index.json and of every
                                           file, then every tensor: name, shape
    checkpoint_read.py DIR --out FILE      write the whole tensors as one safetensors file
                                           (and say what was written)

DIR is a checkpoint directory (it holds index.json) or a --save directory (its `latest`
names the checkpoint). index.json's own CRC-32 (its last member, index_crc32) and every
file's size and CRC-32 are checked against the index; every piece is placed at its box
(global start and length per dimension) and flat range inside that box; every element
of every tensor must be covered exactly once. Any failure is one line and exit status 2.
"""
import json
import os
import stat
import struct
import sys
import zlib

try:
    import numpy as np
except ImportError:
    print("checkpoint_read.py: needs numpy, which this python3 cannot import; install it"
          " (Debian: apt-get install python3-numpy; pip: pip install numpy)", file=sys.stderr)
    sys.exit(2)

INDEX_CRC_LINE = b'\n  "index_crc32": '   # checkpoint.h: CKPT_INDEX_CRC_LINE
MAX_SMALL_FILE = 1 << 30                   # latest and index.json, as the programs allow


def read_regular(path, max_bytes=None):
    """The bytes of a regular file (a FIFO would block, /dev/zero never end)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: not a regular file; a checkpoint holds plain files")
    if max_bytes is not None and st.st_size > max_bytes:
        raise ValueError(f"{path}: {st.st_size} bytes, more than the {max_bytes} it may have")
    with open(path, "rb") as f:
        return f.read()


def resolve(path):
    if os.path.exists(os.path.join(path, "index.json")):
        return path
    name = read_regular(os.path.join(path, "latest"), 4096).decode().strip()
    return os.path.join(path, name)


def read_index(path):
    """index.json, parsed, after its own CRC-32 is checked; and that check's line."""
    name = os.path.join(path, "index.json")
    raw = read_regular(name, MAX_SMALL_FILE)
    cut = raw.rfind(INDEX_CRC_LINE)
    index = json.loads(raw)
    if cut < 0 or "index_crc32" not in index:
        raise ValueError(f"{name}: no index_crc32 (written before indexes had a checksum,"
                         " or edited); it cannot be checked")
    crc = zlib.crc32(raw[:cut + 1])
    if crc != index["index_crc32"]:
        raise ValueError(f"{name}: CRC-32 {crc:08x} of its content, index_crc32 says"
                         f" {index['index_crc32']:08x} (edited or corrupted)")
    return index, f"index.json: CRC-32 {crc:08x} ok"


def read_safetensors(path, entry):
    """(header dict, data bytes) of one safetensors file, and its checksum line."""
    raw = read_regular(path)
    if len(raw) != entry["bytes"]:
        raise ValueError(f"{path}: {len(raw)} bytes, the index says {entry['bytes']}")
    crc = zlib.crc32(raw)
    if crc != entry["crc32"]:
        raise ValueError(f"{path}: CRC-32 {crc:08x}, the index says {entry['crc32']:08x}"
                         " (corrupted)")
    (n,) = struct.unpack("<Q", raw[:8])
    state = f"{entry['file']}: {len(raw)} bytes, CRC-32 {crc:08x} ok"
    return json.loads(raw[8:8 + n]), raw[8 + n:], state


def load(path):
    """({tensor name: whole numpy float32 array}, metadata, checksum lines) from the
    checkpoint at path."""
    path = resolve(path)
    index, index_state = read_index(path)
    files, checks = {}, [index_state]
    for entry in index["files"]:
        header, data, state = read_safetensors(os.path.join(path, entry["file"]), entry)
        files[entry["file"]] = (header, data)
        checks.append(state)
    tensors, covered = {}, {}
    for p in index["pieces"]:
        name, shape = p["tensor"], p["shape"]
        if name not in tensors:
            tensors[name] = np.zeros(shape, dtype="<f4")
            covered[name] = np.zeros(shape, dtype=np.int32)
        header, data = files[p["file"]]
        begin, end = header[name]["data_offsets"]
        values = np.frombuffer(data[begin:end], dtype="<f4")
        box = tuple(slice(s, s + n) for s, n in zip(p["box_start"], p["box_shape"]))
        a, b = p["flat"]
        # the piece is flat elements [a, b) of the box, in row-major order
        view = tensors[name][box].reshape(-1).copy()
        mark = covered[name][box].reshape(-1).copy()
        view[a:b] = values
        mark[a:b] += 1
        tensors[name][box] = view.reshape(p["box_shape"])
        covered[name][box] = mark.reshape(p["box_shape"])
    for name, mark in covered.items():
        if not np.all(mark == 1):
            raise ValueError(f"{name}: some elements are held by no piece or by several")
    return tensors, index["metadata"], checks


def write_safetensors(path, tensors):
    header, offset = {}, 0
    names = sorted(tensors)
    for name in names:
        n = tensors[name].nbytes
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--out"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        tensors, meta, checks = load(argv[1])
    except (OSError, ValueError, KeyError, UnicodeDecodeError, struct.error) as e:
        print(f"checkpoint_read.py: {e}", file=sys.stderr)
        return 2
    if len(argv) == 4:
        write_safetensors(argv[3], tensors)
        print(f"wrote {len(tensors)} tensors ({sum(t.size for t in tensors.values())} floats,"
              f" {os.path.getsize(argv[3])} bytes) of step {meta['step']} to {argv[3]};"
              f" checksums ok: {len(checks)} files")
    else:
        print(f"step {meta['step']} saved by {meta['strategy']} on {meta['ranks']} ranks")
        for line in checks:
            print(f"  {line}")
        for name in sorted(tensors):
            print(f"  {name:40s} {list(tensors[name].shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
