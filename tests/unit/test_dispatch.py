"""QuickDispatch calls what mitmproxy's AddonManager calls, in the same order, with the same outcome of an
error: each scenario runs through both and the calls are compared."""

import asyncio
import logging
from typing import Any

import pytest
from mitmproxy import exceptions, hooks, log, options
from mitmproxy.master import Master
from mitmproxy.proxy.layers.http import HttpRequestHook
from mitmproxy.test import tflow

from proxy_addon.addons.dispatch import QuickDispatch, hook_args, use_quick_dispatch


class Recorder:
    def __init__(self, name: str, calls: list[str], raises: BaseException | None = None):
        self.name, self.calls, self.raises = name, calls, raises

    def request(self, flow: Any) -> None:
        self.calls.append(f"{self.name}.request")
        if self.raises is not None:
            raise self.raises

    def update(self, flows: Any) -> None:
        self.calls.append(f"{self.name}.update({len(flows)})")


class AsyncRecorder(Recorder):
    async def request(self, flow: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.calls.append(f"{self.name}.request (async)")


class Parent(Recorder):
    """An addon with children, as mitmproxy's script loader is."""

    def __init__(self, name: str, calls: list[str], children: list[Any]):
        super().__init__(name, calls)
        self.addons = children


class NotCallable:
    request = "not a hook"

    def __repr__(self) -> str:
        return "NotCallable"  # the same in both runs' error lines


class ModuleNamedLikeAHook:
    log = log  # `from mitmproxy import log`: no `log` hook


def run(quick: bool, make: Any) -> tuple[list[str], list[str]]:
    """The calls a request's lifecycle event makes, and mitmproxy's error lines, with either manager."""
    calls: list[str] = []
    errors: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            errors.append(record.getMessage())

    async def go() -> None:
        master = Master(options.Options())
        if quick:
            use_quick_dispatch(master)
        master.addons.add(*make(calls))
        handler = Catch(logging.ERROR)
        logging.getLogger("mitmproxy.addonmanager").addHandler(handler)
        try:
            await master.addons.handle_lifecycle(HttpRequestHook(tflow.tflow()))
        finally:
            logging.getLogger("mitmproxy.addonmanager").removeHandler(handler)
            master._legacy_log_events.uninstall()  # its handler would outlive this event loop

    asyncio.run(go())
    return calls, errors


SCENARIOS = {
    "order, async hooks, update after the flow's event": lambda c: [
        Recorder("a", c), AsyncRecorder("b", c), Recorder("c", c)],
    "an error is logged and the next addon is called": lambda c: [
        Recorder("a", c, ValueError("boom")), Recorder("b", c)],
    "AddonHalt stops the event": lambda c: [Recorder("a", c, exceptions.AddonHalt()), Recorder("b", c)],
    "children after their parent": lambda c: [
        Parent("p", c, [Recorder("child", c), AsyncRecorder("async child", c)]), Recorder("b", c)],
    "a module named like a hook is skipped, anything else not callable is an error": lambda c: [
        ModuleNamedLikeAHook(), NotCallable(), Recorder("b", c)],
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_quick_dispatch_calls_what_mitmproxy_calls(scenario: str) -> None:
    make = SCENARIOS[scenario]
    assert run(quick=True, make=make) == run(quick=False, make=make)


def test_quick_dispatch_raises_an_options_error_as_mitmproxy_does() -> None:
    for quick in (True, False):
        with pytest.raises(exceptions.OptionsError):
            run(quick, lambda c: [Recorder("a", c, exceptions.OptionsError("bad"))])


def test_hook_args_are_the_hooks_own() -> None:
    flow = tflow.tflow()
    for event in (HttpRequestHook(flow), hooks.UpdateHook([flow]), hooks.ConfigureHook({"x"})):
        assert hook_args(event) == event.args()


def test_the_master_keeps_its_addons() -> None:
    async def go() -> None:
        master = Master(options.Options())
        before = list(master.addons.chain)
        use_quick_dispatch(master)
        master._legacy_log_events.uninstall()
        assert isinstance(master.addons, QuickDispatch) and master.addons.chain == before

    asyncio.run(go())


def test_addons_added_and_removed_later_are_seen() -> None:
    """The addons with a hook are found once per chain: an addon added or removed after, or a child given to an
    addon with children (a script loaded), changes what the next event calls."""
    calls: list[str] = []

    async def go() -> None:
        master = Master(options.Options())
        use_quick_dispatch(master)
        first, parent = Recorder("first", calls), Parent("parent", calls, [])
        master.addons.add(first, parent)
        event = HttpRequestHook(tflow.tflow())
        await master.addons.trigger_event(event)
        later = Recorder("later", calls)
        master.addons.add(later)
        parent.addons.append(Recorder("script", calls))
        await master.addons.trigger_event(event)
        master.addons.remove(first)
        await master.addons.trigger_event(event)
        master._legacy_log_events.uninstall()

    asyncio.run(go())
    assert calls == [
        "first.request", "parent.request",
        "first.request", "parent.request", "script.request", "later.request",
        "parent.request", "script.request", "later.request",
    ]
