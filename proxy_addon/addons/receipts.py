"""The receipts mitmproxy addons: a durable receipt before every write goes upstream.

Load them with `receipts proxy`, or into a plain mitmproxy:
    mitmdump -s proxy_addon/addon.py --set receipts_config=config.yaml

`Receipts` sets up the journal from its options and hands each journaled request to the handler
(request/handler.py). Beside it, each in its module and each its own concern: `AgentAuth` (which agent is
asking: addons/agent_auth.py), `AgentAPI` (the agent's own receipts, answered by the proxy at its reserved host),
`Admission` (requests to the proxy itself, bodies over proxy.max_body), `Passthrough` and `StreamLargeBodies`
(stream what is not journaled), `Heartbeat` (this instance's liveness and recovery), `InProxyReconciler`,
`InProxyAdmin`. What
they share of this addon's state is the `ReceiptsState` protocol (state.py).
"""

import asyncio
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

if __package__ in (None, "") and "proxy_addon" not in sys.modules:  # loaded by path with `mitmdump -s`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mitmproxy import ctx, exceptions, http
from mitmproxy.connection import ConnectionState

from proxy_addon import metrics, tracing
from proxy_addon.addons import admission
from proxy_addon.addons.admin import InProxyAdmin
from proxy_addon.addons.agent_api import AgentAPI, answered_here
from proxy_addon.addons.agent_auth import AgentAuth
from proxy_addon.addons.heartbeat import Heartbeat
from proxy_addon.addons.housekeeping import Housekeeping
from proxy_addon.addons.passthrough import Passthrough, StreamLargeBodies, mark_passing, recognised, route_of
from proxy_addon.addons.reconciler import InProxyReconciler
from proxy_addon.agents.identity import agent_of
from proxy_addon.config import ReceiptsConfig, load_config
from proxy_addon.db import check_schema, database_wait, make_engine, resolve_database_url
from proxy_addon.exceptions import ReceiptsError
from proxy_addon.journal.client import JournalClient
from proxy_addon.journal.links import WriterLink, WriterProcess
from proxy_addon.journal.messages import Setup
from proxy_addon.keyfiles import load_or_create_key
from proxy_addon.log import configure_logging, get_logger, scrub_standard_logging
from proxy_addon.protocols.facts import RequestFacts, split_query
from proxy_addon.protocols.rest import REST
from proxy_addon.recovery import new_instance_id
from proxy_addon.request import bodylimit
from proxy_addon.request.handler import ALIVE, Liveness, WriteHandler
from proxy_addon.request.sender import TLSSettings, UpstreamSender
from proxy_addon.rules import answers
from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.answers import Answer
from proxy_addon.store import ReceiptStore

log = get_logger("receipts.proxy")

METADATA_KEY = "receipts"
_TLS_OPTIONS = frozenset({"ssl_insecure", "ssl_verify_upstream_trusted_ca", "ssl_verify_upstream_trusted_confdir"})


class Receipts:
    """Journals the writes (the configured methods, less the reads protocols/ finds); everything else passes through."""

    def __init__(self) -> None:
        self.config: ReceiptsConfig | None = None
        self.store: ReceiptStore | None = None
        self.handler: WriteHandler | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.journal: JournalClient | None = None
        self.writer: Callable[[], WriterLink] = WriterProcess  # the journal writer: a process of its own
        self.instance_id = new_instance_id()
        self._active: tuple[str, str] | None = None  # (receipts_config, receipts_database_url) set up
        self._failure: str | None = None
        # handlers replaced by a runtime change of the options, still finishing their requests and verdicts
        self._retired: set[WriteHandler] = set()
        self.liveness: Liveness = ALIVE  # the Heartbeat addon's InstanceLiveness, once it runs

    def load(self, loader: Any) -> None:
        scrub_standard_logging()  # mitmproxy's own lines too (a bad request line quotes the URL's userinfo)
        tracing.set_up()  # from the OTEL_* variables; off (nothing imported) unless they ask for it
        loader.add_option("receipts_config", str, "config.yaml", "Path of the receipts configuration file (YAML).")
        loader.add_option(
            "receipts_database_url",
            str,
            "",
            "Database URL; when empty, RECEIPTS_DATABASE_URL, then database.url in the config, then sqlite:///receipts.db.",
        )

    def configure(self, updated: set[str]) -> None:
        if updated & {"receipts_config", "receipts_database_url"}:
            self._configure_journal((ctx.options.receipts_config, ctx.options.receipts_database_url))
        if self.handler is not None and updated & _TLS_OPTIONS:
            replaced, self.handler.sender = self.handler.sender, _sender()
            replaced.close()  # its idle connections were made with the old TLS settings

    def _configure_journal(self, wanted: tuple[str, str]) -> None:
        """Set up for these option values, unless they are the ones already set up.

        mitmproxy answers a failed option update by configuring again with the values from before it. When
        nothing was set up yet those are the defaults, whose own failure (no ./config.yaml) would hide the
        one that matters: then the earlier failure is reported."""
        if wanted == self._active:
            return
        try:
            self._setup(wanted[0], wanted[1] or None)
        except ReceiptsError as e:
            defaults = tuple(ctx.options.default(name) for name in ("receipts_config", "receipts_database_url"))
            if self._active is None and wanted == defaults and self._failure is not None:
                raise exceptions.OptionsError(self._failure) from e
            self._failure = str(e)
            raise exceptions.OptionsError(str(e)) from e
        self._active, self._failure = wanted, None

    def _setup(self, config_path: str, database_url: str | None) -> None:
        config = load_config(config_path)
        configure_logging(config.logging.level, config.logging.format)
        # No pool_pre_ping (a round trip per checkout, several per request): a write transaction that failed on
        # a connection dropped while idle runs once more (store/database.py, in_transaction).
        url = database_url or resolve_database_url(config.database.url)
        # The store's lock waits are the journal writer's (db.py, database_wait): a lock held elsewhere fails a
        # write with time left to answer it within proxy.journal_timeout, whichever of the two writes it.
        engine = make_engine(url, pool_pre_ping=False, lock_wait=database_wait(config.proxy.journal_timeout))
        try:
            check_schema(engine)
            key = load_or_create_key(config.secret_file)
        except ReceiptsError:
            engine.dispose()
            raise
        if self.handler is not None:
            self._retire(self.handler)
        elif self.journal is not None:
            self.journal.close()
        self.config, self.store = config, ReceiptStore(engine)
        setup = Setup(url, log_level=config.logging.level, log_format=config.logging.format, journal_timeout=config.proxy.journal_timeout)
        self.journal = JournalClient(setup, self.writer)
        if self.executor is None:
            self.executor = ThreadPoolExecutor(config.proxy.database_threads, thread_name_prefix="receipts-database")
        self.handler = WriteHandler(
            config, self.store, self.journal, AccountHasher(key), _sender(), self.executor, self.instance_id,
            lambda: self.liveness,
        )

    def _retire(self, handler: WriteHandler) -> None:
        """A runtime change of the options replaced this handler: its requests and their verdicts still finish
        on its journal (they count as in flight for the orphan sweep meanwhile), which then stops. Without a
        running event loop (nothing can be in flight), at once."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            handler.journal.close()
            handler.sender.close()
            handler.store.engine.dispose()
            return
        self._retired.add(handler)
        loop.create_task(self._finish(handler)).add_done_callback(lambda _: self._retired.discard(handler))

    @staticmethod
    async def _finish(handler: WriteHandler) -> None:
        """Wait for the handler's requests (still at their upstreams) and their verdicts, then close its parts."""
        await handler.idle()
        await handler.aclose()
        handler.store.engine.dispose()

    def _handlers(self) -> list[WriteHandler]:
        """The current handler and the retired ones still finishing."""
        return [*self._retired, *([self.handler] if self.handler is not None else [])]

    def in_flight(self) -> frozenset[str]:
        """The operation ids this process is working on, the retired handlers' included (the orphan sweep's)."""
        return frozenset().union(*(h.in_flight for h in self._handlers()))

    def running(self) -> None:
        if self.journal is not None:
            self.journal.start_soon()

    async def done(self) -> None:
        for handler in self._handlers():
            await handler.aclose()  # the verdicts still being committed, before the writer stops
        if self.handler is None and self.journal is not None:
            await self.journal.aclose()
        tracing.shut_down()  # the spans still queued are exported before the process ends

    def journals(self, flow: http.HTTPFlow) -> bool:
        """Whether this request may be journaled, from its head (method, host, rule: protocols/routing.py); its
        protocol may still find it a read once its body is in. Else it passes through, streamed."""
        return (
            self.handler is not None
            and self.config is not None
            and not answered_here(flow)  # the agent API's: answered by the proxy itself
            and route_of(self.config, flow).journal
        )

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or not self.journals(flow):
            return
        assert self.handler is not None and self.config is not None
        max_body = self.config.proxy.max_body
        facts = request_facts(flow, max_body)
        refused = admission.refusal(flow, facts, max_body)  # over max_body, or bad in itself: before its protocol is read
        if refused is not None:
            answer, reason = refused
            log.info("request_refused", reason=reason, method=facts.method, host=facts.host)
            flow.response = to_response(answer, flow)
            flow.metadata[METADATA_KEY] = {"refused": reason}
            return
        call = REST
        try:
            facts = await recognised(facts, self.config)  # read or write, in its protocol
            call = facts.call
            if not call.journal:
                mark_passing(flow, call.passes or call.protocol)
                return
            if tracing.enabled:
                outcome = await tracing.traced_write(facts, self.handler.handle)
            else:
                outcome = await self.handler.handle(facts)
        except Exception as e:
            # mitmproxy would log a hook's exception and forward the request anyway: fail closed instead.
            log.exception("journaling_failed", method=flow.request.method, host=flow.request.pretty_host)
            if flow.response is None:
                metrics.journal_unavailable(forwarded=False)
                problem = answers.journal_unavailable(f"internal error: {type(e).__name__}")
                flow.response = to_response(call.answer(problem), flow)
                flow.metadata[METADATA_KEY] = {"refused": "internal_error"}
            return
        flow.metadata[METADATA_KEY] = outcome.note
        if outcome.answer is not None:
            flow.response = to_response(outcome.answer, flow)


def request_facts(flow: http.HTTPFlow, max_body: int = bodylimit.NO_LIMIT) -> RequestFacts:
    req = flow.request
    path, query = split_query(req.path)
    body, _decoded = bodylimit.decoded_body(req, max_body)  # a Content-Encoding undone, up to max_body
    return RequestFacts(
        method=req.method.upper(),
        scheme=req.scheme,
        host=req.host.lower(),
        port=req.port,
        path=path,
        query=query,
        headers=list(req.headers.items(multi=True)),
        content_type=req.headers.get("content-type"),
        body=body,
        url=req.url,
        raw_headers=tuple(req.headers.fields),
        raw_body=req.raw_content or b"",
        client_gone=lambda: not flow.client_conn.state & ConnectionState.CAN_READ,
        agent=agent_of(flow),
    )


def to_response(a: Answer, flow: http.HTTPFlow) -> http.Response:
    reason = a.reason if a.reason is not None else http.status_codes.RESPONSES.get(a.status, "")
    return http.Response(
        http_version=flow.request.data.http_version,
        status_code=a.status,
        reason=reason.encode("latin-1", "replace"),
        headers=http.Headers(list(a.headers)),
        content=a.body,
        trailers=None,
        timestamp_start=flow.request.timestamp_start,
        timestamp_end=flow.request.timestamp_end,
    )


def _sender() -> UpstreamSender:
    """The upstream sender, with mitmproxy's upstream TLS options."""
    opts = ctx.options
    return UpstreamSender(
        TLSSettings(
            insecure=bool(getattr(opts, "ssl_insecure", False)),
            ca_file=getattr(opts, "ssl_verify_upstream_trusted_ca", None),
            ca_dir=getattr(opts, "ssl_verify_upstream_trusted_confdir", None),
        )
    )


def make_addons() -> list[Any]:
    """The journal addon and the ones that run beside it, in the order mitmproxy must call them."""
    journal = Receipts()
    admin = InProxyAdmin(journal)
    admits = admission.Admission(journal, admin, to_response)
    return [
        journal,
        AgentAuth(journal),  # before every other hook of ours: a request refused 407 is neither journaled nor forwarded
        AgentAPI(journal, admits.forbidden),  # before Admission and Passthrough: what it answers is none of theirs
        admits,  # before Passthrough: what it refuses is never streamed
        Passthrough(journal),
        StreamLargeBodies(journal),
        Heartbeat(journal),
        Housekeeping(journal),
        InProxyReconciler(journal),
        admin,
    ]


addons = make_addons()
