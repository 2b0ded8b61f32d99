"""A lost connection during an upload is one line, not a hundred asyncio tracebacks: the tasks aiohttp leaves
failed and unawaited on fsspec's event loop are dropped (logged at debug level); anything else that loop
reports still reaches its default handler."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys

import pytest

from convert.store.remote import Remote, _quiet_lost_connections

from .conftest import ROOT

NEVER_RETRIEVED = "Task exception was never retrieved"


def _errors() -> list[BaseException]:
    """Failures asyncio reports as a collected task's: what ``Remote.fs``'s handler sees after a reset upload."""
    aiohttp = pytest.importorskip("aiohttp")
    return [ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError(32, "Broken pipe"),
            TimeoutError(), aiohttp.ClientOSError(104, "Can not write request body"),
            aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("Response payload is not completed")]


def _collected_failures(loop: asyncio.AbstractEventLoop, errors: list[BaseException]) -> None:
    """A task per error on ``loop`` (running in this thread), each failing unawaited and then collected."""
    async def fail(exc: BaseException) -> None:
        raise exc

    async def run() -> None:
        tasks = [loop.create_task(fail(exc)) for exc in errors]
        await asyncio.sleep(0)  # they run and fail
        await asyncio.sleep(0)
        assert all(t.done() for t in tasks)  # the test's own setup, not data
        tasks.clear()  # the last references: each is reported as it goes

    loop.run_until_complete(run())
    gc.collect()


def test_unawaited_tasks_failed_by_a_lost_connection_are_dropped_and_others_reported(caplog):
    loop = asyncio.new_event_loop()
    try:
        _quiet_lost_connections(loop)
        _quiet_lost_connections(loop)  # once per loop: a second call does not wrap the first handler
        with caplog.at_level(logging.DEBUG):
            _collected_failures(loop, _errors())
            dropped = [r for r in caplog.records if r.name == "convert.store.remote"]
            assert len(dropped) == len(_errors()) and all(r.levelno == logging.DEBUG for r in dropped)
            assert not [r for r in caplog.records if r.name == "asyncio"]
            # Not a connection's failure, or not an unawaited task: the loop's default handler says it as before.
            _collected_failures(loop, [ValueError("a bug")])
            loop.call_exception_handler({"message": "something else", "exception": ConnectionResetError()})
        reported = [r for r in caplog.records if r.name == "asyncio"]
        assert [r.getMessage().split("\n")[0] for r in reported] == [NEVER_RETRIEVED, "something else"], reported
        assert isinstance(reported[0].exc_info[1], ValueError)
    finally:
        loop.close()


def test_a_handler_the_loop_had_still_gets_what_is_not_dropped():
    seen = []
    loop = asyncio.new_event_loop()
    try:
        loop.set_exception_handler(lambda loop, context: seen.append(context["exception"]))
        _quiet_lost_connections(loop)
        _collected_failures(loop, [ConnectionResetError(), KeyError("x")])
        assert [type(e) for e in seen] == [KeyError]
    finally:
        loop.close()


# In a process of its own (what stderr shows, with no logging set up, as in ``python -m convert``): a task on
# the loop of the file system ``Remote`` made fails with a reset, unawaited, and is collected.
_ON_FSSPECS_LOOP = """
import asyncio, gc, sys, time

import aiohttp

from convert.store.remote import Remote

fs = Remote("s3://bucket/out").fs


async def fail(exc):
    raise exc


async def start(exc):
    asyncio.get_running_loop().create_task(fail(exc))  # no reference kept: collected once it has failed


for exc in (aiohttp.ClientOSError(104, "Can not write request body"), ConnectionResetError(104, "reset")):
    asyncio.run_coroutine_threadsafe(start(exc), fs.loop).result()
    time.sleep(0.2)
    gc.collect()
if len(sys.argv) > 1:  # the control: what is not a lost connection is still said
    asyncio.run_coroutine_threadsafe(start(ValueError("a bug")), fs.loop).result()
    time.sleep(0.2)
    gc.collect()
print("done", file=sys.stderr)
"""


@pytest.mark.parametrize("control", [False, True], ids=["lost-connections", "a-bug-still-said"])
def test_no_asyncio_traceback_reaches_stderr_from_remotes_file_system(control):
    pytest.importorskip("s3fs")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # never reached: nothing is requested
    got = subprocess.run([sys.executable, "-c", _ON_FSSPECS_LOOP, *(["control"] if control else [])], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    if control:
        assert got.stderr.count(NEVER_RETRIEVED) == 1 and "ValueError: a bug" in got.stderr, got.stderr
    else:
        assert got.stderr == "done\n"
