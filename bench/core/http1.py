"""The bit of HTTP/1.1 framing the bench's raw load client and upstream both need."""


class ProtocolError(ValueError):
    """The peer sent bytes that are not HTTP/1.1 as the bench speaks it."""


def chunked_end(buf: bytearray, start: int) -> int | None:
    """The end offset of a complete chunked body starting at `start`, or None while incomplete."""
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(bytes(buf[pos:eol]).split(b";")[0].strip() or b"0", 16)
        except ValueError:
            raise ProtocolError("bad chunk size") from None
        pos = eol + 2
        if size == 0:
            # trailers (usually none) end with an empty line
            end = buf.find(b"\r\n", pos)
            while end >= 0 and end != pos:
                pos = end + 2
                end = buf.find(b"\r\n", pos)
            return None if end < 0 else end + 2
        if len(buf) < pos + size + 2:
            return None
        pos += size + 2
