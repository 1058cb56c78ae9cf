"""Approval before a consequential write: what a rule or a host asks for, and what an approval answers. Pure.

`approval: required` (or `approval: {required: true, expires: 1h}`) on an operation rule or a host means: a
journaled write it matches is forwarded only once a person has approved that exact intent (account +
fingerprint). The decision itself is made where the receipt is created (journal/writes.py), in the same
transaction, so that an approval is used up by exactly one receipt, on any replica.

Expiry, one duration for both ends: a pending request that nobody decided within `expires` of being asked
expires (the next same request asks again); an approval may be used within `expires` of the decision; a
denial stands for `expires` after the decision (then the same request may be asked for again).
"""

from dataclasses import dataclass
from typing import Any

from pydantic import model_validator

from proxy_addon.units import PositiveDuration, StrictModel

DEFAULT_EXPIRES = 3600.0


class ApprovalSetting(StrictModel):
    """The `approval` key of a host or an operation rule: `required` (a string), a bool, or a mapping."""

    required: bool = False
    expires: PositiveDuration = DEFAULT_EXPIRES

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, data: Any) -> Any:
        if data == "required":
            return {"required": True}
        if isinstance(data, bool):
            return {"required": data}
        if isinstance(data, str):
            raise ValueError(f"approval: {data!r} is not 'required', a boolean or a mapping")
        return data


NO_APPROVAL = ApprovalSetting()


@dataclass(frozen=True, slots=True)
class ApprovalAsk:
    """A write that needs a person's approval, and for how long (seconds) a request or decision stands."""

    expires: float


def approval_for(host: ApprovalSetting | None, rule: ApprovalSetting | None) -> ApprovalAsk | None:
    """The rule's setting when it has one, else the host's; None (the usual case) when no approval is needed."""
    setting = rule if rule is not None else host
    if setting is None or not setting.required:
        return None
    return ApprovalAsk(setting.expires)
