"""Streaming reader of .tar.gz archives that trusts nothing it has not checked.

The compressed bytes are hashed as they are read; the gzip stream is inflated to its very end, so
every member's CRC-32 and length trailer is checked and bytes after the last member are refused; tar
headers are checksum-verified and a bad one is corruption, never an early end of the archive. Every
problem is one `CorruptArchive` naming the archive and the member it was in, whichever inflater
(ISA-L or zlib) did the work. Data comes out as memoryviews of the inflater's output: no copies.
"""

from __future__ import annotations

import hashlib
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from videogrpo.errors import DataError

INFLATERS = ("auto", "isal", "zlib")
_READ = 4 << 20  # compressed bytes per read
_OUT = 4 << 20  # most inflated bytes held at once, whatever the compression ratio
_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_GZIP_MAGIC = b"\x1f\x8b"
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


class CorruptArchive(DataError):
    """The archive's bytes are not a complete, intact tar.gz: download it again."""


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    kind: str  # "file", "dir" or "other" (links, devices, fifos, sparse files)


def _decompressor(inflater: str):
    """A gzip-framed (wbits 31) decompressor and the error type it raises."""
    if inflater in ("auto", "isal"):
        try:
            from isal import isal_zlib
            from isal.isal_zlib import error as isal_error

            return isal_zlib.decompressobj(wbits=31), isal_error
        except ImportError:
            if inflater == "isal":
                raise DataError("inflater 'isal' requested but the isal package is not installed") from None
    return zlib.decompressobj(wbits=31), zlib.error


class ArchiveStream:
    """`with ArchiveStream(path) as stream: for member in stream.members(): ...; sha = stream.finish()`.

    Read a file member's bytes with `stream.data(member)` before asking for the next member (unread
    bytes are skipped). `finish()` drains the stream, checks what follows the tar end-of-archive, and
    returns the SHA-256 of the compressed file.
    """

    def __init__(self, path: Path, inflater: str = "auto", on_read=None):
        if inflater not in INFLATERS:
            raise DataError(f"inflater {inflater!r}: expected one of {', '.join(INFLATERS)}")
        self.path = Path(path)
        self.inflater = inflater
        self.sha256 = hashlib.sha256()
        self.compressed_bytes = 0
        self.member = "(before the first member)"
        self._on_read = on_read
        self._chunks = self._inflate()
        self._buf = memoryview(b"")
        self._pos = 0
        self._offset = 0  # inflated bytes consumed: the position in the tar stream
        self._data_left = 0  # bytes of the current member's data not yet consumed
        self._padding = 0  # zero bytes after it, up to the next 512-byte block
        self._ended = False

    def __enter__(self) -> ArchiveStream:
        try:
            self._file = open(self.path, "rb")
        except OSError as err:
            raise DataError(f"{self.path}: cannot open the archive ({err})") from None
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def corrupt(self, what: str) -> CorruptArchive:
        return CorruptArchive(
            f"{self.path}: corrupt archive: {what} (in or after member {self.member!r}, tar offset {self._offset}); "
            f"download it again (nothing from this archive was kept)"
        )

    def _inflate(self) -> Iterator[bytes]:
        decompressor, error, members = None, Exception, 0
        while True:
            try:
                compressed = self._file.read(_READ)
            except OSError as err:
                raise DataError(f"{self.path}: cannot read the archive ({err})") from None
            if not compressed:
                break
            self.sha256.update(compressed)
            self.compressed_bytes += len(compressed)
            if self._on_read:
                self._on_read(len(compressed))
            data = compressed
            while data:
                if decompressor is None:  # a gzip member must start here, or the file is over
                    if data[:2] != _GZIP_MAGIC[: len(data)]:
                        what = "trailing bytes after the gzip stream" if members else "not a gzip file"
                        raise self.corrupt(what)
                    decompressor, error = _decompressor(self.inflater)
                try:
                    out = decompressor.decompress(data, _OUT)
                    while True:
                        if out:
                            yield out
                        if decompressor.eof or (not decompressor.unconsumed_tail and len(out) < _OUT):
                            break
                        out = decompressor.decompress(decompressor.unconsumed_tail, _OUT)
                except error as err:
                    raise self.corrupt(f"the gzip stream does not inflate ({err})") from None
                if decompressor.eof:
                    data, decompressor, members = decompressor.unused_data, None, members + 1
                else:
                    data = b""
        if decompressor is not None or not members:
            raise self.corrupt("the file ends inside the gzip stream (truncated)")

    def _take(self, n: int) -> memoryview:
        """Up to n inflated bytes (at least one); corruption when the stream has none left."""
        if self._pos == len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                raise self.corrupt("the tar stream ends early (truncated)")
            self._buf, self._pos = memoryview(chunk), 0
        piece = self._buf[self._pos : self._pos + n]
        self._pos += len(piece)
        self._offset += len(piece)
        return piece

    def _exact(self, n: int) -> bytes:
        parts = []
        while n:
            piece = self._take(n)
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def _skip(self, n: int) -> None:
        while n:
            n -= len(self._take(n))

    def data(self, member: Member) -> Iterator[memoryview]:
        """The member's bytes, in pieces; each piece is valid until the next one is asked for."""
        while self._data_left:
            piece = self._take(self._data_left)
            self._data_left -= len(piece)
            yield piece

    def members(self) -> Iterator[Member]:
        long_name: str | None = None
        pax: dict[str, str] = {}
        while True:
            self._skip(self._data_left + self._padding)
            self._data_left = self._padding = 0
            block = self._exact(_BLOCK)
            if block == _ZERO_BLOCK:
                self._ended = True
                return
            header_name, header_size, kind_flag = self._header(block)
            padded = -header_size % _BLOCK
            if kind_flag == tarfile.GNUTYPE_LONGNAME:
                long_name = self._exact(header_size).rstrip(b"\0").decode("utf-8", "surrogateescape")
                self._skip(padded)
                continue
            if kind_flag in (tarfile.XHDTYPE, tarfile.XGLTYPE):
                records = _pax_records(self._exact(header_size), self)
                self._skip(padded)
                if kind_flag == tarfile.XHDTYPE:
                    pax = records
                continue
            name = pax.get("path") or long_name or header_name
            try:
                size = int(pax["size"]) if "size" in pax else header_size
            except ValueError:
                raise self.corrupt(f"pax size {pax['size']!r} is not a number") from None
            long_name, pax = None, {}
            if kind_flag == tarfile.AREGTYPE and name.endswith("/"):
                kind_flag = tarfile.DIRTYPE  # old tars mark directories by a trailing slash only
            kind = "file" if kind_flag in _FILE_TYPES else "dir" if kind_flag == tarfile.DIRTYPE else "other"
            self.member = name
            self._data_left, self._padding = size, -size % _BLOCK
            yield Member(name, size, kind)

    def _header(self, block: bytes) -> tuple[str, int, bytes]:
        """Name, size and type flag of a ustar/GNU header, its checksum verified; tarfile parses the rare rest."""
        try:
            stored = int(block[148:156].split(b"\0", 1)[0].strip() or b"x", 8)
            size = int(block[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:  # base-256 numbers, or damage: let tarfile decide which
            return self._header_by_tarfile(block)
        unsigned = sum(block) - sum(block[148:156]) + 256
        if stored != unsigned:
            return self._header_by_tarfile(block)  # signed checksums exist; anything else is corruption
        name = block[:100].split(b"\0", 1)[0]
        if block[257:265] == b"ustar\x0000" and block[345] != 0:
            name = block[345:500].split(b"\0", 1)[0] + b"/" + name
        return name.decode("utf-8", "surrogateescape"), size, block[156:157]

    def _header_by_tarfile(self, block: bytes) -> tuple[str, int, bytes]:
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as err:
            raise self.corrupt(f"invalid tar header ({err})") from None
        return info.name, info.size, info.type

    def finish(self) -> str:
        """Check everything after the tar end-of-archive (zeros only, then the gzip trailer); the file's SHA-256."""
        if not self._ended:
            raise self.corrupt("the tar stream has no end-of-archive marker")
        self.member = "(after the end-of-archive marker)"
        while True:
            if self._pos == len(self._buf):
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._buf, self._pos = memoryview(chunk), 0
            rest = self._buf[self._pos :]
            if rest.tobytes().count(0) != len(rest):
                raise self.corrupt("data after the tar end-of-archive marker")
            self._offset += len(rest)
            self._pos = len(self._buf)
        return self.sha256.hexdigest()


def _pax_records(raw: bytes, stream: ArchiveStream) -> dict[str, str]:
    """`length key=value\\n` records of a pax extended header."""
    records, pos = {}, 0
    while pos < len(raw) and raw[pos] != 0:
        space = raw.find(b" ", pos)
        try:
            length = int(raw[pos:space])
        except ValueError:
            raise stream.corrupt("malformed pax header") from None
        if length <= 0 or space < 0 or pos + length > len(raw):
            raise stream.corrupt("malformed pax header")
        key, _, value = raw[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records
