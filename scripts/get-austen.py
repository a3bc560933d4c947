#!/usr/bin/env python3
"""Extracts Jane Austen's six novels from Debian's r-cran-janeaustenr (public domain texts from
Project Gutenberg, stored as R lazy-load data) and writes a fixed train / held-out split.

The data are read without R: Rdata.rdx (gzip) indexes Rdata.rdb, whose entries are zlib-compressed
R serializations (format "X", XDR) of character vectors, one line of a novel per element. The
package is used where it is installed (/usr/lib/R/site-library/janeaustenr), else its .deb is
fetched with `apt-get download` and unpacked with `dpkg-deb -x` (R itself is not needed).

The split (docs/runner.md): each novel is its lines joined with "\\n"; the first 90% of its lines
go to training text and the rest to held-out text, the cut moved forward to the next empty
line so that the held-out part starts at a paragraph. Novels in publication order, separated by
a blank line: Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma,
Northanger Abbey, Persuasion.

usage: scripts/get-austen.py [OUT_DIR]   (default ${NIBBLE_CACHE:-~/.cache/nibble}/austen)
prints the paths of austen-train.txt and austen-heldout.txt
"""
import glob
import gzip
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

BOOKS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
         "persuasion"]
HELD_OUT_FRACTION = 0.10
INSTALLED = "/usr/lib/R/site-library/janeaustenr/data"


class RReader:
    """Just enough of R's XDR serialization for vectors, pairlists and symbols."""

    NILVALUE, SYM, LIST, CHAR, LGL, INT, REAL, STR, VEC, REF = 254, 1, 2, 9, 10, 13, 14, 16, 19, 255

    def __init__(self, data):
        self.b, self.p, self.refs = data, 0, []

    def i32(self):
        if self.p + 4 > len(self.b):
            raise ValueError("truncated R serialization")
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def read(self):
        if self.b[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.p = 2
        version = self.i32()
        self.i32(), self.i32()  # writer and minimal reader versions
        if version == 3:
            n = self.i32()  # the native encoding's name follows
            self.p += n
        return self.item()

    def item(self):
        flags = self.i32()
        t, levels = flags & 0xFF, flags >> 12
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t == self.NILVALUE:
            return None
        if t == self.REF:
            return self.refs[(flags >> 8) - 1]
        if t == self.SYM:
            sym = ("symbol", self.item())
            self.refs.append(sym)
            return sym
        if t == self.CHAR:
            n = self.i32()
            if n == -1:
                return None  # NA_character_
            raw = self.b[self.p:self.p + n]
            self.p += n
            return raw.decode("latin-1" if levels & 4 else "utf-8")
        if t == self.LIST:
            attr = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            return ("pairlist", tag, self.item(), self.item(), attr)
        if t in (self.STR, self.VEC, self.INT, self.LGL, self.REAL):
            n = self.i32()
            if t in (self.STR, self.VEC):
                v = [self.item() for _ in range(n)]
            elif t == self.REAL:
                v = list(struct.unpack_from(">%dd" % n, self.b, self.p))
                self.p += 8 * n
            else:
                v = list(struct.unpack_from(">%di" % n, self.b, self.p))
                self.p += 4 * n
            if has_attr:
                return ("attributed", v, self.item())
            return v
        raise ValueError(f"R type {t} is not handled")


def names_of(attrs):
    while attrs is not None:
        _, tag, value, attrs, _ = attrs
        if tag == ("symbol", "names"):
            return value
    return None


def find_data_dir(tmp):
    if os.path.isfile(os.path.join(INSTALLED, "Rdata.rdx")):
        return INSTALLED
    print("get-austen: r-cran-janeaustenr is not installed; fetching its .deb", file=sys.stderr)
    cmd = ["apt-get", "download", "r-cran-janeaustenr"]
    if subprocess.run(cmd, cwd=tmp, stdout=subprocess.DEVNULL).returncode != 0:
        # A fresh machine may have no package lists yet.
        print("get-austen: apt-get download failed; running apt-get update first", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-q"] if os.geteuid() == 0 else
                       ["sudo", "apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(cmd, cwd=tmp, check=True, stdout=subprocess.DEVNULL)
    deb = glob.glob(os.path.join(tmp, "r-cran-janeaustenr_*.deb"))[0]
    subprocess.run(["dpkg-deb", "-x", deb, os.path.join(tmp, "x")], check=True)
    return os.path.join(tmp, "x" + INSTALLED)


def load_books(data_dir):
    with open(os.path.join(data_dir, "Rdata.rdx"), "rb") as f:
        index = RReader(gzip.decompress(f.read())).read()
    _, top, top_attrs = index
    variables = dict(zip(names_of(top_attrs), top))["variables"]
    _, offsets, var_attrs = variables
    where = dict(zip(names_of(var_attrs), offsets))
    with open(os.path.join(data_dir, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    books = {}
    for name in BOOKS:
        start, length = where[name]
        blob = rdb[start:start + length]
        size = struct.unpack(">I", blob[:4])[0]
        data = zlib.decompress(blob[4:])
        if len(data) != size:
            raise ValueError(f"{name}: decompressed size {len(data)} != {size}")
        lines = RReader(data).read()
        if isinstance(lines, tuple):  # a character vector with attributes
            lines = lines[1]
        books[name] = ["" if s is None else s for s in lines]
    return books


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.environ.get("NIBBLE_CACHE", os.path.expanduser("~/.cache/nibble")), "austen")
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        books = load_books(find_data_dir(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    train, held = [], []
    for name in BOOKS:
        lines = books[name]
        cut = int(len(lines) * (1.0 - HELD_OUT_FRACTION))
        while cut < len(lines) and lines[cut].strip():
            cut += 1
        train.append("\n".join(lines[:cut]).strip("\n"))
        held.append("\n".join(lines[cut:]).strip("\n"))
        print(f"  {name}: {len(lines)} lines, held out from line {cut + 1}", file=sys.stderr)
    paths = []
    for fname, parts in (("austen-train.txt", train), ("austen-heldout.txt", held)):
        text = "\n\n".join(parts) + "\n"
        path = os.path.join(out, fname)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        print(f"  {fname}: {len(text.encode('utf-8'))} bytes, sha256 {digest}", file=sys.stderr)
        paths.append(path)
    print("\n".join(paths))


if __name__ == "__main__":
    main()
