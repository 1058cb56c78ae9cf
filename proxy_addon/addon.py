"""The receipts mitmproxy addon: a durable receipt before every write goes upstream.

Load it with `receipts proxy`, or into a plain mitmproxy:
    mitmdump -s proxy_addon/addon.py --set receipts_config=config.yaml
"""

import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

if __package__ in (None, "") and "proxy_addon" not in sys.modules:  # loaded by path with `mitmdump -s`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import structlog
from mitmproxy import ctx, exceptions, http

from proxy_addon import metrics, problems
from proxy_addon.account import AccountHasher, load_or_create_key
from proxy_addon.config import HostPolicy, OperationRule, ReceiptsConfig, load_config
from proxy_addon.db import check_schema, make_engine, resolve_database_url
from proxy_addon.exceptions import (
    DuplicateOpenError,
    DuplicateSucceededError,
    IdempotencyKeyMismatchError,
    JournalUnavailableError,
    ReceiptsError,
    StaleStateError,
    SubmitNotRecordedError,
)
from proxy_addon.fingerprint import REDACTED
from proxy_addon.forward import SendResult, TLSSettings, UpstreamSender
from proxy_addon.journal import (
    RequestFacts,
    Verdict,
    build_intent,
    classify_outcome,
    replayable,
    split_query,
    storable_response,
)
from proxy_addon.log import configure_logging, get_logger
from proxy_addon.recovery import InstanceLiveness, new_instance_id
from proxy_addon.states import State
from proxy_addon.store import NewIntent, ReceiptRecord, ReceiptStore, new_operation_id

log = get_logger("receipts.proxy")

METADATA_KEY = "receipts"
RECEIPT_ID_HEADER = "X-Receipt-Id"
RECEIPT_STATE_HEADER = "X-Receipt-State"
REPLAYED_HEADER = "X-Receipt-Replayed"


class Receipts:
    """Journals POST/PUT/PATCH/DELETE (configurable); everything else passes through untouched."""

    def __init__(self) -> None:
        self.config: ReceiptsConfig | None = None
        self.store: ReceiptStore | None = None
        self.hasher: AccountHasher | None = None
        self.sender: UpstreamSender | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.instance_id = new_instance_id()
        self.liveness: InstanceLiveness | None = None
        # operation ids this process is working on; its other planned/submitted receipts are orphans
        self.in_flight: set[str] = set()
        self._tasks: list[asyncio.Task[Any]] = []
        self._active: tuple[str, str] | None = None  # (receipts_config, receipts_database_url) set up
        self._failure: str | None = None

    # -- mitmproxy lifecycle ----------------------------------------------------------------------------

    def load(self, loader: Any) -> None:
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
        if self.config and updated & {"ssl_insecure", "ssl_verify_upstream_trusted_ca", "ssl_verify_upstream_trusted_confdir"}:
            self._new_sender()

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
        # No pool_pre_ping (a round trip per checkout, several per request): the store runs a write
        # transaction that failed on a connection dropped while idle once more (ReceiptStore._in_transaction).
        engine = make_engine(database_url or resolve_database_url(config.database.url), pool_pre_ping=False)
        try:
            check_schema(engine)
            key = load_or_create_key(config.secret_file)
        except ReceiptsError:
            engine.dispose()
            raise
        if self.store is not None:
            self.store.close()
            self.store.engine.dispose()
        self.config = config
        self.store = ReceiptStore(engine)
        if engine.dialect.name == "sqlite":
            # SQLite has one writer at a time: journal threads writing themselves only fight over BEGIN
            # IMMEDIATE and sleep in the busy handler's backoff. One writer thread commits what they queue,
            # together (one fsync per batch); each request's transactions stay its own (savepoints).
            self.store.enable_group_commit()
        self.hasher = AccountHasher(key)
        if self.executor is None:
            self.executor = ThreadPoolExecutor(config.proxy.journal_threads, thread_name_prefix="receipts-journal")
        self.liveness = InstanceLiveness(
            self.store,
            self.instance_id,
            config.proxy.heartbeat_interval,
            config.proxy.instance_dead_after,
            in_flight=lambda: frozenset(self.in_flight),
        )
        self._new_sender()

    def _new_sender(self) -> None:
        opts = ctx.options
        self.sender = UpstreamSender(
            TLSSettings(
                insecure=bool(getattr(opts, "ssl_insecure", False)),
                ca_file=getattr(opts, "ssl_verify_upstream_trusted_ca", None),
                ca_dir=getattr(opts, "ssl_verify_upstream_trusted_confdir", None),
            )
        )

    async def running(self) -> None:
        assert self.liveness is not None and self.executor is not None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.liveness.register)
        await loop.run_in_executor(self.executor, self.liveness.sweep)
        self._tasks.append(asyncio.create_task(self.liveness.run(self.executor)))
        if self.config and self.store and self.config.reconcile.in_proxy:
            from proxy_addon.reconcile import Reconciler

            reconciler = Reconciler(self.config, self.store, worker_id=f"{self.instance_id}-reconcile")
            self._tasks.append(asyncio.create_task(reconciler.run_forever()))
        if self.config and self.store and self.config.admin.enabled:
            from proxy_addon.admin import serve_in_proxy

            self._tasks.append(asyncio.create_task(serve_in_proxy(self.config, self.store)))
        log.info("proxy_started", instance=self.instance_id)

    async def done(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.liveness is not None and self.executor is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, self.liveness.stop)
            except JournalUnavailableError as e:
                log.error("instance_stop_not_recorded", error=str(e))
        if self.sender is not None:
            await self.sender.aclose()
        if self.store is not None:
            self.store.close()

    # -- the hook -----------------------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        if self.config is None or flow.request.method.upper() not in self.config.proxy.methods:
            return
        try:
            await self._journal_and_send(flow)
        except Exception as e:
            # mitmproxy would log a hook's exception and forward the request anyway: fail closed instead.
            log.exception("journaling_failed", method=flow.request.method, host=flow.request.pretty_host)
            if flow.response is None:
                flow.response = problems.journal_unavailable(f"internal error: {type(e).__name__}")
                flow.metadata[METADATA_KEY] = {"refused": "internal_error"}

    async def _journal_and_send(self, flow: http.HTTPFlow) -> None:
        assert self.config and self.store and self.sender and self.executor
        facts = _facts(flow)
        policy = self.config.policy_for(facts.host, facts.port)
        agent_key = flow.request.headers.get(policy.idempotency_key_header)
        operation_id = new_operation_id()
        self.in_flight.add(operation_id)
        try:
            await self._journal_and_send_as(flow, facts, policy, agent_key, operation_id)
        finally:
            self.in_flight.discard(operation_id)

    async def _journal_and_send_as(
        self, flow: http.HTTPFlow, facts: RequestFacts, policy: HostPolicy, agent_key: str | None, operation_id: str
    ) -> None:
        assert self.sender and self.executor
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            receipt, rule = await loop.run_in_executor(
                self.executor, self._record, facts, policy, agent_key, operation_id
            )
        except DuplicateOpenError as e:
            return self._refuse(flow, problems.duplicate_open(e.operation_id, e.state), e, "duplicate_open")
        except IdempotencyKeyMismatchError as e:
            answer = problems.idempotency_key_mismatch(e.operation_id, e.state, agent_key or "")
            return self._refuse(flow, answer, e, "idempotency_key_mismatch")
        except DuplicateSucceededError as e:
            return self._refuse(flow, self._replay_or_refuse(e), e, f"duplicate_succeeded_{e.policy}")
        except JournalUnavailableError as e:
            return self._journal_down(flow, e)
        metrics.journaled(time.perf_counter() - started)

        with structlog.contextvars.bound_contextvars(operation_id=receipt.operation_id):
            headers = list(flow.request.headers.fields)
            if policy.inject_idempotency_key and agent_key is None:
                headers.append((policy.idempotency_key_header.encode(), receipt.operation_id.encode()))
            # at debug: the planned->submitted step is in the receipt's history; the verdict line is the canonical one
            log.debug("receipt_submitted", operation=receipt.operation, method=facts.method, host=facts.host)
            result = await self.sender.send_once(
                facts.method,
                flow.request.url,
                headers,
                flow.request.raw_content or b"",
                policy.connect_timeout,
                policy.upstream_timeout,
            )
            verdict = classify_outcome(result, policy, rule)
            state = await self._record_verdict(receipt, result, verdict, policy)
            flow.response = self._answer(flow, receipt, result, verdict, state)
            flow.metadata[METADATA_KEY] = {"operation_id": receipt.operation_id, "state": state}

    def _record(
        self, facts: RequestFacts, policy: HostPolicy, agent_key: str | None, operation_id: str
    ) -> tuple[NewIntent, OperationRule | None]:
        """Runs in the journal thread pool: fingerprint, decide, commit planned, commit submitted."""
        assert self.config and self.store and self.hasher
        key = agent_key if agent_key is not None else (operation_id if policy.inject_idempotency_key else None)
        intent, rule = build_intent(
            facts, policy, self.hasher, self.instance_id, self.config.proxy.max_stored_body, key, operation_id
        )
        try:
            self.store.record_and_submit(intent, policy.after_success, self.instance_id)
        except SubmitNotRecordedError as e:
            self._abandon_planned(e.operation_id)
            raise
        return intent, rule

    def _abandon_planned(self, operation_id: str) -> None:
        """The request will not be sent: close its `planned` receipt, or the retry that the 503 invites
        would be refused as a duplicate of it for as long as this instance lives (recovery is for dead ones)."""
        assert self.store
        try:
            self.store.transition(
                operation_id,
                State.PLANNED,
                State.REJECTED,
                {"who": self.instance_id, "error": "not_sent"},
                error_code="not_sent",
                error_message="the receipt could not be marked submitted, so the request was not sent",
            )
        except StaleStateError as e:
            log.info("planned_receipt_settled_elsewhere", operation_id=operation_id, state=e.actual)
        except ReceiptsError as e:
            log.error("planned_receipt_left_open", operation_id=operation_id, error=str(e))

    async def _record_verdict(
        self, receipt: NewIntent, result: SendResult, verdict: Verdict, policy: HostPolicy
    ) -> str:
        assert self.config and self.store and self.executor
        updates: dict[str, Any] = {
            "status_code": verdict.status_code,
            "error_code": verdict.error_code,
            "error_message": verdict.error_message,
            "external_id": verdict.external_id,
        }
        if verdict.state == State.SUCCEEDED:
            headers, body, truncated = storable_response(result, policy, self.config.proxy.max_stored_response)
            updates.update(response_headers=headers, response_body=body, response_body_truncated=truncated)
        detail = {
            "who": self.instance_id,
            "end": result.end.value,
            "status": verdict.status_code,
            "error": verdict.error_message,
            "elapsed_ms": round(result.elapsed * 1000, 1),
        }
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.executor,
                lambda: self.store.advance(receipt.operation_id, State.SUBMITTED, verdict.state, detail, **updates),
            )
        except ReceiptsError as e:
            # The upstream has answered but we could not write it down: the receipt stays `submitted`,
            # and crash recovery or the reconciler settles it. The agent is told which state holds.
            log.error("verdict_not_recorded", state=verdict.state.value, error=str(e))
            return State.SUBMITTED.value
        log.info(
            "receipt_" + verdict.state.value,
            status=verdict.status_code,
            error_code=verdict.error_code,
            external_id=verdict.external_id,
        )
        return verdict.state.value

    # -- answers ------------------------------------------------------------------------------------------

    def _answer(
        self, flow: http.HTTPFlow, receipt: NewIntent, result: SendResult, verdict: Verdict, state: str
    ) -> http.Response:
        if verdict.state == State.OUTCOME_UNKNOWN:
            reason = (
                f"The upstream answered {verdict.status_code}"
                if verdict.status_code
                else f"The upstream did not answer ({verdict.error_code}: {verdict.error_message})"
            )
            response = problems.outcome_unknown(receipt.operation_id, reason, verdict.status_code)
        elif result.answer is None:
            response = problems.not_sent(receipt.operation_id, f"Could not connect to the upstream ({verdict.error_message})")
        else:
            a = result.answer
            response = http.Response(
                http_version=flow.request.data.http_version,
                status_code=a.status_code,
                reason=a.reason.encode("latin-1", "replace"),
                headers=http.Headers([*a.headers, (b"content-length", str(len(a.content)).encode())]),
                content=a.content,
                trailers=None,
                timestamp_start=flow.request.timestamp_start,
                timestamp_end=flow.request.timestamp_end,
            )
        response.headers[RECEIPT_ID_HEADER] = receipt.operation_id
        response.headers[RECEIPT_STATE_HEADER] = state
        return response

    def _refuse(self, flow: http.HTTPFlow, response: http.Response, e: DuplicateOpenError | Any, reason: str) -> None:
        response.headers[RECEIPT_ID_HEADER] = e.operation_id
        response.headers.setdefault(RECEIPT_STATE_HEADER, e.state)
        flow.response = response
        flow.metadata[METADATA_KEY] = {"operation_id": e.operation_id, "refused": reason}
        log.info("request_refused", reason=reason, operation_id=e.operation_id, state=e.state)
        metrics.duplicate_refused(reason)
        self._note_refusal(reason, e)

    def _note_refusal(self, reason: str, e: Any) -> None:
        """Record the refusal on a journal thread, not awaited: it never delays nor fails the answer."""
        intent, store = getattr(e, "intent", None), self.store
        if intent is None or store is None or self.executor is None:
            return

        def write() -> None:
            try:
                store.record_refusal(
                    reason,
                    e.operation_id,
                    account=intent.account,
                    intent_fingerprint=intent.intent_fingerprint,
                    method=intent.method,
                    host=intent.host,
                    path=intent.path,
                    proxy_instance=self.instance_id,
                )
            except Exception as exc:  # a refusal that cannot be noted is logged, never raised
                log.error("refusal_not_recorded", reason=reason, operation_id=e.operation_id, error=str(exc))

        try:
            self.executor.submit(write)
        except RuntimeError as exc:  # the pool is shutting down
            log.error("refusal_not_recorded", reason=reason, operation_id=e.operation_id, error=str(exc))

    def _replay_or_refuse(self, e: DuplicateSucceededError) -> http.Response:
        original: ReceiptRecord | None = e.receipt  # type: ignore[assignment]
        if e.policy != "replay" or not replayable(original):
            return problems.duplicate_succeeded(e.operation_id)
        assert original is not None
        headers = {
            k: v for k, v in (original.response_headers or {}).items() if v != REDACTED and k != "content-length"
        }
        response = http.Response.make(original.status_code, original.response_body or b"", headers)
        response.headers[REPLAYED_HEADER] = "true"
        return response

    def _journal_down(self, flow: http.HTTPFlow, e: JournalUnavailableError) -> None:
        assert self.config
        if self.config.proxy.fail_open:
            log.error(
                "journal_unavailable_forwarding_without_receipt",
                error=str(e),
                method=flow.request.method,
                host=flow.request.pretty_host,
                fail_open=True,
            )
            flow.metadata[METADATA_KEY] = {"fail_open": True}
            return
        log.error("journal_unavailable_request_refused", error=str(e), method=flow.request.method, host=flow.request.pretty_host)
        flow.response = problems.journal_unavailable(str(e))
        flow.metadata[METADATA_KEY] = {"refused": "journal_unavailable"}


def _facts(flow: http.HTTPFlow) -> RequestFacts:
    req = flow.request
    path, query = split_query(req.path)
    return RequestFacts(
        method=req.method.upper(),
        scheme=req.scheme,
        host=req.host.lower(),
        port=req.port,
        path=path,
        query=query,
        headers=[(k, v) for k, v in req.headers.items(multi=True)],
        content_type=req.headers.get("content-type"),
        body=req.get_content(strict=False) or b"",
    )


addons = [Receipts()]
