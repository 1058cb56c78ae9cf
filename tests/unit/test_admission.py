"""What is refused before journaling, as tables: the proxy's own addresses, requests bad in themselves, a body
declared over max_body; and the log's scrubbing of mitmproxy's own lines. The bounded body buffer and bounded
decoding themselves: test_bodylimit.py."""

import asyncio
import logging

import pytest
from mitmproxy.test import taddons, tflow, tutils

from proxy_addon.addons.admission import Admission, OwnAddresses, bad_request
from proxy_addon.config import parse_config
from proxy_addon.log import scrub_standard_logging
from proxy_addon.protocols.facts import RequestFacts, split_query


def own(*entries: tuple[str, int]) -> OwnAddresses:
    addresses = OwnAddresses()
    for host, port in entries:
        addresses.add(host, port, "the receipts admin server")
    return addresses


async def no_dns(name, port, type):
    raise OSError("no DNS in unit tests")


async def resolves_to(address):
    async def resolve(name, port, type):
        return [(2, 1, 6, "", (address, port))]

    return resolve


@pytest.mark.parametrize("listening, host, port, refused", [
    (("127.0.0.1", 8081), "127.0.0.1", 8081, True),
    (("127.0.0.1", 8081), "localhost", 8081, True),
    (("127.0.0.1", 8081), "::1", 8081, True),
    (("127.0.0.1", 8081), "0.0.0.0", 8081, True),  # connecting to 0.0.0.0 reaches this machine
    (("127.0.0.1", 8081), "127.0.0.2", 8081, True),
    (("127.0.0.1", 8081), "127.0.0.1", 8082, False),
    (("127.0.0.1", 8081), "192.0.2.10", 8081, False),  # TEST-NET: not this machine
    (("0.0.0.0", 8080), "127.0.0.1", 8080, True),
    (("", 8080), "localhost", 8080, True),
    (("::", 8080), "::1", 8080, True),
])
def test_own_addresses(listening, host, port, refused):
    addresses = own(listening)

    async def check():
        resolve = await resolves_to("127.0.0.1") if host == "localhost" else no_dns
        return await addresses.forbidden(host, port, resolve)

    what = asyncio.run(check())
    assert (what is not None) is refused
    if refused:
        assert "admin server" in what and str(port) in what


def test_a_name_that_resolves_to_this_machine_is_refused():
    addresses = own(("127.0.0.1", 8081))

    async def check(address):
        return await addresses.forbidden("admin.localtest.example", 8081, await resolves_to(address))

    assert asyncio.run(check("127.0.0.1")) is not None
    assert asyncio.run(check("192.0.2.1")) is None


def facts(url: str = "http://api.example.com/x", headers=(), method: str = "POST") -> RequestFacts:
    path, query = split_query("/" + url.split("/", 3)[-1] if url.count("/") >= 3 else "/")
    return RequestFacts(method, "http", "api.example.com", 80, path, query, [], None, b"", url, tuple(headers), b"")


@pytest.mark.parametrize("headers, url, named", [
    ([(b"X-Api-Key", b"abc\x00def")], "http://api.example.com/x", "'X-Api-Key'"),
    ([(b"Authorization", b"Bearer a\nb")], "http://api.example.com/x", "'Authorization'"),
    ([(b"X-Note", b" leading space")], "http://api.example.com/x", "'X-Note'"),
    ([(b"Bad Name", b"value-4c2")], "http://api.example.com/x", "'Bad Name'"),
    ([], "http://api.example.com/caf\u00e9", "not ASCII"),
    ([], "ftp://api.example.com/x", "scheme"),
])
def test_a_request_bad_in_itself_is_named_without_its_values(headers, url, named):
    why = bad_request(facts(url, headers))
    assert why is not None and named in why, why
    for _, value in headers:
        assert value.decode("latin-1").strip() not in why


@pytest.mark.parametrize("headers", [
    [(b"X-Api-Key", b"abc\x01def")],  # h11 takes other control characters
    [(b"Content-Type", b"application/json"), (b"Transfer-Encoding", b"chunked")],  # hop-by-hop: the sender drops it
    [(b"X-Fine", b"caf\xe9")],
])
def test_what_the_sender_can_send_is_not_refused(headers):
    assert bad_request(facts(headers=headers)) is None


def test_mitmproxy_lines_reach_the_log_scrubbed(caplog):
    scrub_standard_logging()
    with caplog.at_level(logging.INFO):
        logging.getLogger("mitmproxy.proxy.server").info(
            "%s: Bad HTTP request line: %r", "127.0.0.1:5555",
            b"GET http://agent:pw-4f1e@api.example.com/x?access_token=tok-9a2b&page=2 HTTP/1.1",
        )
    text = caplog.text
    assert "pw-4f1e" not in text and "tok-9a2b" not in text and "page=2" in text and "Bad HTTP request line" in text


LIMIT = 100


class _Journals:
    """The Receipts addon as Admission sees it: its config, and every request journaled."""

    config = parse_config(f"proxy: {{max_body: {LIMIT}}}")

    def journals(self, flow) -> bool:
        return True


@pytest.mark.parametrize("declared", [LIMIT - 1, LIMIT, LIMIT + 1])
def test_a_declared_length_is_refused_from_one_byte_past_max_body(declared):
    """From the head alone (Content-Length), before any of the body is read."""
    admission = Admission(_Journals(), None, lambda answer, flow: tutils.tresp(status_code=answer.status))
    admission.own = OwnAddresses()  # listening nowhere: nothing is the proxy itself
    f = tflow.tflow(req=tutils.treq(content=b"", headers=((b"content-length", str(declared).encode()),)))

    async def run():
        with taddons.context(admission):
            await admission.requestheaders(f)

    asyncio.run(run())
    assert (f.response.status_code if f.response else None) == (413 if declared > LIMIT else None)
