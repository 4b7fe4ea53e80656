#!/usr/bin/env python3
"""Reads a sharded checkpoint of this project into whole numpy arrays (numpy only).

    checkpoint_read.py DIR                 list every tensor: name, shape, checksum state
    checkpoint_read.py DIR --out FILE      write the whole tensors as one safetensors file

DIR is a checkpoint directory (it holds index.json) or a --save directory (its `latest`
names the checkpoint). Every file's size and CRC-32 are checked against the index;
every piece is placed at its box (global start and length per dimension) and flat range
inside that box; every element of every tensor must be covered exactly once.
"""
import json
import os
import struct
import sys
import zlib

import numpy as np


def resolve(path):
    if os.path.exists(os.path.join(path, "index.json")):
        return path
    with open(os.path.join(path, "latest")) as f:
        return os.path.join(path, f.read().strip())


def read_safetensors(path):
    """(header dict, data bytes) of one safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:], raw


def load(path):
    """{tensor name: whole numpy float32 array} from the checkpoint at path."""
    path = resolve(path)
    with open(os.path.join(path, "index.json")) as f:
        index = json.load(f)
    files = {}
    for entry in index["files"]:
        header, data, raw = read_safetensors(os.path.join(path, entry["file"]))
        if len(raw) != entry["bytes"] or zlib.crc32(raw) != entry["crc32"]:
            raise ValueError(f"{entry['file']}: size or CRC-32 does not match the index")
        files[entry["file"]] = (header, data)
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
    return tensors, index["metadata"]


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
        tensors, meta = load(argv[1])
    except (OSError, ValueError, KeyError) as e:
        print(f"checkpoint_read.py: {e}", file=sys.stderr)
        return 2
    if len(argv) == 4:
        write_safetensors(argv[3], tensors)
    else:
        print(f"step {meta['step']} saved by {meta['strategy']} on {meta['ranks']} ranks")
        for name in sorted(tensors):
            print(f"  {name:40s} {list(tensors[name].shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
