"""mitmproxy's hook dispatch for `receipts proxy`: the same calls in the same order, at a fraction of the cost.

mitmproxy calls every hook (a request's `requestheaders`, `request`, `responseheaders`, `response`, and an
`update` after each) on every addon of its chain, some forty of them, each time through a coroutine
(`invoke_addon`), a generator over the addon and its children (`_iter_hooks`, `traverse`), a context manager
that logs its errors (`safecall`) and `dataclasses.fields` for the hook's arguments, whether or not the addon
has that hook at all. Profiled under load, that machinery was a quarter of the proxy's CPU per journaled write
(about 0.6 ms of 2.65 ms at concurrency 32), as much as mitmdump spends on it in all.

`QuickDispatch.trigger_event` goes below that for the addons without children (all of them but mitmproxy's
script loader): it calls only the addons that have the hook (found once per hook while the chain is the same),
reads the hook's arguments once per event, and enters the error handling only when a hook raises. It keeps what mitmproxy's does: the chain's order, an `AddonHalt` stops the event, an
`OptionsError` propagates, any other error is logged by mitmproxy's `safecall` and the next addon is called,
an async hook is awaited, a module named like a hook is skipped, anything else not callable is an error. An
addon with children goes through mitmproxy's own `invoke_addon`. `mitmdump -s` keeps mitmproxy's dispatch.
"""

import dataclasses
import inspect
import types
from collections.abc import Awaitable
from typing import Any

from mitmproxy import exceptions, flow, hooks
from mitmproxy.addonmanager import AddonManager, safecall
from mitmproxy.master import Master

_ARG_NAMES: dict[type[hooks.Hook], tuple[str, ...]] = {}


class QuickDispatch(AddonManager):
    """mitmproxy's AddonManager with `trigger_event` (and `handle_lifecycle`, which calls it) made cheap."""

    # the chain and its length when the addons with each hook were found, and what was found
    _found: tuple[list[Any], int, dict[str, tuple[Any, ...]]] | None = None

    async def trigger_event(self, event: hooks.Hook) -> None:
        name = event.name
        args: list[Any] | None = None  # read once per event: a hook is given the event's values, never the event
        for addon in self._addons_for(name):
            try:
                if getattr(addon, "addons", None):  # children (the script loader's scripts): mitmproxy's own walk
                    with safecall():
                        await self.invoke_addon(addon, event)
                elif hook := getattr(addon, name, None):
                    args = hook_args(event) if args is None else args
                    await _invoke(addon, hook, event, args)
            except exceptions.AddonHalt:
                return

    def _addons_for(self, name: str) -> tuple[Any, ...]:
        """The chain's addons with this hook, or with children (whose scripts come and go), in the chain's order.

        Found once per hook for as long as the chain holds the same addons: `add` appends to the list, `remove`
        and `clear` replace it. Looking for every hook on every addon for every event was most of what was left
        of the dispatch's cost (some forty addons, eight events per write, few of them with the hook). An addon
        that would give itself a hook after it was added is not called for it; none of mitmproxy's does.
        """
        chain = self.chain
        if self._found is None or self._found[0] is not chain or self._found[1] != len(chain):
            self._found = (chain, len(chain), {})
        hooked = self._found[2]
        found = hooked.get(name)
        if found is None:
            found = hooked[name] = tuple(a for a in chain if hasattr(a, "addons") or getattr(a, name, None) is not None)
        return found

    async def handle_lifecycle(self, event: hooks.Hook) -> None:
        message = hook_args(event)[0]
        await self.trigger_event(event)
        if isinstance(message, flow.Flow):
            await self.trigger_event(hooks.UpdateHook([message]))


def use_quick_dispatch(master: Master) -> None:
    """Make this master's addon manager a QuickDispatch (it adds no state: only the two methods differ)."""
    master.addons.__class__ = QuickDispatch


async def _invoke(addon: Any, hook: Any, event: hooks.Hook, args: list[Any]) -> None:
    """One addon's hook, its error logged as mitmproxy's `safecall` logs it (AddonHalt, OptionsError raised)."""
    try:
        result = _call(addon, hook, event, args)
        if result is not None:
            await result
    except Exception:
        with safecall():
            raise


def _call(addon: Any, hook: Any, event: hooks.Hook, args: list[Any]) -> Awaitable[Any] | None:
    """Call the hook; what is left to await of it, if anything (mitmproxy's `_iter_hooks` and `invoke_addon`)."""
    if not callable(hook):
        if isinstance(hook, types.ModuleType):  # `from mitmproxy import log` in an addon is no `log` hook
            return None
        raise exceptions.AddonManagerError(f"Addon handler {event.name} ({addon}) not callable")
    result = hook(*args)
    return result if result is not None and inspect.isawaitable(result) else None


def hook_args(event: hooks.Hook) -> list[Any]:
    """`event.args()`, without `dataclasses.fields` on every call: the field names are read once per hook type."""
    kind = type(event)
    if kind.args is not hooks.Hook.args:
        return event.args()
    names = _ARG_NAMES.get(kind)
    if names is None:
        names = _ARG_NAMES[kind] = tuple(f.name for f in dataclasses.fields(event))  # type: ignore[arg-type]
    return [getattr(event, n) for n in names]
