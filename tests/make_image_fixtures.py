#!/usr/bin/env python3
"""Write the PNG and PGM fixtures that test mnistcu_image_load.

Regenerate (from any folder; the files go to tests/fixtures/images/ next to
this script):

    /usr/bin/python3 tests/make_image_fixtures.py        # needs python3-pil, python3-numpy

Options: --out DIR writes elsewhere, --quiet prints only problems.  The output
is deterministic (fixed seeds, no timestamps): running the script again writes
byte-identical files, given the same zlib (the compressed streams come from
Python's zlib module) and the same Pillow (only the drawn digits use it).

The PNG files are written by the encoder in this script (zlib does the
deflate), which chooses the filter type of every scanline, the interlacing,
the chunk layout and the zlib settings; Pillow only reads them back as an
independent check (and draws the digit strokes).  What is written:

  tests/fixtures/images/
    MANIFEST.txt     one line per file: `name width height expected`, where
                     expected is `ok` (a valid image, with name.gray beside it)
                     or the error class of a malformed file: crc, signature,
                     ihdr, truncated, zlib, size, filter, palette, order, pgm,
                     huge.  Lines starting with '#' are comments.  For a
                     malformed file, width and height are those its header was
                     meant to state (informative only).
    *.png, *.pgm     valid images: every PNG colour type and bit depth, Adam7
                     interlaced and not, odd sizes (1x1, 3x7, 13x5, 33x17, ...),
                     every filter type, split IDAT, ancillary chunks, several
                     zlib settings (stored, fixed and dynamic Huffman blocks,
                     small windows, flushes); PGM P5 (8 and 16 bit) and P2 with
                     several maxvals; then the malformed variations.
    <name>.gray      for each valid image <name> (g8.png.gray, p2.pgm.gray, ...),
                     its 8-bit grayscale conversion: raw bytes, row-major,
                     width*height bytes, nothing before.
    digits/          drawn digits 0-9 (two variants each, digit_<label>_<v>.png),
                     digits/MANIFEST.txt (`name label`) and digits/preview.png,
                     a contact sheet showing each digit and the MNIST-style
                     28x28 input it becomes (see mnist_preprocess below: crop
                     to the ink, fit in 20x20 by area averaging, centre of mass
                     at the centre, ink bright).  Those inputs are for a person
                     to look at; no file holds them, as resampling details may
                     differ from the library's.

The grayscale conversion, integer arithmetic throughout (the .gray files are
computed from the sample values encoded, not by decoding the files):

  - a 16-bit sample v becomes 8 bits as (v * 255 + 32767) // 65535;
  - a gray sample of bit depth d < 8 becomes v * 255 // (2^d - 1) (exact);
  - RGB (8-bit, after the step above) gives the luminance
    (299 * R + 587 * G + 114 * B + 500) // 1000;
  - palette entries are 8-bit RGB; a tRNS chunk gives the alpha of the first
    entries, later entries have alpha 255;
  - alpha a (8-bit, after the 16-bit step) is composited over white:
    (g * a + 255 * (255 - a) + 127) // 255, g the gray value or luminance;
  - a PGM sample v with maxval M becomes (v * 255 + M // 2) // M.

Every valid PNG is read back with Pillow and its samples compared with the
ones encoded (Pillow reduces 16-bit colour and gray+alpha samples to their high
byte; those are compared as v >> 8, 16-bit gray exactly); every malformed file
is handed to Pillow too, and the table printed at the end says which ones
Pillow rejects.  The exit status is 1 if a valid file does not read back as
encoded.
"""

import argparse
import math
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageDraw

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "fixtures", "images")

PNG_SIG = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
CT_NAME = {0: "gray", 2: "rgb", 3: "palette", 4: "gray+alpha", 6: "rgba"}
# Adam7 passes: x start, y start, x step, y step
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------
# Deterministic random numbers (splitmix64), seeded from a name.


class Rng:
    def __init__(self, seed):
        if isinstance(seed, str):
            seed = zlib.crc32(seed.encode()) * 0x100000001
        self.s = seed & MASK64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() >> 11) % n

    def uniform(self, lo, hi):
        return lo + (hi - lo) * ((self.next() >> 11) / float(1 << 53))


# ---------------------------------------------------------------------------
# The grayscale conversion (numpy int64: exact integer arithmetic).


def to8(v, depth):
    v = np.asarray(v, dtype=np.int64)
    if depth == 16:
        return (v * 255 + 32767) // 65535
    if depth == 8:
        return v
    return (v * 255) // ((1 << depth) - 1)


def luminance(r, g, b):
    return (299 * r + 587 * g + 114 * b + 500) // 1000


def over_white(g, a):
    return (g * a + 255 * (255 - a) + 127) // 255


def expected_gray(ct, depth, samples, palette=None, trns=None):
    """samples: int array (h, w, channels) of the values encoded."""
    s = np.asarray(samples, dtype=np.int64)
    if ct == 3:
        pal = np.array(palette, dtype=np.int64).reshape(-1, 3)
        lum = luminance(pal[:, 0], pal[:, 1], pal[:, 2])
        alpha = np.full(len(pal), 255, dtype=np.int64)
        if trns:
            alpha[: len(trns)] = trns
        idx = s[..., 0]
        g = over_white(lum[idx], alpha[idx])
    else:
        s8 = to8(s, depth)
        g = s8[..., 0] if ct in (0, 4) else luminance(s8[..., 0], s8[..., 1], s8[..., 2])
        if ct in (4, 6):
            g = over_white(g, s8[..., -1])
    assert g.min() >= 0 and g.max() <= 255
    return g.astype(np.uint8)


def pgm_gray(values, maxval):
    v = np.asarray(values, dtype=np.int64)
    return ((v * 255 + maxval // 2) // maxval).astype(np.uint8)


# ---------------------------------------------------------------------------
# Test patterns: gradients plus noise, a different gradient per channel.


def gradient(kind, x, y, w, h):
    """(numerator, denominator), a fraction in [0, 1]."""
    if kind == 0:
        return x, max(1, w - 1)
    if kind == 1:
        return y, max(1, h - 1)
    if kind == 2:
        return (w - 1 - x) + y, max(1, w + h - 2)
    return (x * 7 + y * 3) % 11, 10


def pattern(rng, w, h, nch, maxv, has_alpha):
    out = np.zeros((h, w, nch), dtype=np.int64)
    off = rng.below(3)
    kinds = [(c + off) % 3 for c in range(nch)]
    if has_alpha:
        kinds[-1] = 3
    for y in range(h):
        for x in range(w):
            for c in range(nch):
                num, den = gradient(kinds[c], x, y, w, h)
                v = (maxv * num + den // 2) // den
                if maxv >= 255:
                    v += rng.below(maxv // 8 + 1) - maxv // 16
                elif rng.below(3) == 0:
                    v += rng.below(3) - 1
                v = min(maxv, max(0, v))
                if has_alpha and c == nch - 1:
                    r = rng.below(6)
                    v = 0 if r == 0 else maxv if r == 1 else v
                out[y, x, c] = v
    return out


def palette_pattern(rng, w, h, n):
    """Indices in [0, n): a diagonal gradient with noise, every entry used where possible."""
    out = np.zeros((h, w, 1), dtype=np.int64)
    for y in range(h):
        for x in range(w):
            num, den = gradient(2, x, y, w, h)
            v = ((n - 1) * num + den // 2) // den
            if rng.below(3) == 0:
                v = rng.below(n)
            out[y, x, 0] = v
    flat = out.reshape(-1)
    if flat.size >= n:  # make sure the first and the last entries occur
        flat[0], flat[-1] = 0, n - 1
    return out


def random_palette(rng, n):
    pal = [(rng.below(256), rng.below(256), rng.below(256)) for _ in range(n)]
    if n >= 4:
        pal[0], pal[1] = (0, 0, 0), (255, 255, 255)
    return pal


# ---------------------------------------------------------------------------
# The PNG encoder.


def chunk(ctype, data, crc=None):
    if crc is None:
        crc = zlib.crc32(ctype + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + ctype + data + struct.pack(">I", crc)


def ihdr_data(w, h, depth, ct, interlace, compression=0, filter_method=0):
    return struct.pack(">IIBBBBB", w, h, depth, ct, compression, filter_method, interlace)


def pack_row(samples, depth, pad_bits=0):
    """samples: flat sequence of ints (pixels, channels interleaved)."""
    if depth == 8:
        return bytes(int(v) for v in samples)
    if depth == 16:
        return b"".join(struct.pack(">H", int(v)) for v in samples)
    out = bytearray()
    acc, n = 0, 0
    for v in samples:
        acc = (acc << depth) | int(v)
        n += depth
        if n == 8:
            out.append(acc)
            acc, n = 0, 0
    if n:
        fill = 8 - n
        out.append((acc << fill) | (pad_bits & ((1 << fill) - 1)))
    return bytes(out)


def filter_row(ftype, row, prior, bpp):
    x = np.frombuffer(row, dtype=np.uint8).astype(np.int32)
    b = np.frombuffer(prior, dtype=np.uint8).astype(np.int32)
    a = np.concatenate([np.zeros(bpp, np.int32), x[:-bpp]])[: len(x)]
    c = np.concatenate([np.zeros(bpp, np.int32), b[:-bpp]])[: len(x)]
    if ftype == 0:
        pred = np.zeros_like(x)
    elif ftype == 1:
        pred = a
    elif ftype == 2:
        pred = b
    elif ftype == 3:
        pred = (a + b) // 2
    else:
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    return bytes(((x - pred) & 0xFF).astype(np.uint8))


def sub_images(w, h, interlace):
    """(x0, y0, dx, dy, sub_width, sub_height) of the non-empty passes."""
    out = []
    for x0, y0, dx, dy in ADAM7 if interlace else [(0, 0, 1, 1)]:
        sw = (w - x0 + dx - 1) // dx if w > x0 else 0
        sh = (h - y0 + dy - 1) // dy if h > y0 else 0
        if sw and sh:
            out.append((x0, y0, dx, dy, sw, sh))
    return out


class PngSpec:
    """A valid image and every choice of how it is encoded."""

    def __init__(self, name, ct, depth, w, h, interlace=0, filters="cycle", zopt=None, seed=None,
                 palette_size=None, trns_size=None, pad_bits=0, idat_split=None, before_idat=(),
                 after_idat=(), note="", samples=None):
        """The samples are a test pattern drawn from a generator seeded with the name (or seed),
        unless given (an int array (h, w, channels))."""
        self.name, self.ct, self.depth, self.w, self.h = name, ct, depth, w, h
        self.interlace, self.filters, self.zopt = interlace, filters, zopt or {}
        self.pad_bits, self.idat_split = pad_bits, idat_split
        self.before_idat, self.after_idat, self.note = list(before_idat), list(after_idat), note
        self.palette, self.trns = None, None
        if samples is not None:
            self.samples = np.asarray(samples, dtype=np.int64).reshape(h, w, CHANNELS[ct])
            return
        rng = Rng(seed if seed is not None else name)
        if ct == 3:
            n = palette_size or (1 << depth)
            self.palette = random_palette(rng, n)
            self.samples = palette_pattern(rng, w, h, n)
            if trns_size:
                tr = [rng.below(256) for _ in range(trns_size)]
                tr[0], tr[trns_size // 2], tr[-1] = 0, 255, 128
                self.trns = tr
        else:
            maxv = (1 << depth) - 1
            self.samples = pattern(rng, w, h, CHANNELS[ct], maxv, ct in (4, 6))

    # the filtered scanlines, each preceded by its filter type byte
    def raw(self, filter_override=None):
        nch = CHANNELS[self.ct]
        bpp = max(1, nch * self.depth // 8)
        out = bytearray()
        k = 0
        for x0, y0, dx, dy, sw, sh in sub_images(self.w, self.h, self.interlace):
            prior = bytes(len(pack_row([0] * (sw * nch), self.depth)))
            for j in range(sh):
                y = y0 + j * dy
                row = pack_row(self.samples[y, x0::dx, :][:sw].reshape(-1), self.depth, self.pad_bits)
                ftype = self.filter_for(k, row, prior, bpp)
                if filter_override is not None and k in filter_override:
                    out.append(filter_override[k])
                else:
                    out.append(ftype)
                out += filter_row(ftype, row, prior, bpp)
                prior = row
                k += 1
        return bytes(out)

    def filter_for(self, k, row, prior, bpp):
        f = self.filters
        if isinstance(f, int):
            return f
        if f == "cycle":
            return (k + len(self.name)) % 5
        # adaptive: the smallest sum of absolute values, as signed bytes
        best, best_t = None, 0
        for t in range(5):
            d = np.frombuffer(filter_row(t, row, prior, bpp), dtype=np.int8).astype(np.int32)
            s = int(np.abs(d).sum())
            if best is None or s < best:
                best, best_t = s, t
        return best_t

    def compress(self, raw):
        return deflate(raw, **self.zopt)

    def ihdr(self):
        return ihdr_data(self.w, self.h, self.depth, self.ct, self.interlace)

    def chunks(self, idat=None):
        """The chunk list, [type, data] pairs, IHDR to IEND."""
        if idat is None:
            idat = self.compress(self.raw())
        out = [[b"IHDR", self.ihdr()]]
        out += [list(c) for c in self.before_idat]
        if self.palette is not None:
            out.append([b"PLTE", bytes(v for rgb in self.palette for v in rgb)])
            if self.trns:
                out.append([b"tRNS", bytes(self.trns)])
        pieces = []
        if self.idat_split:
            pos = 0
            for n in self.idat_split:
                pieces.append(idat[pos:pos + n])
                pos += n
            pieces.append(idat[pos:])
        else:
            pieces = [idat]
        out += [[b"IDAT", p] for p in pieces]
        out += [list(c) for c in self.after_idat]
        out.append([b"IEND", b""])
        return out

    def expected(self):
        return expected_gray(self.ct, self.depth, self.samples, self.palette, self.trns)

    def describe(self):
        d = "%s %d-bit%s" % (CT_NAME[self.ct], self.depth, ", Adam7" if self.interlace else "")
        if self.trns:
            d += ", tRNS %d of %d entries" % (len(self.trns), len(self.palette))
        elif self.palette is not None:
            d += ", %d entries" % len(self.palette)
        f = self.filters
        d += {"cycle": ", filter types 0-4 row after row",
              "adaptive": ", filter type chosen per row"}.get(f, ", filter type %s on every row" % f)
        d += ", " + describe_zopt(self.zopt)
        if self.note:
            d += ", " + self.note
        return d


def deflate(raw, level=9, wbits=15, strategy=zlib.Z_DEFAULT_STRATEGY, flush_every=0):
    """A zlib stream; flush_every > 0 ends a deflate block (Z_SYNC_FLUSH) every that many bytes."""
    co = zlib.compressobj(level, zlib.DEFLATED, wbits, 9, strategy)
    if not flush_every:
        return co.compress(raw) + co.flush()
    out = b""
    for i in range(0, len(raw), flush_every):
        out += co.compress(raw[i:i + flush_every]) + co.flush(zlib.Z_SYNC_FLUSH)
    return out + co.flush()


def describe_zopt(zopt):
    level = zopt.get("level", 9)
    d = "zlib level %d" % level if level else "zlib stored blocks"
    d += {zlib.Z_FIXED: " fixed Huffman codes", zlib.Z_HUFFMAN_ONLY: " Huffman only, no matches",
          zlib.Z_RLE: " run-length matches only"}.get(zopt.get("strategy"), "")
    if zopt.get("wbits", 15) != 15:
        d += " window %d bytes" % (1 << zopt["wbits"])
    if zopt.get("flush_every"):
        d += " sync flush every %d bytes" % zopt["flush_every"]
    return d


def serialize(chunks, sig=PNG_SIG):
    out = bytearray(sig)
    for c in chunks:
        out += chunk(c[0], c[1], c[2] if len(c) > 2 else None)
    return bytes(out)


def text_chunk(key, text):
    return [b"tEXt", key.encode("latin-1") + b"\0" + text.encode("latin-1")]


# ---------------------------------------------------------------------------
# The valid PNG images.

ZOPTS = [
    {},
    {"level": 6},
    {"level": 1},
    {"level": 0},
    {"strategy": zlib.Z_FIXED},
    {"strategy": zlib.Z_HUFFMAN_ONLY},
    {"strategy": zlib.Z_RLE},
    {"wbits": 9},
]


def valid_png_specs():
    S = []

    def add(*a, **k):
        if "zopt" not in k:
            k["zopt"] = ZOPTS[len(S) % len(ZOPTS)]
        S.append(PngSpec(*a, **k))

    # every colour type and bit depth, not interlaced
    add("g1.png", 0, 1, 13, 5)
    add("g2.png", 0, 2, 3, 7)
    add("g4.png", 0, 4, 17, 9)
    add("g8.png", 0, 8, 16, 12)
    add("g16.png", 0, 16, 11, 6)
    add("ga8.png", 4, 8, 9, 9)
    add("ga16.png", 4, 16, 7, 5)
    add("rgb8.png", 2, 8, 12, 8)
    add("rgb16.png", 2, 16, 6, 7)
    add("rgba8.png", 6, 8, 10, 10)
    add("rgba16.png", 6, 16, 5, 4)
    add("p1.png", 3, 1, 33, 17, palette_size=2)
    add("p2.png", 3, 2, 15, 3, palette_size=4)
    add("p4.png", 3, 4, 11, 13, palette_size=11, note="PLTE shorter than 2^depth")
    add("p8.png", 3, 8, 20, 20, palette_size=200)
    add("p4t.png", 3, 4, 9, 8, palette_size=14, trns_size=9)
    add("p8t.png", 3, 8, 7, 6, palette_size=256, trns_size=256)
    add("g1pad.png", 0, 1, 13, 5, seed="g1.png", pad_bits=0xFF,
        note="same pixels as g1.png, the unused bits of each row's last byte set")
    add("g8_1x1.png", 0, 8, 1, 1)
    add("rgba16_1x1.png", 6, 16, 1, 1)
    add("p1_1x1.png", 3, 1, 1, 1, palette_size=2)
    add("rgb8_40.png", 2, 8, 40, 40, filters="adaptive")
    # Adam7
    add("g8i.png", 0, 8, 33, 17, interlace=1)
    add("g16i.png", 0, 16, 13, 5, interlace=1)
    add("rgb8i.png", 2, 8, 3, 7, interlace=1)
    add("rgba8i.png", 6, 8, 40, 40, interlace=1)
    add("p4i.png", 3, 4, 13, 5, interlace=1, palette_size=16)
    add("g1i.png", 0, 1, 33, 17, interlace=1)
    add("g2i.png", 0, 2, 7, 7, interlace=1)
    add("g4i.png", 0, 4, 2, 9, interlace=1)
    add("ga8i.png", 4, 8, 6, 3, interlace=1)
    add("ga16i.png", 4, 16, 5, 3, interlace=1)
    add("rgb16i.png", 2, 16, 9, 2, interlace=1)
    add("rgba16i.png", 6, 16, 4, 4, interlace=1)
    add("p1i.png", 3, 1, 10, 10, interlace=1, palette_size=2)
    add("p2i.png", 3, 2, 5, 5, interlace=1, palette_size=3)
    add("p8ti.png", 3, 8, 6, 11, interlace=1, palette_size=40, trns_size=25)
    add("g8i_1x1.png", 0, 8, 1, 1, interlace=1)
    add("g8i_2x2.png", 0, 8, 2, 2, interlace=1)
    add("g8i_1x9.png", 0, 8, 1, 9, interlace=1)
    add("g8i_5x1.png", 0, 8, 5, 1, interlace=1)
    add("rgbai_3x3.png", 6, 8, 3, 3, interlace=1)
    # one filter type on every row (the others use all five, row after row)
    add("f0.png", 2, 8, 13, 9, filters=0)
    add("f1.png", 6, 16, 7, 6, filters=1)
    add("f2.png", 0, 8, 17, 9, filters=2)
    add("f3.png", 4, 16, 9, 7, filters=3)
    add("f4.png", 2, 16, 8, 8, filters=4)
    add("f4g2.png", 0, 2, 21, 6, filters=4)
    add("f3i.png", 6, 8, 11, 11, interlace=1, filters=3)
    # chunk layout and zlib streams
    add("split.png", 2, 8, 14, 10, idat_split=[1, 1, 3, 50, 7, 100],
        note="IDAT split in 7 chunks (1, 1, 3, 50, 7, 100 bytes and the rest)")
    add("splits.png", 0, 8, 24, 24, zopt={"level": 0}, idat_split=[2, 5, 300],
        note="IDAT split inside the stored blocks")
    add("anc.png", 6, 8, 12, 9, before_idat=[
        text_chunk("Title", "mnistcu fixture"),
        [b"gAMA", struct.pack(">I", 45455)],
        [b"pHYs", struct.pack(">IIB", 2835, 2835, 1)],
        [b"bKGD", struct.pack(">HHH", 0, 0, 0)],
        [b"prVt", b"private ancillary chunk"],
    ], after_idat=[text_chunk("Comment", "after IDAT")],
        note="tEXt, gAMA, pHYs, bKGD (black: ignored, alpha goes over white) and a private chunk "
             "before IDAT, tEXt after it")
    add("flush.png", 6, 8, 16, 16, zopt={"flush_every": 37, "level": 9},
        note="many deflate blocks, each flush adding an empty stored block")
    add("win9.png", 2, 8, 30, 20, zopt={"wbits": 9, "level": 9})
    add("fixed1.png", 0, 8, 16, 16, zopt={"strategy": zlib.Z_FIXED, "level": 1})
    return S


# ---------------------------------------------------------------------------
# PGM files.


class PgmFile:
    def __init__(self, name, data, w, h, maxval, values=None, expected="ok", note=""):
        self.name, self.data, self.w, self.h, self.maxval = name, data, w, h, maxval
        self.values, self.expected_class, self.note = values, expected, note


def pgm_values(name, w, h, maxval):
    rng = Rng(name)
    v = np.zeros((h, w), dtype=np.int64)
    for y in range(h):
        for x in range(w):
            num, den = gradient((x + y) % 3, x, y, w, h)
            s = (maxval * num + den // 2) // den + rng.below(maxval // 4 + 1) - maxval // 8
            v[y, x] = min(maxval, max(0, s))
    v[0, 0], v[-1, -1] = 0, maxval
    return v


def p5_raster(values, maxval):
    flat = [int(x) for x in np.asarray(values).reshape(-1)]
    if maxval < 256:
        return bytes(flat)
    return b"".join(struct.pack(">H", x) for x in flat)


def p2_raster(values, rng):
    """Decimal values separated by irregular whitespace: spaces, tabs, CR LF, blank lines."""
    seps = [b" ", b"  ", b"\t", b"\n", b" \t ", b"\r\n", b"\n\n", b"   "]
    out = bytearray()
    for i, x in enumerate(np.asarray(values).reshape(-1)):
        if i:
            out += seps[rng.below(len(seps))]
        out += str(int(x)).encode()
    return bytes(out)


def valid_pgms():
    out = []

    def p5(name, w, h, maxval, header, first=None, note=""):
        v = pgm_values(name, w, h, maxval)
        if first is not None:
            v.reshape(-1)[: len(first)] = first
        out.append(PgmFile(name, header + p5_raster(v, maxval), w, h, maxval, v, note=note))

    p5("p5_8.pgm", 12, 9, 255, b"P5\n# written by make_image_fixtures.py\n12 9\n255\n", first=[10, 35, 32, 13],
       note="the raster starts with bytes LF, '#', space, CR")
    p5("p5_16.pgm", 10, 7, 65535, b"P5 10 7 65535\n", note="big-endian 16-bit samples")
    p5("p5_15.pgm", 8, 5, 15, b"P5\n8 5\n15\n", note="one byte a sample")
    p5("p5_1000.pgm", 9, 4, 1000, b"P5\r\n# maxval 1000: two bytes a sample\r\n9\t4\r\n1000\n",
       note="two bytes a sample, big-endian")
    p5("p5_1x1.pgm", 1, 1, 255, b"P5\n1\n1\n255\t", first=[200], note="tab after maxval")

    def p2(name, w, h, maxval, header, tail=b"\n", leading_zero=False, note=""):
        v = pgm_values(name, w, h, maxval)
        if leading_zero:
            v.reshape(-1)[1] = 8
        r = p2_raster(v, Rng(name + "ws"))
        if leading_zero:  # the value 8 written as 008: decimal, not octal
            r = replace_token(r, 1, b"008")
        out.append(PgmFile(name, header + r + tail, w, h, maxval, v, note=note))

    p2("p2.pgm", 7, 6, 255,
       b"P2\n# comment line\n#another one\n  7 # width, then a comment after whitespace\n\t6\n"
       b"# maxval next\n255\n", leading_zero=True,
       note="comments, tabs, CR LF and blank lines, a value written 008")
    p2("p2_15.pgm", 6, 5, 15, b"P2 6 5 15 ", tail=b"", note="header on one line, no newline at the end")
    p2("p2_1000.pgm", 5, 5, 1000, b"P2\r\n#c\r\n5 5\r\n1000\r\n", tail=b"\r\n\r\n")
    return out


def replace_token(raster, index, new):
    """raster with its index-th whitespace-separated token replaced."""
    out = bytearray()
    i, n, k = 0, len(raster), 0
    while i < n:
        if raster[i:i + 1].isspace():
            out.append(raster[i])
            i += 1
            continue
        j = i
        while j < n and not raster[j:j + 1].isspace():
            j += 1
        out += new if k == index else raster[i:j]
        k += 1
        i = j
    return bytes(out)


# ---------------------------------------------------------------------------
# Malformed files.


class Bad:
    def __init__(self, name, data, w, h, cls, note):
        self.name, self.data, self.w, self.h, self.expected_class, self.note = name, data, w, h, cls, note


def zlib_header(cmf, flg_bits=0):
    """A CMF byte and a FLG byte with a correct check value."""
    flg = flg_bits
    flg += (31 - ((cmf * 256 + flg) % 31)) % 31
    return bytes([cmf, flg])


def malformed(specs):
    by = {s.name: s for s in specs}
    out = []

    def bad(name, data, base, cls, note, w=None, h=None):
        out.append(Bad(name, data, base.w if w is None else w, base.h if h is None else h, cls,
                       "%s (from %s)" % (note, base.name)))

    def find(chunks, ctype):
        return next(i for i, c in enumerate(chunks) if c[0] == ctype)

    def chunk_offset(data, ctype):
        """Offset of the first chunk of that type in a serialized PNG."""
        pos = 8
        while pos < len(data):
            n, t = struct.unpack(">I4s", data[pos:pos + 8])
            if t == ctype:
                return pos, n
            pos += 12 + n
        raise KeyError(ctype)

    g8, rgb8, p4, anc, g8i = by["g8.png"], by["rgb8.png"], by["p4.png"], by["anc.png"], by["g8i.png"]

    # crc
    c = g8.chunks()
    c[0].append((zlib.crc32(b"IHDR" + c[0][1]) ^ 1) & 0xFFFFFFFF)
    bad("crc_ihdr.png", serialize(c), g8, "crc", "IHDR CRC off by one bit")
    c = rgb8.chunks()
    i = find(c, b"IDAT")
    c[i].append((zlib.crc32(b"IDAT" + c[i][1]) ^ 0x80000000) & 0xFFFFFFFF)
    bad("crc_idat.png", serialize(c), rgb8, "crc", "IDAT CRC with its top bit flipped")
    d = bytearray(serialize(g8.chunks()))
    d[-1] ^= 0x55
    bad("crc_iend.png", bytes(d), g8, "crc", "IEND CRC wrong")
    c = anc.chunks()
    c[1].append(0)
    bad("crc_text.png", serialize(c), anc, "crc", "CRC 0 on the ancillary tEXt chunk (strict: ancillary CRCs count)")
    d = bytearray(serialize(p4.chunks()))
    pos, n = chunk_offset(bytes(d), b"PLTE")
    d[pos + 8 + 4] ^= 0x01  # a data byte changed, CRC kept
    bad("crc_plte.png", bytes(d), p4, "crc", "a PLTE data byte changed, its CRC not updated")

    # signature
    d = bytearray(serialize(g8.chunks()))
    d[1] = ord("p")
    bad("sig.png", bytes(d), g8, "signature", "'PNG' written 'pNG' in the signature")
    d = serialize(g8.chunks())
    bad("sig_crlf.png", d[:4] + b"\n" + d[6:], g8, "signature", "CR LF in the signature turned into LF")

    # ihdr
    def ihdr_bad(name, base, note, data=None, **fields):
        f = dict(w=base.w, h=base.h, depth=base.depth, ct=base.ct, interlace=base.interlace,
                 compression=0, filter_method=0)
        f.update(fields)
        c = base.chunks()
        c[0][1] = data if data is not None else ihdr_data(f["w"], f["h"], f["depth"], f["ct"], f["interlace"],
                                                          f["compression"], f["filter_method"])
        bad(name, serialize(c), base, "ihdr", note, w=f["w"], h=f["h"])

    ihdr_bad("ihdr_w0.png", g8, "width 0", w=0)
    ihdr_bad("ihdr_h0.png", g8, "height 0", h=0)
    ihdr_bad("ihdr_w31.png", g8, "width 2^31 (the largest allowed is 2^31 - 1)", w=1 << 31)
    ihdr_bad("ihdr_bd3.png", g8, "bit depth 3, gray", depth=3)
    ihdr_bad("ihdr_ct5.png", g8, "colour type 5", ct=5)
    ihdr_bad("ihdr_p16.png", p4, "bit depth 16 with palette", depth=16)
    ihdr_bad("ihdr_rgb4.png", rgb8, "bit depth 4 with RGB", depth=4)
    ihdr_bad("ihdr_il2.png", g8, "interlace method 2", interlace=2)
    ihdr_bad("ihdr_cm1.png", g8, "compression method 1", compression=1)
    ihdr_bad("ihdr_fm1.png", g8, "filter method 1", filter_method=1)
    ihdr_bad("ihdr_len.png", g8, "IHDR 12 bytes long (no interlace byte), CRC correct",
             data=ihdr_data(g8.w, g8.h, 8, 0, 0)[:12])

    # truncated
    d = serialize(rgb8.chunks())
    pos, n = chunk_offset(d, b"IDAT")
    bad("trunc_idat.png", d[:pos + 8 + n // 2], rgb8, "truncated", "file ends in the middle of the IDAT data")
    bad("trunc_ihdr.png", d[:8 + 8 + 6], rgb8, "truncated", "file ends after 6 of the 13 IHDR bytes")
    bad("trunc_crc.png", d[:pos + 8 + n + 2], rgb8, "truncated", "file ends inside the IDAT CRC")

    # zlib
    raw = g8.raw()
    z = deflate(raw)  # level 9 (g8.png itself has stored blocks)

    def with_idat(name, base, data, cls, note):
        bad(name, serialize(base.chunks(idat=data)), base, cls, note)

    with_idat("zlib_hdr.png", g8, z[:1] + bytes([z[1] ^ 1]) + z[2:], "zlib", "zlib header check bits wrong")
    with_idat("zlib_cm.png", g8, zlib_header(0x77) + z[2:], "zlib", "zlib compression method 7 (header check right)")
    with_idat("zlib_dict.png", g8, zlib_header(z[0], 0x20) + b"\0\0\0\1" + z[2:], "zlib",
              "zlib FDICT set (a preset dictionary), not allowed in PNG")
    with_idat("zlib_short.png", g8, z[: len(z) // 2], "zlib", "the deflate stream ends early (half of it)")
    with_idat("zlib_adler.png", g8, z[:-1] + bytes([z[-1] ^ 0xFF]), "zlib", "Adler-32 wrong")
    with_idat("zlib_noadler.png", g8, z[:-4], "zlib", "deflate stream complete, Adler-32 missing")
    with_idat("zlib_btype.png", g8, b"\x78\x01\x07\x00\x00\x00\x00\x00\x00\x01", "zlib",
              "deflate block type 3 (reserved)")
    stored = deflate(raw, level=0)
    with_idat("zlib_nlen.png", g8, stored[:5] + bytes([stored[5] ^ 0x01]) + stored[6:], "zlib",
              "stored block with NLEN not the complement of LEN")

    # size
    rowlen = 1 + g8.w
    with_idat("size_short.png", g8, deflate(raw[:-rowlen]), "size", "a valid zlib stream one row short")
    with_idat("size_long.png", g8, deflate(raw + raw[-rowlen:]), "size", "a valid zlib stream one row too long")
    with_idat("size_long1.png", g8, deflate(raw + b"\0"), "size", "a valid zlib stream one byte too long")
    rawi = g8i.raw()
    with_idat("size_short_i.png", g8i, deflate(rawi[:-3]), "size", "interlaced, 3 bytes short of the last pass")
    with_idat("size_empty.png", g8, deflate(b""), "size", "a valid zlib stream of nothing")

    # filter
    raw5 = g8.raw(filter_override={3: 5})
    with_idat("filt5.png", g8, deflate(raw5), "filter", "row 3 has filter type 5")
    raw5 = g8i.raw(filter_override={20: 5})
    with_idat("filt5i.png", g8i, deflate(raw5), "filter", "interlaced, row 20 of the passes has filter type 5")

    # palette
    c = p4.chunks()
    i = find(c, b"PLTE")
    c[i][1] = c[i][1][: 3 * 9]  # 9 entries; the image uses indices up to 10
    bad("pal_idx.png", serialize(c), p4, "palette", "PLTE of 9 entries, pixels use indices 9 and 10")
    c = p4.chunks()
    del c[find(c, b"PLTE")]
    bad("pal_none.png", serialize(c), p4, "palette", "colour type 3 without PLTE")
    c = p4.chunks()
    i = find(c, b"PLTE")
    c[i][1] = c[i][1] + b"\x01"
    bad("pal_len.png", serialize(c), p4, "palette", "PLTE length not a multiple of 3")
    c = p4.chunks()
    i = find(c, b"PLTE")
    c[i][1] = bytes(3 * 17)
    bad("pal_big.png", serialize(c), p4, "palette", "17 PLTE entries for a 4-bit image")
    c = p4.chunks()
    i = find(c, b"PLTE")
    c.insert(i + 1, [b"tRNS", bytes(12)])
    bad("trns_long.png", serialize(c), p4, "palette", "tRNS of 12 entries, PLTE of 11")

    # order
    c = g8.chunks()
    i = find(c, b"IDAT")
    c = [c[i], c[0]] + c[1:i] + c[i + 1:]
    bad("idat_first.png", serialize(c), g8, "order", "IDAT before IHDR")
    bad("no_iend.png", serialize(g8.chunks()[:-1]), g8, "order", "no IEND (file ends after the IDAT chunk)")
    c = g8.chunks()
    c.insert(1, list(c[0]))
    bad("ihdr2.png", serialize(c), g8, "order", "a second IHDR after the first")
    c = p4.chunks()
    i = find(c, b"PLTE")
    plte = c.pop(i)
    c.insert(len(c) - 1, plte)
    bad("plte_late.png", serialize(c), p4, "order", "PLTE after IDAT")
    spl = by["split.png"]
    c = spl.chunks()
    i = find(c, b"IDAT")
    c.insert(i + 2, text_chunk("Comment", "between IDAT chunks"))
    bad("idat_gap.png", serialize(c), spl, "order", "a tEXt chunk between two IDAT chunks")

    # huge
    def huge(name, w, h, depth, ct, note):
        row = bytes(1 + 4)
        c = [[b"IHDR", ihdr_data(w, h, depth, ct, 0)], [b"IDAT", deflate(row * 4)], [b"IEND", b""]]
        out.append(Bad(name, serialize(c), w, h, "huge", note))

    huge("huge.png", 100000, 100000, 8, 0, "gray 100000 x 100000, a few bytes of IDAT")
    huge("huge1.png", 100000, 100000, 1, 0, "1-bit gray 100000 x 100000 (1.25 GB unpacked)")
    huge("huge_w.png", 0x7FFFFFFF, 1, 16, 6, "RGBA 16-bit 2147483647 x 1 (16 GiB row)")
    return out


def malformed_pgms():
    out = []

    def b(name, data, w, h, cls, note):
        out.append(Bad(name, data, w, h, cls, note))

    b("pgm_short.pgm", b"P5\n4 3\n255\n" + bytes(range(11)), 4, 3, "pgm", "P5 4x3 with 11 bytes")
    b("pgm_short16.pgm", b"P5\n3 2\n1000\n" + bytes(11), 3, 2, "pgm", "P5 maxval 1000 (2 bytes a sample), 11 bytes")
    b("pgm_over.pgm", b"P2\n3 2\n15\n1 2 3\n4 16 5\n", 3, 2, "pgm", "P2 value 16 above maxval 15")
    b("pgm_over16.pgm", b"P5\n2 1\n1000\n" + struct.pack(">HH", 1000, 1001), 2, 1, "pgm",
      "P5 value 1001 above maxval 1000")
    b("pgm_max0.pgm", b"P2\n2 2\n0\n0 0 0 0\n", 2, 2, "pgm", "maxval 0")
    b("pgm_max65536.pgm", b"P5\n2 1\n65536\n" + bytes(4), 2, 1, "pgm", "maxval 65536")
    b("pgm_negw.pgm", b"P5\n-4 3\n255\n" + bytes(12), -4, 3, "pgm", "width -4")
    b("pgm_token.pgm", b"P2\n3 2\n255\n1 2 3\n4 x5 6\n", 3, 2, "pgm", "P2 raster token 'x5'")
    b("pgm_wtoken.pgm", b"P5\nfour 3\n255\n" + bytes(12), 4, 3, "pgm", "width 'four'")
    b("pgm_hdr_eof.pgm", b"P5\n12 9\n", 12, 9, "pgm", "file ends before maxval")
    b("pgm_p2_few.pgm", b"P2\n3 3\n255\n1 2 3 4 5 6 7 8", 3, 3, "pgm", "P2 with 8 of 9 values")
    b("huge.pgm", b"P5\n100000 100000\n255\n" + bytes(64), 100000, 100000, "huge", "P5 100000 x 100000")
    return out


# ---------------------------------------------------------------------------
# Drawn digits.


def arc(cx, cy, rx, ry, t0, t1, n=None):
    """Points of an elliptic arc from angle t0 to t1 (degrees; y grows downwards, so 90 is the bottom)."""
    if n is None:
        n = max(6, int(abs(t1 - t0) / 8))
    return [(cx + rx * math.cos(math.radians(t0 + (t1 - t0) * i / n)),
             cy + ry * math.sin(math.radians(t0 + (t1 - t0) * i / n))) for i in range(n + 1)]


def join(*parts):
    out = []
    for p in parts:
        out += p
    return out


# Strokes of each digit in a unit box (x right, y down), two variants.
DIGIT_STROKES = {
    (0, "a"): [arc(0.5, 0.5, 0.32, 0.46, -95, 272)],
    (0, "b"): [arc(0.5, 0.52, 0.27, 0.44, -70, 285)],
    (1, "a"): [[(0.52, 0.04), (0.49, 0.5), (0.47, 0.96)]],
    (1, "b"): [[(0.3, 0.24), (0.56, 0.04), (0.52, 0.5), (0.5, 0.96)]],
    (2, "a"): [join(arc(0.5, 0.3, 0.3, 0.25, 195, 380), [(0.17, 0.95), (0.86, 0.94)])],
    (2, "b"): [join(arc(0.48, 0.28, 0.3, 0.24, 200, 395), [(0.2, 0.9)],
                    arc(0.27, 0.86, 0.1, 0.08, -60, 120)[1:], [(0.5, 0.92), (0.88, 0.96)])],
    (3, "a"): [join(arc(0.48, 0.27, 0.27, 0.22, 200, 450), arc(0.48, 0.71, 0.31, 0.25, -90, 155))],
    (3, "b"): [join([(0.18, 0.05), (0.8, 0.05), (0.42, 0.4)], arc(0.48, 0.68, 0.31, 0.29, -105, 150))],
    (4, "a"): [[(0.62, 0.04), (0.12, 0.66), (0.88, 0.66)], [(0.66, 0.3), (0.66, 0.97)]],
    (4, "b"): [[(0.25, 0.04), (0.18, 0.55), (0.86, 0.53)], [(0.69, 0.06), (0.63, 0.97)]],
    (5, "a"): [join([(0.8, 0.05), (0.31, 0.05), (0.25, 0.45)], arc(0.5, 0.67, 0.3, 0.28, -135, 150))],
    (5, "b"): [join([(0.3, 0.07), (0.26, 0.45)], arc(0.5, 0.68, 0.31, 0.28, -140, 160)),
               [(0.3, 0.07), (0.82, 0.04)]],
    (6, "a"): [join(arc(0.8, 0.7, 0.58, 0.66, 250, 180), arc(0.5, 0.7, 0.28, 0.25, 180, 530))],
    (6, "b"): [join(arc(0.9, 0.72, 0.62, 0.7, 245, 175), arc(0.52, 0.72, 0.28, 0.24, 175, 520))],
    (7, "a"): [[(0.12, 0.08), (0.88, 0.08), (0.42, 0.96)]],
    (7, "b"): [[(0.15, 0.12), (0.85, 0.06), (0.55, 0.5), (0.38, 0.96)], [(0.38, 0.52), (0.74, 0.5)]],
    (8, "a"): [arc(0.5, 0.27, 0.24, 0.22, 90, 455), arc(0.5, 0.71, 0.3, 0.25, -90, 275)],
    (8, "b"): [join(arc(0.52, 0.26, 0.22, 0.21, 120, 400), arc(0.47, 0.72, 0.29, 0.25, -80, 270))],
    (9, "a"): [arc(0.48, 0.3, 0.27, 0.24, 0, 365), [(0.75, 0.3), (0.7, 0.6), (0.6, 0.96)]],
    (9, "b"): [join(arc(0.5, 0.28, 0.27, 0.23, 10, 370), arc(0.2, 0.3, 0.57, 0.66, 0, 80))],
}

# label, variant, canvas w, h, mode, box (x0, y0, x1, y1) the digit is drawn in, stroke width as a
# fraction of the box height, slant (x shift per unit of height, positive leans right)
DIGIT_LAYOUT = [
    (0, "a", 120, 160, "rgb", (25, 18, 95, 142), 0.11, 0.05),
    (0, "b", 90, 60, "gray", (6, 5, 40, 55), 0.12, 0.15),
    (1, "a", 200, 200, "rgba", (40, 30, 160, 170), 0.09, 0.0),
    (1, "b", 64, 96, "gray16", (10, 10, 54, 86), 0.12, 0.12),
    (2, "a", 100, 140, "gray", (15, 15, 85, 125), 0.1, 0.0),
    (2, "b", 160, 100, "rgb", (95, 12, 150, 90), 0.13, 0.1),
    (3, "a", 80, 120, "rgba_bg", (10, 12, 70, 108), 0.11, 0.08),
    (3, "b", 120, 120, "gray", (30, 15, 90, 105), 0.12, 0.0),
    (4, "a", 140, 90, "rgb", (10, 8, 70, 84), 0.11, 0.0),
    (4, "b", 72, 100, "graya", (8, 10, 64, 92), 0.1, 0.15),
    (5, "a", 110, 150, "rgba", (20, 20, 95, 135), 0.12, 0.06),
    (5, "b", 60, 90, "gray", (8, 6, 52, 84), 0.13, 0.0),
    (6, "a", 200, 120, "rgb", (120, 10, 185, 110), 0.12, 0.1),
    (6, "b", 96, 96, "gray", (20, 8, 76, 88), 0.11, -0.05),
    (7, "a", 90, 130, "rgba", (15, 15, 80, 120), 0.1, 0.0),
    (7, "b", 128, 96, "rgb", (20, 30, 70, 92), 0.12, 0.12),
    (8, "a", 100, 100, "gray", (25, 6, 75, 94), 0.12, 0.0),
    (8, "b", 150, 110, "rgba_bg", (60, 10, 120, 100), 0.11, 0.1),
    (9, "a", 80, 140, "rgb", (8, 20, 72, 120), 0.11, 0.08),
    (9, "b", 110, 80, "gray", (40, 6, 90, 76), 0.12, 0.0),
]

SUPERSAMPLE = 4


def draw_digit(label, variant, w, h, box, width_frac, slant):
    """Ink coverage 0..4080 (16 subsamples of 0..255) of each canvas pixel."""
    S = SUPERSAMPLE
    rng = Rng("digit%d%s" % (label, variant))
    x0, y0, x1, y1 = box
    bw, bh = x1 - x0, y1 - y0
    lw = width_frac * bh
    img = Image.new("L", (w * S, h * S), 0)
    dr = ImageDraw.Draw(img)
    for stroke in DIGIT_STROKES[(label, variant)]:
        pts = []
        for (u, v) in stroke:
            u += rng.uniform(-0.012, 0.012) + slant * (0.5 - v)
            v += rng.uniform(-0.012, 0.012)
            # keep the stroke inside the box: a margin of half the stroke width
            px = x0 + lw / 2 + u * (bw - lw)
            py = y0 + lw / 2 + v * (bh - lw)
            pts.append((round(px * S), round(py * S)))
        wpx = max(1, round(lw * S))
        dr.line(pts, fill=255, width=wpx, joint="curve")
        r = wpx / 2.0
        for (px, py) in (pts[0], pts[-1]):
            dr.ellipse([px - r, py - r, px + r, py + r], fill=255)
    a = np.asarray(img, dtype=np.int64).reshape(h, S, w, S)
    return a.sum(axis=(1, 3))


def digit_image(label, variant, w, h, mode, box, width_frac, slant):
    """The PngSpec of a drawn digit."""
    cov = draw_digit(label, variant, w, h, box, width_frac, slant)
    ink8 = (cov + 8) // 16
    full = SUPERSAMPLE * SUPERSAMPLE * 255
    if mode == "gray16":
        ct, depth = 0, 16
        s = (65535 - cov * 65535 // full)[..., None]
    elif mode == "gray":
        ct, depth = 0, 8
        s = (255 - ink8)[..., None]
    elif mode == "graya":
        ct, depth = 4, 8
        s = np.stack([np.zeros_like(ink8), ink8], axis=-1)
    elif mode == "rgb":
        ct, depth = 2, 8
        s = np.repeat((255 - ink8)[..., None], 3, axis=-1)
    else:  # rgba: black ink, transparent elsewhere (rgba_bg: a colour under the transparent pixels)
        ct, depth = 6, 8
        s = np.zeros((h, w, 4), dtype=np.int64)
        s[..., 3] = ink8
        if mode == "rgba_bg":
            s[ink8 == 0, :3] = (40, 200, 90)
    return PngSpec("digit_%d_%s.png" % (label, variant), ct, depth, w, h, filters="adaptive",
                   zopt={"level": 9}, samples=s)


def area_matrix(n_in, n_out):
    m = np.zeros((n_out, n_in))
    scale = n_in / n_out
    for i in range(n_out):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(math.floor(lo)), min(n_in, int(math.ceil(hi)))):
            m[i, j] = min(hi, j + 1) - max(lo, j)
    return m / scale


def area_resize(a, oh, ow):
    return area_matrix(a.shape[0], oh) @ a @ area_matrix(a.shape[1], ow).T


def mnist_preprocess(gray):
    """MNIST-style 28x28 input: ink bright, cropped to the ink, scaled to fit 20x20 (area
    averaging, aspect kept), placed in 28x28 so that its centre of mass is the centre."""
    ink = 255.0 - gray.astype(np.float64)
    ys, xs = np.nonzero(ink > 0)
    out = np.zeros((28, 28))
    if len(ys) == 0:
        return out.astype(np.uint8)
    crop = ink[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    ch, cw = crop.shape
    s = 20.0 / max(ch, cw)
    oh, ow = max(1, int(round(ch * s))), max(1, int(round(cw * s)))
    small = area_resize(crop, oh, ow)
    tot = small.sum()
    cy = (small.sum(axis=1) * (np.arange(oh) + 0.5)).sum() / tot
    cx = (small.sum(axis=0) * (np.arange(ow) + 0.5)).sum() / tot
    top, left = int(round(14 - cy)), int(round(14 - cx))
    for y in range(oh):
        for x in range(ow):
            if 0 <= top + y < 28 and 0 <= left + x < 28:
                out[top + y, left + x] = small[y, x]
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def contact_sheet(entries):
    """entries: (label, variant, gray image, 28x28 input); a row per label: for each variant the
    image (fitted to 56x56, on white) and its 28x28 input shown twice as large."""
    cell, gap = 56, 4
    cols = 4
    W, H = cols * cell + (cols + 1) * gap, 10 * cell + 11 * gap
    sheet = np.full((H, W), 128, dtype=np.uint8)
    for label, variant, gray, m in entries:
        col = 0 if variant == "a" else 2
        y0, x0 = gap + label * (cell + gap), gap + col * (cell + gap)
        h, w = gray.shape
        s = cell / max(h, w)
        th, tw = max(1, int(round(h * s))), max(1, int(round(w * s)))
        thumb = np.clip(np.round(area_resize(gray.astype(np.float64), th, tw)), 0, 255).astype(np.uint8)
        sheet[y0:y0 + cell, x0:x0 + cell] = 255
        oy, ox = (cell - th) // 2, (cell - tw) // 2
        sheet[y0 + oy:y0 + oy + th, x0 + ox:x0 + ox + tw] = thumb
        x1 = x0 + cell + gap
        sheet[y0:y0 + cell, x1:x1 + cell] = np.repeat(np.repeat(m, 2, axis=0), 2, axis=1)
    return sheet


# ---------------------------------------------------------------------------
# Checks with Pillow.


def pil_check_png(path, spec):
    """'ok ...' if Pillow reads the samples encoded, else a description of the difference."""
    try:
        im = Image.open(path)
        im.load()
    except Exception as e:  # noqa: BLE001 - any failure is a finding
        return "FAIL: Pillow raised %s: %s" % (type(e).__name__, e)
    a = np.asarray(im).astype(np.int64)
    s = spec.samples
    note = ""
    if spec.ct == 3:
        if im.mode != "P":
            return "FAIL: mode %s" % im.mode
        pal = np.array(im.getpalette()[: 3 * len(spec.palette)]).reshape(-1, 3)
        if not np.array_equal(a, s[..., 0]) or not np.array_equal(pal, np.array(spec.palette)):
            return "FAIL: indices or palette differ"
        if spec.trns:
            t = im.info.get("transparency")
            if bytes(t) != bytes(spec.trns):
                return "FAIL: tRNS differs"
        got = expected_gray(3, 8, a[..., None], pal, list(im.info.get("transparency", b"")) or None)
    elif spec.ct == 0 and spec.depth == 1:
        want = s[..., 0] * 255
        if not np.array_equal(a * (255 if a.max() <= 1 else 1), want):
            return "FAIL: 1-bit values differ"
        got = expected_gray(0, 8, want[..., None])
    elif spec.ct == 0 and spec.depth == 16:
        if not np.array_equal(a, s[..., 0]):
            return "FAIL: 16-bit values differ"
        got = expected_gray(0, 16, a[..., None])
    elif spec.depth == 16:
        # Pillow keeps the high byte of 16-bit colour and gray+alpha samples
        hi = s >> 8
        if spec.ct == 4:
            if im.mode != "RGBA" or not np.array_equal(a[..., 0], hi[..., 0]) or \
                    not np.array_equal(a[..., 3], hi[..., 1]):
                return "FAIL: gray+alpha 16 differs"
        elif not np.array_equal(a.reshape(s.shape), hi):
            return "FAIL: 16-bit samples differ (high bytes)"
        note = " (Pillow: 16-bit samples as v >> 8)"
        got = None
    else:
        want = to8(s, spec.depth)
        if not np.array_equal(a.reshape(want.shape), want):
            return "FAIL: samples differ (mode %s)" % im.mode
        got = expected_gray(spec.ct, 8, a.reshape(want.shape))
    if got is not None and not np.array_equal(got, spec.expected()):
        return "FAIL: gray from Pillow's samples differs"
    return "ok, same samples" + note


def pil_check_pgm(path, pgm):
    try:
        im = Image.open(path)
        im.load()
    except Exception as e:  # noqa: BLE001
        return "FAIL: Pillow raised %s: %s" % (type(e).__name__, e)
    a = np.asarray(im).astype(np.int64)
    want = pgm_gray(pgm.values, pgm.maxval).astype(np.int64)
    if im.mode == "L":
        got = a
    else:  # Pillow gives 16-bit values for maxval > 255, scaled to 65535
        got = to8(a, 16)
    if np.array_equal(got, want):
        return "ok, same gray (Pillow mode %s)" % im.mode
    d = np.abs(got - want)
    return "ok within 1 (%d of %d differ by 1: Pillow rounds v*%d/%d its own way, mode %s)" % (
        int((d > 0).sum()), d.size, 65535 if im.mode != "L" else 255, pgm.maxval, im.mode) \
        if d.max() <= 1 else "FAIL: Pillow's values differ by up to %d" % d.max()


def pil_check_bad(path):
    try:
        im = Image.open(path)
        im.load()
    except Exception as e:  # noqa: BLE001
        msg = str(e).replace(path, os.path.basename(path)).splitlines()[0] if str(e) else ""
        return "rejected: %s%s" % (type(e).__name__, (": " + msg[:60]) if msg else "")
    return "ACCEPTED (%s %dx%d)" % (im.mode, im.size[0], im.size[1])


# ---------------------------------------------------------------------------


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    ap.add_argument("--quiet", action="store_true", help="print only problems")
    args = ap.parse_args()
    out = args.out
    ddir = os.path.join(out, "digits")
    os.makedirs(ddir, exist_ok=True)
    Image.MAX_IMAGE_PIXELS = 100_000_000  # the huge files must be refused, not decoded
    failures = []
    table = []  # (name, size, w x h, expected, Pillow)

    manifest = [
        "# mnistcu_image_load fixtures, written by tests/make_image_fixtures.py: do not edit.",
        "# name width height expected",
        "# expected: ok (a valid image; name.gray, e.g. g8.png.gray, holds its 8-bit grayscale",
        "# conversion, width*height bytes, row-major) or the error class of a malformed file:",
        "# crc signature ihdr truncated zlib size filter palette order pgm huge.  For a malformed",
        "# file, width and height are those its header was meant to state (informative only).",
        "# Conversion: 16-bit v -> (v*255 + 32767) // 65535; gray of depth d < 8 -> v*255 // (2^d - 1);",
        "# RGB -> (299 R + 587 G + 114 B + 500) // 1000; alpha a over white:",
        "# (g*a + 255*(255 - a) + 127) // 255; tRNS alpha per palette entry (255 beyond it);",
        "# PGM maxval M: (v*255 + M // 2) // M.",
        "",
        "# valid PNG",
    ]

    specs = valid_png_specs()
    for s in specs:
        data = serialize(s.chunks())
        path = os.path.join(out, s.name)
        write(path, data)
        g = s.expected()
        assert g.shape == (s.h, s.w)
        write(os.path.join(out, s.name + ".gray"), g.tobytes())
        r = pil_check_png(path, s)
        if r.startswith("FAIL"):
            failures.append((s.name, r))
        table.append((s.name, len(data), "%dx%d" % (s.w, s.h), "ok", r))
        manifest.append("# %s" % s.describe())
        manifest.append("%s %d %d ok" % (s.name, s.w, s.h))

    manifest += ["", "# valid PGM"]
    for p in valid_pgms():
        path = os.path.join(out, p.name)
        write(path, p.data)
        g = pgm_gray(p.values, p.maxval)
        assert g.shape == (p.h, p.w)
        write(os.path.join(out, p.name + ".gray"), g.tobytes())
        r = pil_check_pgm(path, p)
        if r.startswith("FAIL"):
            failures.append((p.name, r))
        table.append((p.name, len(p.data), "%dx%d" % (p.w, p.h), "ok", r))
        manifest.append("# %s maxval %d%s" % (p.data[:2].decode(), p.maxval, (", " + p.note) if p.note else ""))
        manifest.append("%s %d %d ok" % (p.name, p.w, p.h))

    manifest += ["", "# malformed"]
    for bfile in malformed(specs) + malformed_pgms():
        path = os.path.join(out, bfile.name)
        write(path, bfile.data)
        r = pil_check_bad(path)
        table.append((bfile.name, len(bfile.data), "%dx%d" % (bfile.w, bfile.h), bfile.expected_class, r))
        manifest.append("# %s" % bfile.note)
        manifest.append("%s %d %d %s" % (bfile.name, bfile.w, bfile.h, bfile.expected_class))
    write(os.path.join(out, "MANIFEST.txt"), ("\n".join(manifest) + "\n").encode())

    # drawn digits
    dman = [
        "# Drawn digits for mnistcu_image_load and the MNIST-style preprocessing, written by",
        "# tests/make_image_fixtures.py: do not edit.  name label; the comment above each line",
        "# gives the canvas size and the PNG colour type.  preview.png shows each digit and the",
        "# 28x28 input it becomes (cropped to the ink, fitted to 20x20, centred by centre of mass).",
    ]
    entries = []
    for label, variant, w, h, mode, box, wf, slant in DIGIT_LAYOUT:
        s = digit_image(label, variant, w, h, mode, box, wf, slant)
        data = serialize(s.chunks())
        path = os.path.join(ddir, s.name)
        write(path, data)
        r = pil_check_png(path, s)
        if r.startswith("FAIL"):
            failures.append((s.name, r))
        table.append(("digits/" + s.name, len(data), "%dx%d" % (w, h), str(label), r))
        gray = s.expected()
        entries.append((label, variant, gray, mnist_preprocess(gray)))
        dman.append("# %dx%d %s %d-bit" % (w, h, CT_NAME[s.ct], s.depth))
        dman.append("%s %d" % (s.name, label))
    write(os.path.join(ddir, "MANIFEST.txt"), ("\n".join(dman) + "\n").encode())
    sheet = contact_sheet(entries)
    pv = PngSpec("preview.png", 0, 8, sheet.shape[1], sheet.shape[0], filters="adaptive",
                 zopt={"level": 9}, samples=sheet)
    data = serialize(pv.chunks())
    write(os.path.join(ddir, "preview.png"), data)
    table.append(("digits/preview.png", len(data), "%dx%d" % (pv.w, pv.h), "-", pil_check_png(
        os.path.join(ddir, "preview.png"), pv)))

    total = 0
    for root, _, files in os.walk(out):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    if not args.quiet:
        print("%-22s %7s %-19s %-10s %s" % ("file", "bytes", "size", "expected", "Pillow"))
        for row in table:
            print("%-22s %7d %-19s %-10s %s" % row)
        print("%d files, %d bytes in %s" % (len(table), total, out))
    for name, r in failures:
        print("%s: %s" % (name, r), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
