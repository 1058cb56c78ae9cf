"""The reconciliation worker: settle outcome_unknown receipts by reading the upstream, never by a blind write.

Each receipt is leased (outcome_unknown -> reconciling), read according to its operation's rule in
config.yaml, and given a verdict with the evidence in its history:
- the write is there: succeeded, with the external id found;
- absence proven by an authoritative 2xx read, after `settle`: the rule's `absent_means`
  (safe_to_retry only with retry_safe; succeeded only for a DELETE whose rule says so; else manual_review);
- a DELETE whose target is still there after `settle` did not happen: safe_to_retry with retry_safe, else
  manual_review (never succeeded);
- several candidates, a mismatch after `settle`, or no rule: manual_review, for a person;
- a read that failed proves nothing (an error, a timeout, a non-2xx, a search whose pages do not reach back to
  the submission): back to outcome_unknown with backoff, manual_review after `attempts`.
A pass claims each receipt at most once; one whose lease ran out before its read is left to the next pass.
"""

import asyncio
import json
import os
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, quote, urljoin, urlsplit

import httpx

from proxy_addon import metrics
from proxy_addon.config import HostPolicy, OperationRule, ReceiptsConfig, ReconcileRule, compile_jsonpath
from proxy_addon.exceptions import ReceiptsError, StaleStateError
from proxy_addon.fingerprint import REDACTED, canonical_json
from proxy_addon.forward import HOP_BY_HOP
from proxy_addon.log import get_logger
from proxy_addon.recovery import InstanceLiveness
from proxy_addon.states import State
from proxy_addon.store import ReceiptRecord, ReceiptStore, utcnow

log = get_logger("receipts.reconcile")

MAX_BATCHES_PER_PASS = 1000
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PLACEHOLDER_RE = re.compile(r"\{([a-z_]+(?:\.[A-Za-z0-9_.\-]+)?)\}")


class UnreadableRule(ReceiptsError):
    """The rule cannot be applied to this receipt (a value it needs is missing or redacted)."""


class ReadNotPossible(ReceiptsError):
    """The read cannot be made now (an environment variable it needs is not set); it proves nothing."""


# -- what a read found --------------------------------------------------------------------------------------


# present: the write's effect is there. still_present: a DELETE's target is still there (the delete did not
# happen). absent: an authoritative read found nothing. mismatch: a different resource is where ours would be.
# ambiguous: several candidates. refused: the rule cannot be applied. failed: the read proved nothing.
READ_KINDS = frozenset({"present", "still_present", "absent", "mismatch", "ambiguous", "refused", "failed"})
NEEDS_SETTLE = frozenset({"absent", "still_present", "mismatch"})


@dataclass(frozen=True)
class ReadOutcome:
    kind: str  # one of READ_KINDS
    evidence: dict[str, Any] = field(default_factory=dict)
    external_id: str | None = None


@dataclass(frozen=True)
class Decision:
    state: State
    updates: dict[str, Any]
    detail: dict[str, Any]


def decide(receipt: ReceiptRecord, rule: ReconcileRule, retry_safe: bool, outcome: ReadOutcome, now: datetime, backoff: float) -> Decision:
    """The verdict for one read; pure, so the whole table of cases is tested directly."""
    if outcome.kind not in READ_KINDS:
        raise ValueError(f"unknown read outcome {outcome.kind!r}")
    detail = {"strategy": rule.strategy, "result": outcome.kind, **outcome.evidence}
    clear = {"lease_owner": None, "lease_expires_at": None}
    if outcome.kind == "present":
        return Decision(State.SUCCEEDED, {**clear, "external_id": outcome.external_id or receipt.external_id}, detail)
    if outcome.kind in ("ambiguous", "refused"):
        detail.setdefault("reason", f"read {outcome.kind}; a person must decide")
        return Decision(State.MANUAL_REVIEW, clear, detail)
    if outcome.kind in NEEDS_SETTLE:
        # what a read does not show yet (eventual consistency) proves nothing before settle
        settled_at = (receipt.submitted_at or receipt.created_at) + timedelta(seconds=rule.settle)
        if now < settled_at:
            detail["reason"] = f"not settled: {outcome.kind} proves nothing before {settled_at.isoformat()}"
            return Decision(State.OUTCOME_UNKNOWN, {**clear, "next_attempt_at": settled_at}, detail)
        if outcome.kind == "mismatch":
            detail.setdefault("reason", "the resource found does not match the request")
            return Decision(State.MANUAL_REVIEW, clear, detail)
        if outcome.kind == "still_present":
            verdict = State.SAFE_TO_RETRY if retry_safe else State.MANUAL_REVIEW
            detail["reason"] = f"still there after settle: the {receipt.method} did not take effect; retry_safe {retry_safe}"
            return Decision(verdict, clear, detail)
        verdict = State(rule.absent_means)
        if verdict == State.SAFE_TO_RETRY and not retry_safe:
            verdict = State.MANUAL_REVIEW
        if verdict == State.SUCCEEDED and receipt.method != "DELETE":
            verdict = State.MANUAL_REVIEW  # absence is success only for a DELETE (config refuses it elsewhere)
        detail["reason"] = f"absent after settle; absent_means {rule.absent_means}, retry_safe {retry_safe}: {verdict.value}"
        return Decision(verdict, clear, detail)
    attempts = receipt.reconcile_attempts + 1
    detail["attempt"] = attempts
    why = outcome.evidence.get("reason", "read failed")
    if attempts >= rule.attempts:
        detail["reason"] = f"{attempts} reads failed (last: {why}); a person must decide"
        return Decision(State.MANUAL_REVIEW, {**clear, "reconcile_attempts": attempts}, detail)
    retry_at = now + timedelta(seconds=backoff * 2 ** (attempts - 1))
    detail["reason"] = f"{why}; tried again after {retry_at.isoformat()}"
    return Decision(State.OUTCOME_UNKNOWN, {**clear, "reconcile_attempts": attempts, "next_attempt_at": retry_at}, detail)


# -- filling a rule's request from the receipt ----------------------------------------------------------------


def netloc_of(receipt: ReceiptRecord) -> str:
    host = f"[{receipt.host}]" if ":" in receipt.host else receipt.host
    default = {"http": 80, "https": 443}.get(receipt.scheme)
    return host if receipt.port == default else f"{host}:{receipt.port}"


def request_document(receipt: ReceiptRecord) -> Any:
    if not receipt.request_body:
        return None
    try:
        return json.loads(receipt.request_body)
    except (ValueError, UnicodeDecodeError):
        return None


def fill_template(template: str, receipt: ReceiptRecord, path_params: dict[str, str]) -> str:
    document = request_document(receipt)

    def value_of(name: str) -> str:
        if name.startswith("path."):
            value: Any = path_params.get(name[5:])
        elif name.startswith("body."):
            value = document
            for part in name[5:].split("."):
                value = value.get(part) if isinstance(value, dict) else None
        else:
            value = {
                "scheme": receipt.scheme,
                "host": receipt.host,
                "port": str(receipt.port),
                "netloc": netloc_of(receipt),
                "external_id": receipt.external_id,
                "idempotency_key": receipt.idempotency_key,
                "operation_id": receipt.operation_id,
                "submitted_at": (receipt.submitted_at or receipt.created_at).isoformat().replace("+00:00", "Z"),
            }.get(name)
        if value is None or value == REDACTED or isinstance(value, dict | list):
            raise UnreadableRule(f"the rule's url needs {{{name}}}, which this receipt does not have")
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return text if name in ("scheme", "host", "port", "netloc") else quote(text, safe="")

    return _PLACEHOLDER_RE.sub(lambda m: value_of(m.group(1)), template)


def expand_env(headers: dict[str, str]) -> dict[str, str]:
    """`${VAR}` from the environment, at read time only: credentials are never stored."""

    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            raise ReadNotPossible(f"environment variable {m.group(1)} is not set")
        return value

    return {k: _ENV_RE.sub(sub, v) for k, v in headers.items()}


def candidate_matches(candidate: Any, original: Any, rule: ReconcileRule) -> bool:
    for cand_path, orig_path in rule.match_paths:
        want = orig_path.find(original)
        if not want or want[0] == REDACTED:
            raise UnreadableRule(f"match needs {orig_path.text} of the original request, which was not journaled")
        got = cand_path.find(candidate)
        if not got or canonical_json(got[0]) != canonical_json(want[0]):
            return False
    return True


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


# -- the worker ---------------------------------------------------------------------------------------------


class HostRateLimiter:
    """At most `rate` reads per second to each host, spaced evenly."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self._next: dict[str, float] = {}

    async def wait(self, host: str) -> None:
        now = time.monotonic()
        slot = max(now, self._next.get(host, now))
        self._next[host] = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


@dataclass
class PassReport:
    claimed: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(self.verdicts.items())) or "nothing due"
        return f"reconciled {self.claimed}: {parts}"


class Reconciler:
    def __init__(self, config: ReceiptsConfig, store: ReceiptStore, worker_id: str | None = None):
        self.config = config
        self.store = store
        self.settings = config.reconcile
        self.worker_id = worker_id or f"worker-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.limiter = HostRateLimiter(self.settings.per_host_rate)
        self._client: httpx.AsyncClient | None = None

    async def run_once(self) -> PassReport:
        """Release expired leases, recover dead proxies' receipts, then work the due queue until it is empty."""
        report = PassReport()
        # a receipt put back during this pass waits for the next one, whatever its backoff; database time,
        # as next_attempt_at is compared with it there (this worker's clock may be off)
        pass_started = await asyncio.to_thread(self.store.db_now)
        await asyncio.to_thread(self.store.release_expired_leases, self.worker_id)
        await asyncio.to_thread(self._recover_dead_proxies)
        async with httpx.AsyncClient(trust_env=False, verify=self.settings.verify_tls) as client:
            self._client = client
            semaphore = asyncio.Semaphore(self.settings.concurrency)
            for _ in range(MAX_BATCHES_PER_PASS):
                # the lease runs out `lease` after the database's now at the claim, which is after this
                # moment: by this process's monotonic clock it is held until lease_ends, whatever its wall clock
                lease_ends = time.monotonic() + self.settings.lease
                claimed = await asyncio.to_thread(
                    self.store.claim_unknown, self.worker_id, self.settings.lease, self.settings.batch_size, pass_started
                )
                if not claimed:
                    break
                report.claimed += len(claimed)
                verdicts = await asyncio.gather(*[self._bounded(semaphore, r, lease_ends) for r in claimed])
                report.verdicts.update(v for v in verdicts if v)
            self._client = None
        return report

    async def run_forever(self) -> None:
        while True:
            try:
                report = await self.run_once()
                if report.claimed:
                    log.info("reconcile_pass", worker=self.worker_id, claimed=report.claimed, **report.verdicts)
            except Exception as e:  # a pass that failed is logged and tried again; the loop never dies
                log.error("reconcile_pass_failed", error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(self.settings.interval)

    def _recover_dead_proxies(self) -> None:
        p = self.config.proxy
        InstanceLiveness(self.store, self.worker_id, p.heartbeat_interval, p.instance_dead_after).sweep()

    async def _bounded(self, semaphore: asyncio.Semaphore, receipt: ReceiptRecord, lease_ends: float) -> str | None:
        async with semaphore:
            if time.monotonic() >= lease_ends:
                # it waited for a slot until its lease ran out: another worker may hold it by now, so no
                # read (nor re-send) is made under a lease that is gone; the next pass releases it
                log.warning("lease_expired_before_read", operation_id=receipt.operation_id, worker=self.worker_id)
                return None
            try:
                return await self.reconcile(receipt)
            except StaleStateError:
                log.warning("lease_lost", operation_id=receipt.operation_id, worker=self.worker_id)
                return None
            except Exception as e:
                # the verdict could not be written (database down, a bug): the lease expires and the
                # receipt returns to the queue; the other receipts of this pass go on
                log.error("verdict_not_recorded", operation_id=receipt.operation_id, error=f"{type(e).__name__}: {e}")
                return None

    async def reconcile(self, receipt: ReceiptRecord) -> str:
        policy = self.config.policy_for(receipt.host, receipt.port)
        matched = policy.match_operation(receipt.method, receipt.path)
        rule, params = matched if matched else (None, {})
        unknown_for = round((utcnow() - (receipt.submitted_at or receipt.created_at)).total_seconds(), 1)
        if rule is None or rule.reconcile is None:
            reason = f"no reconcile rule for {receipt.operation}" if rule is None else f"rule {rule.name} has no reconcile"
            decision = Decision(
                State.MANUAL_REVIEW, {"lease_owner": None, "lease_expires_at": None}, {"reason": reason}
            )
        else:
            try:
                outcome = await self._read(receipt, rule, rule.reconcile, params, policy)
            except UnreadableRule as e:
                outcome = ReadOutcome("refused", {"reason": str(e)})
            except ReadNotPossible as e:
                outcome = ReadOutcome("failed", {"reason": str(e)})
            except Exception as e:  # a read that broke proves nothing about the world
                log.error("reconcile_read_broke", operation_id=receipt.operation_id, error=f"{type(e).__name__}: {e}")
                outcome = ReadOutcome("failed", {"error": f"{type(e).__name__}: {e}"[:300]})
            # database time: the retry time it writes is compared with the database's clock when claiming
            now = await asyncio.to_thread(self.store.db_now)
            decision = decide(receipt, rule.reconcile, rule.retry_safe, outcome, now, self.settings.backoff)
        detail = {"who": self.worker_id, "unknown_for_seconds": unknown_for, **decision.detail}
        await asyncio.to_thread(
            self.store.transition,
            receipt.operation_id,
            State.RECONCILING,
            decision.state,
            detail,
            self.worker_id,
            **decision.updates,
        )
        log.info("reconcile_verdict", operation_id=receipt.operation_id, state=decision.state.value, result=detail.get("result"))
        metrics.reconcile_verdict(decision.state)
        return decision.state.value

    # -- reads ----------------------------------------------------------------------------------------------

    async def _read(
        self, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, params: dict[str, str], policy: HostPolicy
    ) -> ReadOutcome:
        if rule.strategy == "resend_with_key":
            return await self._resend_with_key(receipt, op, rule, policy)
        url = fill_template(rule.url or "", receipt, params)
        headers = expand_env(rule.headers)
        if rule.strategy == "lookup":
            return await self._lookup(receipt, rule, url, headers)
        return await self._search(receipt, rule, url, headers)

    async def _get(self, host: str, rule: ReconcileRule, url: str, headers: dict[str, str]) -> tuple[httpx.Response | None, dict[str, Any]]:
        assert self._client is not None
        await self.limiter.wait(host)
        started = time.monotonic()
        evidence: dict[str, Any] = {"read": {"method": rule.method, "url": url}}
        try:
            response = await self._client.request(rule.method, url, headers=headers, timeout=rule.timeout)
        except Exception as e:  # httpx.HTTPError, and InvalidURL or anyio's groups, which are not HTTPErrors
            evidence["read"].update(error=f"{type(e).__name__}: {e}"[:300], elapsed_ms=_ms(started))
            return None, evidence
        evidence["read"].update(status=response.status_code, elapsed_ms=_ms(started))
        return response, evidence

    async def _lookup(self, receipt: ReceiptRecord, rule: ReconcileRule, url: str, headers: dict[str, str]) -> ReadOutcome:
        response, evidence = await self._get(receipt.host, rule, url, headers)
        if response is None:
            return ReadOutcome("failed", evidence)
        if response.status_code in (404, 410):
            return ReadOutcome("absent", evidence)
        if not response.is_success:
            return ReadOutcome("failed", evidence)
        found_kind = "still_present" if receipt.method == "DELETE" else "present"
        if rule.method == "HEAD" or (not rule.match and rule.id is None):
            return ReadOutcome(found_kind, evidence)
        document = _json(response)
        if document is None:
            evidence["reason"] = "lookup answer is not JSON"
            return ReadOutcome("failed", evidence)
        if rule.match and not candidate_matches(document, request_document(receipt), rule):
            evidence["reason"] = "the resource found does not match the request"
            return ReadOutcome("mismatch", evidence)
        found = rule.id.first(document) if rule.id else None
        if found_kind == "still_present":
            return ReadOutcome(found_kind, {**evidence, "matched_id": found})
        return ReadOutcome("present", {**evidence, "matched_id": found}, None if found is None else str(found))

    async def _search(self, receipt: ReceiptRecord, rule: ReconcileRule, url: str, headers: dict[str, str]) -> ReadOutcome:
        original = request_document(receipt)
        if original is None:
            raise UnreadableRule("search needs the original request's JSON body, which was not journaled")
        matches: dict[str, Any] = {}  # by id: a record seen on two pages (the list shifted) is one candidate
        reads: list[dict[str, Any]] = []
        origin = urlsplit(url)[:2]
        anchor = receipt.submitted_at or receipt.created_at
        reached_back = False  # with time_field: the list showed a record older than the submission
        next_url: str | None = url
        for _page in range(rule.max_pages):
            if next_url is None:
                break
            response, evidence = await self._get(receipt.host, rule, next_url, headers)
            reads.append(evidence["read"])
            if response is None or not response.is_success:
                return ReadOutcome("failed", {"reads": reads})
            page = _json(response)
            items = rule.items.first(page) if rule.items else page
            if not isinstance(items, list):
                return ReadOutcome("failed", {"reads": reads, "reason": "search answer holds no list of items"})
            for c in items:
                created = _parse_time(rule.time_field.first(c)) if rule.time_field else None
                reached_back = reached_back or (created is not None and created < anchor)
                if self._in_window(c, receipt, rule) and candidate_matches(c, original, rule):
                    found = rule.id.first(c) if rule.id else None
                    matches.setdefault(canonical_json(c) if found is None else str(found), c)
            found_next = rule.next_page.first(page) if rule.next_page else None
            next_url = urljoin(next_url, str(found_next)) if found_next else None
            if next_url is not None and urlsplit(next_url)[:2] != origin:
                # the read's credentials go only where the rule's url points
                return ReadOutcome("failed", {"reads": reads, "reason": f"next page {next_url} leaves {origin[1]}"})
        else:
            if next_url is not None:
                return ReadOutcome("failed", {"reads": reads, "reason": f"more than {rule.max_pages} pages"})
        ids = [rule.id.first(c) if rule.id else None for c in matches.values()]
        evidence = {"reads": reads, "candidates": [str(i) for i in ids], "matched": len(matches)}
        if matches and receipt.method == "DELETE":
            return ReadOutcome("still_present", evidence)
        if len(matches) == 1:
            return ReadOutcome("present", {**evidence, "matched_id": ids[0]}, None if ids[0] is None else str(ids[0]))
        if len(matches) > 1:
            return ReadOutcome("ambiguous", {**evidence, "reason": f"{len(matches)} records match; a person must pick"})
        list_ended = rule.next_page is not None  # the loop above only gets here once no next page is left
        if rule.time_field is not None and not reached_back and not list_ended:
            # newer records may have pushed ours off the pages read: that is no proof of absence
            reason = f"the pages read do not reach back to {anchor.isoformat()}; absence not proven (set next_page)"
            return ReadOutcome("failed", {**evidence, "reason": reason})
        return ReadOutcome("absent", evidence)

    def _in_window(self, candidate: Any, receipt: ReceiptRecord, rule: ReconcileRule) -> bool:
        if rule.time_field is None:
            return True
        created = _parse_time(rule.time_field.first(candidate))
        if created is None:
            return True  # a candidate without a time is not ruled out
        anchor = receipt.submitted_at or receipt.created_at
        return abs((created - anchor).total_seconds()) <= rule.window

    async def _resend_with_key(
        self, receipt: ReceiptRecord, op: OperationRule, rule: ReconcileRule, policy: HostPolicy
    ) -> ReadOutcome:
        """The one allowed write: the journaled request again, with the idempotency key the upstream honours."""
        assert self._client is not None
        if not policy.inject_idempotency_key or not receipt.idempotency_key:
            raise UnreadableRule("resend_with_key needs a host with inject_idempotency_key and a journaled key")
        body = receipt.request_body or b""
        query_values = [v for _k, v in parse_qsl(receipt.query or "", keep_blank_values=True)]
        if receipt.request_body_truncated or REDACTED.encode() in body or REDACTED in query_values:
            raise UnreadableRule("the journaled request is truncated or redacted, so it cannot be re-sent exactly")
        if receipt.body_note and "multipart" in receipt.body_note:
            raise UnreadableRule("multipart bodies are journaled as digests and cannot be re-sent")
        key_header = policy.idempotency_key_header.lower()
        headers = {
            k: v
            for k, v in (receipt.request_headers or {}).items()
            if v != REDACTED and k.lower() not in HOP_BY_HOP and k.lower() not in ("host", "content-encoding", key_header)
        }
        headers.update(expand_env(rule.headers))
        headers[policy.idempotency_key_header] = receipt.idempotency_key
        url = f"{receipt.scheme}://{netloc_of(receipt)}{receipt.path}" + (f"?{receipt.query}" if receipt.query else "")
        await self.limiter.wait(receipt.host)
        started = time.monotonic()
        evidence: dict[str, Any] = {"resend": {"method": receipt.method, "url": url, "idempotency_key": receipt.idempotency_key}}
        try:
            response = await self._client.request(receipt.method, url, headers=headers, content=body, timeout=rule.timeout)
        except Exception as e:  # see _get
            evidence["resend"].update(error=f"{type(e).__name__}: {e}"[:300], elapsed_ms=_ms(started))
            return ReadOutcome("failed", evidence)
        evidence["resend"].update(status=response.status_code, elapsed_ms=_ms(started))
        if response.is_success:
            found = _external_id(response, op)
            return ReadOutcome("present", {**evidence, "matched_id": found}, found)
        if response.status_code in policy.unknown_statuses or response.status_code in (408, 409, 425, 429):
            return ReadOutcome("failed", evidence)
        evidence["reason"] = f"the upstream refused the re-send with {response.status_code}"
        return ReadOutcome("refused", evidence)


def _external_id(response: httpx.Response, op: OperationRule) -> str | None:
    if op.external_id is None:
        return None
    if op.external_id.lower().startswith("header:"):
        return response.headers.get(op.external_id.split(":", 1)[1].strip())
    found = compile_jsonpath(op.external_id).first(_json(response))
    return None if found is None else str(found)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, UnicodeDecodeError):
        return None


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def run_reconcile(config: ReceiptsConfig, store: ReceiptStore, once: bool) -> int:
    """Entry point of `receipts reconcile --once | --loop`."""
    from proxy_addon.log import configure_logging

    configure_logging(config.logging.level, config.logging.format)
    reconciler = Reconciler(config, store)
    if once:
        report = asyncio.run(reconciler.run_once())
        print(report.summary())
        return 0
    try:
        asyncio.run(reconciler.run_forever())
    except KeyboardInterrupt:
        pass
    return 0
