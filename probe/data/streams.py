"""Corpus files read as streams (docs/definitions.md#streamed-corpora): a local ``.txt`` file, a directory of them, or
a ``.jsonl[.gz]`` file becomes a sequence of documents that holds only where each document lies in the file, so memory
is bounded by what a caller reads, never by the file.

One pass over the file (at :class:`FileDocuments` creation) finds the documents, checks every JSON-lines record and
hashes the file's bytes (``sha256``, ``size``: the corpus's content fingerprint); afterwards ``pieces(i)`` yields the
text of document i in pieces of at most about ``BLOCK`` characters, read from its offset, so the first window of a
200 MB document reads its first megabyte. A ``.jsonl.gz`` record is sliced from the most recently inflated chunks
(at most ``RECENT`` bytes: :class:`_Recent`), since a gzip stream seeks backward only by inflating from its start.
The documents are exactly those ``probe.data.documents.split_blank_lines`` (``.txt``) and a whole-file JSON-lines
read give: universal newlines, blank chunks and blank records dropped.

A JSON-lines record longer than ``LONG_RECORD`` bytes is never held whole: it is scanned as a stream (its ``"text"``
value decoded in pieces at points no escape spans). Standard library only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import sys
import warnings
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from probe.data.limits import MAX_INPUT_BYTES, check_input_file, human_bytes
from probe.writes import clean_text

BLOCK = 1 << 20  # bytes read at a time
RECENT = 16 << 20  # a .gz file: inflated bytes kept (in BLOCK-sized chunks) for reading documents in any order
LONG_RECORD = 8 << 20  # a JSON-lines record at least this long is scanned as a stream instead of parsed whole

_NL = rb"(?:\r\n|\r(?!\n)|\n)"  # a line end as universal newlines read it
_SEPARATOR = re.compile(_NL + rb"[ \t]*" + _NL + rb"(?:[ \t]*" + _NL + rb")*")  # split_blank_lines' separator
_CONTENT_AFTER = re.compile(rb"[ \t]*[^ \t\r\n]")  # text follows: a separator found before it cannot grow
_ASCII_TEXT = re.compile(rb"[^ \t\n\r\x0b\x0c\x1c-\x1f\x80-\xff]")  # an ASCII byte str.strip() keeps
_HIGH = re.compile(rb"[\x80-\xff]")


class _Hashing(io.RawIOBase):
    """A binary file read through, hashed and counted on the way (the content fingerprint costs no second read)."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(len(b))
        b[: len(data)] = data
        self.sha.update(data)
        self.size += len(data)
        return len(data)


class _Recent:
    """The most recently used inflated chunks of a .gz file (chunk k: inflated bytes k*chunk .. (k+1)*chunk; a shorter
    one ends the file), at most ``RECENT`` bytes of them. A gzip stream seeks forward cheaply but backward only by
    inflating again from the file's start, and windows visit documents in a seeded order (shuffled within blocks of
    65,536), so document texts are sliced from these chunks: the parse fills them as it reads, a miss reads its chunk
    through the seeking handle."""

    def __init__(self, chunk: int):
        self.chunk, self.chunks, self.size = chunk, OrderedDict(), 0

    def get(self, k: int) -> bytes | None:
        data = self.chunks.get(k)
        if data is not None:
            self.chunks.move_to_end(k)
        return data

    def put(self, k: int, data: bytes) -> None:
        if k in self.chunks:
            return
        self.chunks[k] = data
        self.size += len(data)
        while self.size > max(RECENT, self.chunk) and len(self.chunks) > 1:
            self.size -= len(self.chunks.popitem(last=False)[1])


class _Recording:
    """A binary stream read forward from offset 0 whose aligned reads of the cache's chunk size are kept in it, except
    those more than a chunk past the start of the line being read (``line_start``): a record that long is rare, and
    a long one's text is read from the file in pieces, so the cache never doubles a long record's buffer."""

    def __init__(self, f, recent: _Recent):
        self.f, self.recent, self.at, self.line_start = f, recent, 0, 0

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        c = self.recent.chunk
        if n == c and self.at % c == 0 and data and self.at - self.line_start <= c:
            self.recent.put(self.at // c, data)
        self.at += len(data)
        return data


class _Span(io.RawIOBase):
    """Bytes ``start`` .. ``end`` of a seekable binary file, as a file of their own."""

    def __init__(self, f, start: int, end: int):
        f.seek(start)
        self.f, self.left = f, end - start

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(min(len(b), self.left)) if self.left > 0 else b""
        b[: len(data)] = data
        self.left -= len(data)
        return len(data)


def _text_pieces(raw, strip_newlines: bool = True):
    """The text of a binary stream, decoded as UTF-8 with universal newlines (a byte that is not UTF-8 becomes
    U+FFFD), in pieces of up to BLOCK characters; leading and trailing newlines dropped (``str.strip("\\n")``)."""
    text = io.TextIOWrapper(io.BufferedReader(raw, BLOCK), encoding="utf-8", errors="replace", newline=None)
    held, started = "", not strip_newlines
    while piece := text.read(BLOCK):
        if not started:
            piece = piece.lstrip("\n")
            started = bool(piece)
        if strip_newlines:  # hold back a trailing run of newlines until text follows it
            piece = held + piece
            body = piece.rstrip("\n")
            held = piece[len(body) :]
            piece = body
        if piece:
            yield piece


def _has_text(segment: bytes) -> bool | None:
    """Whether ``segment`` holds a character ``str.strip()`` keeps: True, False, or None when only a multi-byte
    character cut at the segment's edge could (decided by decoding the document)."""
    if _ASCII_TEXT.search(segment):
        return True
    if not _HIGH.search(segment):
        return False
    return True if segment.decode("utf-8", errors="ignore").strip() else None


class FileDocuments(Sequence):
    """The documents of one corpus file or directory, read from disk when asked for (see the module docstring).

    ``sha256`` / ``size``: SHA-256 (hex) and byte count of the file as stored (a directory: of each file's relative
    name, size and bytes, in order); ``skipped``: JSON-lines records without a string ``"text"`` passed over."""

    def __init__(self, path, *, skip_bad: bool = False):
        self.path = Path(path)
        self.skipped, self.first_bad = 0, None
        self._start, self._end = array("q"), array("q")  # byte span of each document (jsonl: of its record / text)
        self._kind = bytearray()  # jsonl: 0 = a record parsed whole, 1 = a long record's "text" string at _start
        self._files: list[Path] = []
        self._handle = None
        self._complete, self._raw = True, None  # a JSON-lines file: parsed as far as documents are asked for
        self._recent: _Recent | None = None  # a .gz file: its recently inflated chunks
        if self.path.is_dir():
            self.format = "directory"
            self._index_directory()
        elif self.path.name.endswith((".jsonl", ".jsonl.gz")):
            self.format = "jsonl.gz" if self.path.name.endswith(".gz") else "jsonl"
            self._index_jsonl(skip_bad)
        else:
            self.format = "text"
            self._index_text()

    # ----------------------------------------------------------------------------------------- reading documents

    def __len__(self) -> int:
        self._parse_to(sys.maxsize)  # every record of a JSON-lines file
        return len(self._start)

    def available(self, k: int) -> int:
        """How many of the first ``k`` documents exist: min(k, len(self)), parsing no further than document k."""
        self._parse_to(k)
        return min(k, len(self._start))

    def __getitem__(self, i):
        if isinstance(i, slice):
            if i.step in (None, 1) and (i.start or 0) >= 0 and i.stop is not None and i.stop >= 0:
                return [self[j] for j in range(i.start or 0, self.available(i.stop))]  # a prefix: parsed so far
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i < 0 or self.available(i + 1) <= i:
            raise IndexError(f"document {i} of {len(self)}")
        return "".join(self.pieces(i))

    def __iter__(self):
        i = 0
        while self.available(i + 1) > i:
            yield self[i]
            i += 1

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def pieces(self, i: int):
        """The text of document ``i`` in pieces (each at most about BLOCK characters), read from its place."""
        self._parse_to(i + 1)
        if self.format == "directory":
            with open(self._files[i], "rb", buffering=0) as f:
                yield from _text_pieces(f)
            return
        f = self._file()
        start, end = self._start[i], self._end[i]
        if self.format == "text":
            yield from _text_pieces(_Span(f, start, end))
        elif self._kind[i] == 0:
            yield _record_text(self._bytes(f, start, end))[1]
        else:
            f.seek(start)
            yield from _JsonStream(f).string_pieces()

    def _bytes(self, f, start: int, end: int) -> bytes:
        """Bytes ``start`` .. ``end`` of the file (of a .gz: of its inflated stream, through the recent chunks)."""
        if self._recent is None:
            f.seek(start)
            return f.read(end - start)
        c, parts = self._recent.chunk, []
        for k in range(start // c, (end - 1) // c + 1):
            data = self._recent.get(k)
            if data is None:
                f.seek(k * c)
                data = f.read(c)
                self._recent.put(k, data)
            parts.append(data[max(start - k * c, 0) : end - k * c])
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _file(self):
        """One handle kept open (a gzip stream seeks backward only by inflating from the start: its records are read
        through the recent chunks)."""
        if self._handle is None:
            raw = open(self.path, "rb")  # noqa: SIM115 — kept open across calls, closed by close()
            self._handle = gzip.GzipFile(fileobj=raw, mode="rb") if self.format == "jsonl.gz" else raw
        return self._handle

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __del__(self):
        try:
            self.close()
            if self._raw is not None:  # the records left unparsed are never read
                self._raw.close()
        except Exception:  # noqa: BLE001, S110 — interpreter shutdown
            pass

    # ----------------------------------------------------------------------------------------- the one pass

    def _add(self, start: int, end: int, kind: int = 0) -> None:
        self._start.append(start)
        self._end.append(end)
        self._kind.append(kind)

    def _index_text(self) -> None:
        """Blank-line-separated chunks (split_blank_lines of the universal-newline text), found block by block: a
        separator counts once text follows it (it could still grow), and the buffer keeps only from the last line
        end on."""
        path = check_input_file(self.path)
        undecided = []
        with open(path, "rb") as raw:
            f = _Hashing(raw)
            buf, base, chunk, has_text, eof = b"", 0, 0, False, False
            while not eof:
                data = f.read(BLOCK)
                eof = not data
                buf += data
                pos, scanned, pending = 0, 0, None
                while (m := _SEPARATOR.search(buf, pos)) is not None:
                    if not eof and not _CONTENT_AFTER.match(buf, m.end()):
                        pending = m.start()
                        break
                    has_text = _merge(has_text, _has_text(buf[scanned : m.start()]))
                    self._chunk(chunk, base + m.start(), has_text, undecided)
                    chunk, has_text, pos, scanned = base + m.end(), False, m.end(), m.end()
                if eof:
                    self._chunk(chunk, base + len(buf), _merge(has_text, _has_text(buf[scanned:])), undecided)
                    break
                last_end = max(buf.rfind(b"\n"), buf.rfind(b"\r"))  # a separator can only start at a line end
                if last_end > 0 and buf[last_end - 1 : last_end + 1] == b"\r\n":
                    last_end -= 1
                keep = pending if pending is not None else last_end if last_end >= pos else len(buf)
                has_text = _merge(has_text, _has_text(buf[scanned:keep]))
                buf, base = buf[keep:], base + keep
        self.sha256, self.size = f.sha.hexdigest(), f.size
        for i in reversed(undecided):  # only non-ASCII characters and whitespace seen: decide by decoding
            if not any(p.strip() for p in self.pieces(i)):
                for column in (self._start, self._end, self._kind):
                    column.pop(i)

    def _chunk(self, start: int, end: int, has_text, undecided: list) -> None:
        if has_text is False or end <= start:
            return
        if has_text is None:
            undecided.append(len(self))
        self._add(start, end)

    def _index_directory(self) -> None:
        files = sorted(self.path.rglob("*.txt"))
        if not files:
            raise FileNotFoundError(f"corpus directory {str(self.path)!r} holds no .txt files")
        sha, size = hashlib.sha256(), 0
        for file in files:
            check_input_file(file)
            with open(file, "rb", buffering=0) as raw:
                f = _Hashing(raw)
                text = any(p.strip() for p in _text_pieces(f))
                _drain(f)  # the rest, for the hash (any() stops at the first text)
            sha.update(f"{file.relative_to(self.path)}\0{f.size}\0".encode())
            sha.update(f.sha.digest())
            size += f.size
            if text:
                self._files.append(file)
                self._add(0, f.size)
        self.n_files = len(files)
        self.sha256, self.size = sha.hexdigest(), size

    def _index_jsonl(self, skip_bad: bool) -> None:
        """The file hashed as stored (one pass at C speed); its records parsed later, in file order and only as far as
        documents are asked for (:meth:`_parse_to`), so the cost of a few windows does not grow with the records.
        Up to the first document with text is parsed here (none: a ValueError)."""
        path = check_input_file(self.path)
        with open(path, "rb") as raw:
            hashing = _Hashing(raw)
            _drain(hashing)
        self.sha256, self.size = hashing.sha.hexdigest(), hashing.size
        self._skip_bad, self._records, self._stream, self._raw, self._complete = skip_bad, 0, None, None, False
        self._error: str | None = None
        self._parse_to(1)
        if not len(self._start):
            raise ValueError(f"corpus file {str(path)!r} holds no records with text")

    def _parse_to(self, k: int) -> None:
        """Parse records until ``k`` documents are known or the file ends. A bad record: a ValueError naming file and
        line, or (``skip_bad``) skipped and counted, with one warning at the first. Offsets are into the inflated
        stream of a .gz."""
        if self._complete or len(self._start) >= k:
            return
        if self._error is not None:  # the file cannot be read past it: every later read says so again
            raise ValueError(self._error)
        try:
            self._parse(k)
        except ValueError as e:
            self._error = str(e)
            raise

    def _parse(self, k: int) -> None:
        if self._stream is None:
            self._raw = open(self.path, "rb")  # noqa: SIM115 - kept open while records are left, closed at the end
            f = self._raw
            if self.format == "jsonl.gz":
                self._recent = self._recent or _Recent(BLOCK)
                f = _Recording(gzip.GzipFile(fileobj=self._raw, mode="rb"), self._recent)
            self._stream = _JsonStream(f, position=0)
        stream, path = self._stream, self.path
        try:
            while len(self._start) < k:
                start = stream.position
                if isinstance(stream.f, _Recording):
                    stream.f.line_start = start
                line = stream.read_line(LONG_RECORD)
                if line == b"":
                    self._finish()
                    return
                self._records += 1
                if line is None:  # a long record: scanned, never held whole
                    why, text_at, has_text = stream.scan_record()
                else:
                    (why, text), text_at, has_text = _record_text(line), None, None
                offset = stream.position
                if offset > MAX_INPUT_BYTES:
                    raise ValueError(
                        f"{path} inflates past {human_bytes(MAX_INPUT_BYTES)}, more than a corpus file may hold"
                    )
                if why == "blank":
                    continue
                if why is not None:
                    where = f"{path}:{self._records} {why}"
                    if not self._skip_bad:
                        raise ValueError(f"{where}; fix the record, or pass --skip-bad-records to skip such records")
                    self.skipped += 1
                    if self.first_bad is None:
                        self.first_bad = where
                        warnings.warn(
                            f'skipping records without a string "text" as they are read (first: {where})', stacklevel=3
                        )
                    continue
                if text_at is None:
                    if text.strip():
                        self._add(start, offset)
                elif has_text:
                    self._add(text_at, offset, kind=1)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ValueError(
                f"{path} is corrupt or truncated compressed data ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no detail'})"
            ) from None

    def _finish(self) -> None:
        self._complete = True
        if self._raw is not None:
            self._raw.close()
        self._stream = self._raw = None


def _drain(f) -> None:
    while f.read(BLOCK):
        pass


def _merge(a, b):
    """Two segments' _has_text answers: True wins, then undecided."""
    return True if a is True or b is True else None if a is None or b is None else False


def _record_text(line: bytes) -> tuple[str | None, str]:
    """(why a JSON-lines record read whole gives no document: "blank" for a blank line, None when it gives one; its
    "text"), decoded by the text rule: bytes that are not UTF-8 and lone surrogates become U+FFFD."""
    text = line.decode("utf-8", "replace")
    if not text.strip():
        return "blank", ""
    try:
        record = json.loads(text)
    except ValueError:
        return "is not JSON", ""
    except RecursionError:
        return "is not JSON probe reads (nested deeper than Python's JSON reader goes)", ""
    if not isinstance(record, dict) or "text" not in record:
        return 'is not a JSON object with a "text" field', ""
    if not isinstance(record["text"], str):
        return f'has a "text" of type {type(record["text"]).__name__}, not a string', ""
    return None, clean_text(record["text"])


class _NotJson(Exception):
    pass


class _JsonStream:
    """A JSON-lines record read in blocks: enough of a JSON scanner to find the top-level ``"text"`` of one object
    and decode it in pieces, never holding the record whole."""

    def __init__(self, f, position: int | None = None):
        self.f, self.buf, self.i = f, b"", 0
        self.base = f.tell() if position is None else position  # stream offset of buf[0]

    @property
    def position(self) -> int:
        return self.base + self.i

    def _more(self) -> bool:
        data = self.f.read(BLOCK)
        if not data:
            return False
        self.buf, self.base, self.i = self.buf[self.i :] + data, self.base + self.i, 0
        return True

    def read_line(self, limit: int) -> bytes | None:
        """The next line (with its newline) when it is shorter than ``limit`` bytes; b"" at the end; None, reading
        nothing, when it is longer."""
        while True:
            nl = self.buf.find(b"\n", self.i, self.i + limit)
            if nl >= 0:
                line, self.i = self.buf[self.i : nl + 1], nl + 1
                return line
            if len(self.buf) - self.i >= limit:
                return None
            if not self._more():
                line, self.i = self.buf[self.i :], len(self.buf)
                return line

    def _peek(self) -> bytes:
        while self.i >= len(self.buf):
            if not self._more():
                return b""
        return self.buf[self.i : self.i + 1]

    def _skip_space(self) -> bytes:
        while (c := self._peek()) in (b" ", b"\t", b"\r"):
            self.i += 1
        return c

    def _expect(self, c: bytes) -> None:
        if self._skip_space() != c:
            raise _NotJson
        self.i += 1

    def string_pieces(self):
        """Decode the string that starts here (at its quote), in pieces cut where no escape and no UTF-8 character
        spans the cut (an escaped surrogate pair stays whole)."""
        self._expect(b'"')
        while True:
            end = self._closing_quote()
            if end is not None:
                body, self.i = self.buf[self.i : end], end + 1
                if body:
                    yield _decode(body)
                return
            cut = len(self.buf) - 7
            while cut > self.i and (b"\\" in self.buf[max(cut - 6, 0) : cut] or 0x80 <= self.buf[cut] < 0xC0):
                cut -= 1
            if cut > self.i:
                body, self.i = self.buf[self.i : cut], cut
                yield _decode(body)
            if not self._more():
                raise _NotJson  # the line ended inside the string

    def _closing_quote(self) -> int | None:
        j = self.i
        while (j := self.buf.find(b'"', j)) >= 0:
            k = j
            while k > self.i and self.buf[k - 1] == 0x5C:  # backslashes before the quote
                k -= 1
            if (j - k) % 2 == 0:
                return j
            j += 1
        return None

    def _skip_value(self) -> str:
        """Skip one value; its Python type name as json would load it."""
        c = self._skip_space()
        if c == b'"':
            for _ in self.string_pieces():
                pass
            return "str"
        if c in (b"{", b"["):
            depth, kind = 0, "dict" if c == b"{" else "list"
            while True:
                c = self._peek()
                if not c or c == b"\n":
                    raise _NotJson
                if c == b'"':
                    for _ in self.string_pieces():
                        pass
                    continue
                depth += 1 if c in (b"{", b"[") else -1 if c in (b"}", b"]") else 0
                self.i += 1
                if depth == 0:
                    return kind
        word = b""
        while (c := self._peek()) and c not in (b",", b"}", b"]", b" ", b"\t", b"\r", b"\n"):
            word += c
            self.i += 1
        if word in (b"true", b"false"):
            return "bool"
        if word == b"null":
            return "NoneType"
        try:
            return type(json.loads(word)).__name__
        except ValueError:
            raise _NotJson from None

    def scan_record(self) -> tuple[str | None, int | None, bool]:
        """(why it gives no document or None, stream offset of its last top-level "text" string, whether that text
        holds non-whitespace); the stream is left after the record's line end."""
        why, text_at, has_text = None, None, False
        try:
            self._expect(b"{")
            if self._skip_space() == b"}":
                self.i += 1
            else:
                while True:
                    key = "".join(self.string_pieces()) if self._skip_space() == b'"' else None
                    if key is None:
                        raise _NotJson
                    self._expect(b":")
                    if key == "text" and self._skip_space() == b'"':
                        text_at, has_text, why = self.position, False, None
                        for piece in self.string_pieces():
                            has_text = has_text or bool(piece.strip())
                    else:
                        kind = self._skip_value()
                        if key == "text":
                            why = f'has a "text" of type {kind}, not a string'
                    c = self._skip_space()
                    self.i += 1
                    if c == b"}":
                        break
                    if c != b",":
                        raise _NotJson
            if self._skip_space() not in (b"\n", b""):
                raise _NotJson
            if why is None and text_at is None:
                why = 'is not a JSON object with a "text" field'
        except (_NotJson, ValueError):
            why = "is not JSON"
        while (c := self._peek()) and c != b"\n":  # to the end of the line, whatever it held
            nl = self.buf.find(b"\n", self.i)
            self.i = len(self.buf) if nl < 0 else nl
        if self._peek() == b"\n":
            self.i += 1
        return why, (text_at if why is None else None), has_text


def _decode(body: bytes) -> str:
    """A piece of a JSON string's body, by the text rule (bytes that are not UTF-8, lone surrogates: U+FFFD)."""
    return clean_text(json.loads('"' + body.decode("utf-8", "replace") + '"'))


__all__ = ["BLOCK", "LONG_RECORD", "FileDocuments"]
