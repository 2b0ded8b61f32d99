"""Every option of every command declared once (convert.format.options): each numeric one range-checked as it is
parsed, refused in one line with status 2; every default shown in the help from its declaration; byte counts read
alike everywhere.

The options are found from the commands' parsers, not listed here, so an option added later is checked by being
there.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

import pytest

from convert import cli, tools
from convert.format import BACKENDS
from convert.format.lmdb.options import DEFAULT_MAP_SIZE, LmdbOptions
from convert.format.options import RESUME_FREE, Setting, option_from, settings
from convert.format.units import MAX_BYTES, in_units
from convert.options import ConvertOptions, DemoOptions, InspectOptions
from convert.store.cache import CacheSettings
from train import args as train_args
from train import demo as train_demo
from train import evalcmd
from train.config import TrainConfig
from train.main import main as train_main

DECLARED = [TrainConfig, evalcmd.EvalOptions, ConvertOptions, InspectOptions, DemoOptions, CacheSettings,
            *(b.options for b in BACKENDS.values())]
# Settings of the shard cache that no command offers (a library caller's, open_clips(url, cache=...)).
LIBRARY_ONLY = {"--cache-prefetch", "--cache-downloads", "--cache-attempts", "--cache-backoff", "--cache-wait"}


def _convert_main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as stop:  # convert's parsers exit with status 2 themselves
        return int(stop.code or 0)


# name -> (its parser, the arguments before the option under test, its entry point)
COMMANDS: dict[str, tuple[Callable[[], argparse.ArgumentParser], list[str], Callable[[list[str]], int]]] = {
    "python -m convert": (cli.build_parser, ["{tmp}", "{tmp}/out"], _convert_main),
    "python -m convert verify": (lambda: tools.build_parser("verify"), ["verify", "{tmp}"], _convert_main),
    "python -m convert inspect": (lambda: tools.build_parser("inspect"), ["inspect", "{tmp}"], _convert_main),
    "python -m convert demo": (lambda: tools.build_parser("demo"), ["demo", "--out", "{tmp}/out"], _convert_main),
    "python -m train": (train_args.build_parser, ["--data", "{tmp}/nowhere", "--out", "{tmp}/out"], train_main),
    "python -m train eval": (evalcmd.build_parser, ["--checkpoint", "{tmp}/c.pt", "--data", "{tmp}/nowhere"],
                             evalcmd.main),
    "python -m train demo": (train_demo.build_parser, ["--out", "{tmp}/out"], train_demo.main),
}


def _declared(action: argparse.Action) -> Setting | None:
    """The declaration an option was made from: the Setting whose ``parse`` is its type."""
    owner = getattr(action.type, "__self__", None)
    return owner if isinstance(owner, Setting) else None


def _options(command: str) -> list[argparse.Action]:
    return [a for a in COMMANDS[command][0]()._actions if a.option_strings and a.dest != "help"]


NUMERIC = [(command, action.option_strings[0]) for command in COMMANDS for action in _options(command)
           if (s := _declared(action)) is not None and s.numeric]


def _bad_values(s: Setting) -> list[str]:
    """Values ``s`` must refuse: not a number, below its lower bound, above its upper bound, not finite."""
    o = s.option
    low = o.ge if o.ge is not None else o.gt
    assert low is not None, f"{s.flag} has no lower bound"
    step = 1 if s.kind is int else 0.5
    bad = ["x", str(int(low - step) if s.kind is int else low - step) if o.ge is not None else str(low)]
    high = o.le if o.le is not None else o.lt
    if high is not None:
        bad.append(str(int(high + step) if s.kind is int else high + step) if o.le is not None else str(high))
    if s.kind is float:
        bad += ["nan", "inf", "-inf"]
    return bad


def test_every_option_of_every_command_comes_from_a_declaration():
    names = {s.name for cls in DECLARED for s in settings(cls).values()} | set(cli.store_flags())
    for command in COMMANDS:
        for action in _options(command):
            valued = not isinstance(action, (argparse._StoreTrueAction, argparse._StoreConstAction,
                                             argparse.BooleanOptionalAction))
            assert (_declared(action) is not None) if valued else action.dest in names, \
                f"{command} {action.option_strings[0]} is not made from a declaration"


def test_every_numeric_option_is_offered_by_a_command_or_checked_by_its_owner():
    offered = {_declared(a) for command in COMMANDS for a in _options(command)}
    for cls in DECLARED:
        for s in settings(cls).values():
            if s.option.group is None or not s.numeric:
                continue
            if s in offered:
                continue
            assert s.flag in LIBRARY_ONLY, f"{s.flag} ({cls.__name__}) is on no command line"
            for text in _bad_values(s)[1:]:  # a library caller gives numbers, not text
                with pytest.raises(ValueError) as err:
                    cls(**{s.name: float(text) if s.kind is float else int(float(text))})
                assert str(err.value).startswith(f"{s.flag} must be ") and "\n" not in str(err.value)


@pytest.mark.parametrize("command, flag", NUMERIC, ids=[f"{c[10:]} {f}" for c, f in NUMERIC])
def test_every_numeric_option_is_range_checked_as_it_is_parsed(tmp_path, capfd, command, flag):
    """Every numeric option of every command, found from its parser: a value out of its range (or not finite,
    or no number) is one line with status 2, naming the option, before any work."""
    build, before, entry = COMMANDS[command]
    action = next(a for a in _options(command) if a.option_strings[0] == flag)
    s = _declared(action)
    assert s is not None
    argv = [a.format(tmp=tmp_path) for a in before]
    for text in _bad_values(s):
        assert entry([*argv, f"{flag}={text}"]) == 2, (flag, text)
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and f"error: argument {flag}: " in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
    # Each bound itself is allowed (a range check, not an off-by-one).
    o = s.option
    for bound in (o.ge, o.le):
        if bound is not None and math.isfinite(bound):
            text = str(int(bound)) if s.kind is int else repr(float(bound))
            assert s.parse(text) == bound


def test_every_default_is_shown_from_its_declaration():
    """A help states no default by hand; the help shown appends the declared one, and every command's --help
    shows it."""
    for cls in DECLARED:
        for s in settings(cls).values():
            shown = s.shown(s.option.default)
            if s.option.group is None or shown is None:
                continue
            assert f"default {shown}" not in str(s.option.help), f"{s.flag}: a default written by hand"
            assert s.help_text().endswith(f"(default {shown})")
    for command in COMMANDS:
        parser = COMMANDS[command][0]()
        text = "".join(parser.format_help().split())
        for action in _options(command):
            declared = _declared(action)
            if declared is not None and action.help:
                assert "".join(action.help.replace("%%", "%").split()) in text


def test_byte_counts_are_read_by_one_parser_everywhere():
    found = 0
    for command in COMMANDS:
        for action in _options(command):
            s = _declared(action)
            if s is None or not s.option.byte_count:
                continue
            found += 1
            parse = s.parse  # the option's type (``_declared`` found it so)
            assert parse("200G") == 200 << 30 and parse("1.5GiB") == 3 << 29
            with pytest.raises(argparse.ArgumentTypeError, match=r"expected a byte count like 512M or 200G, got "
                                                                   r"'2 gallons'"):
                parse("2 gallons")
    assert found >= 6  # --max-memory, --map-size, --part-size, the trainer's, eval's, verify's --cache-limit...


def test_the_lmdb_map_size_default_is_written_once():
    """``--map-size``'s help said "without it 64M" by hand while the writer opened with its own constant: the
    declared default is the constant, shown from the declaration, and what an LmdbOptions() opens with."""
    s = settings(LmdbOptions)["map_size"]
    assert LmdbOptions().map_size == s.option.default == DEFAULT_MAP_SIZE
    shown = in_units(DEFAULT_MAP_SIZE)
    action = next(a for a in _options("python -m convert") if "--map-size" in a.option_strings)
    assert str(action.help).endswith(f"(default {shown})") and str(action.help).count(shown) == 1


def test_an_option_two_settings_classes_hold_is_one_declaration():
    """``--cache-dir`` and ``--cache-limit`` were declared on the trainer's TrainConfig and on CacheSettings,
    the trainer's copy without the upper bound: the trainer reuses CacheSettings' declarations, so every
    command offering them takes and refuses the same values, with its own group, help words and resume rule
    layered over."""
    cache = settings(CacheSettings)
    roots: dict[str, set[int]] = {}
    for command in COMMANDS:
        for action in _options(command):
            s = _declared(action)
            if s is not None and s.flag in ("--cache-dir", "--cache-limit"):
                roots.setdefault(s.flag, set()).add(id(s.option.base or s.option))
    assert roots == {"--cache-dir": {id(cache["cache_dir"].option)}, "--cache-limit": {id(cache["limit"].option)}}
    for cls in DECLARED:
        for s in settings(cls).values():
            base = s.option.base
            if base is None:
                continue
            assert base.base is None and base.group is not None
            # Everything but where it is shown, what the command adds to its help, and the resume rule is the
            # declaration's.
            kept = dataclasses.replace(s.option, group=base.group, help=base.help, added_later=base.added_later,
                                       on_resume=base.on_resume, base=None)
            assert kept == base and str(s.option.help).startswith(str(base.help)), f"{cls.__name__}.{s.name}"
    trainer = settings(TrainConfig)
    assert (trainer["cache_limit"].option.le, trainer["cache_limit"].option.ge) == (MAX_BYTES, 1)
    assert {name: (trainer[name].option.on_resume, trainer[name].option.added_later)
            for name in ("cache_dir", "cache_limit")} == {"cache_dir": (RESUME_FREE, None),
                                                          "cache_limit": (RESUME_FREE, None)}
    # The demo's --codec is the converter's (it was declared twice, with its own words).
    assert settings(DemoOptions)["codec"].option.base is settings(ConvertOptions)["codec"].option
    with pytest.raises(TypeError, match="declares no option 'nope'"):
        option_from(CacheSettings, "nope", group="data")
    with pytest.raises(TypeError, match="reuses a declaration itself"):
        option_from(TrainConfig, "cache_limit", group="data")
