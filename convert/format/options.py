"""Each setting declared once: the field of a frozen dataclass, with its command-line form and checks.

Every option of the project is declared here, the same way: the trainer's
(``train.config.TrainConfig``), ``python -m convert``'s and its sub-commands'
(``convert.options``), each backend's writing options (``LmdbOptions``,
``TFRecordOptions``) and the shard cache's settings (``CacheSettings``). A field
such as::

    crop_size: int = option("data", "square crop fed to the model", default=112, ge=1)

is all there is of ``--crop-size``. ``add_options`` makes the argparse option
from it: the flag from the field's name (or ``flag=``), the type from its
annotation (a ``bool`` is a switch), the help with the declared default
appended, in the named argument group; a number is checked as it is parsed
(finite, within ``ge``/``gt``/``le``/``lt``), and a byte count (``200G``) is read
by the one parser, ``convert.format.units.parse_bytes``, so a bad value stops
the command line in one line before any work. ``check_settings`` checks a built
object against the same declarations (``None`` only where the annotation
allows it), raising the caller's error type. For the trainer's checkpoints,
``added_later`` gives the value that checkpoints written before a setting
existed load with, and ``on_resume`` what a resumed run may do with a setting
the checkpoint has another value of (``RESUME_RULES``). Settings that are on no
command line (``derived``) are checked the same way. An option that two
settings classes hold (the shard cache's ``--cache-limit``, a setting of the
trainer's run too) is declared on one, and the other's field reuses that
declaration (``option_from``) with its own group, extra help words and
resume rule.

Every command parses with ``OneLineParser``: a usage error is one line, and
the caller picks whether it raises or exits. Nothing here imports above the
format layer, so both sides may use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .units import MAX_BYTES, in_units, parse_bytes


class OptionError(ValueError):
    """A value a declaration does not allow; the message is one line naming the option."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``MESSAGE (see PROG --help)``, with a mistyped option named
    together with the closest one there is; every command of the project (convert's and train's) parses with it.

    ``raise_as``: the caller's error policy. An exception type: the parser
    raises it with the line, and the entry point prints it and exits with
    status 2 (the trainer: ``TrainError``). None (the default): the parser
    prints ``PROG: error: LINE`` to stderr and exits with status 2 itself.
    """

    def __init__(self, *args: Any, raise_as: type[Exception] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raise_as = raise_as

    def error(self, message: str) -> NoReturn:
        line = f"{message} (see {self.prog} --help)"
        if self.raise_as is not None:
            raise self.raise_as(line)
        self.exit(2, f"{self.prog}: error: {line}\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(self.unrecognized(extra))
        return parsed

    def unrecognized(self, extra: Sequence[str]) -> str:
        """The message for arguments no option took: the first unknown option and the closest known one."""
        unknown = next((a.split("=", 1)[0] for a in extra if a.startswith("-") and not _is_number(a)), None)
        if unknown is None:
            return f"unrecognized arguments: {' '.join(extra)}"
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        close = difflib.get_close_matches(unknown, known, n=1, cutoff=0.6)
        return f"unrecognized option {unknown}" + (f"; did you mean {close[0]}?" if close else "")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _Unset:
    """The marker of a declaration without ``added_later``."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
_KEY = "videoclips.option"  # the dataclass field metadata key of a declaration

# What --resume does when this run's value of a setting differs from the checkpoint's (Option.on_resume).
RESUME_SHAPE = "shape"  # decides the shapes of the weights or the optimizer state: refused, nothing can override it
RESUME_DATA = "data"  # decides which clips an epoch holds, in which order: refused unless --force-resume
RESUME_SAY = "say"  # allowed, printed as "changed since the checkpoint"
RESUME_FREE = "free"  # how this process runs (where it logs, how long, how many threads): not compared
RESUME_RULES = (RESUME_SHAPE, RESUME_DATA, RESUME_SAY, RESUME_FREE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Option:
    """How one setting is given and what it may be; see ``option`` for the fields."""

    group: str | None  # None: on no command line (derived by the run, or a library setting)
    help: str | None
    default: Any = None
    choices: tuple[Any, ...] = ()
    words: tuple[str, ...] = ()
    byte_count: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    exclusive: str | None = None
    also: tuple[tuple[str, Any, str], ...] = ()
    metavar: str | None = None
    required: bool = False
    flag: str | None = None
    parse: Callable[[str], Any] | None = None
    added_later: Any = UNSET
    on_resume: str = RESUME_SAY
    base: Option | None = None  # the declaration this one reuses (option_from), or None: declared here

    def __post_init__(self) -> None:
        if (self.ge is not None and self.gt is not None) or (self.le is not None and self.lt is not None):
            raise TypeError("a bound is ge or gt (le or lt), not both")
        if self.on_resume not in RESUME_RULES:
            raise TypeError(f"on_resume is one of {', '.join(RESUME_RULES)}, not {self.on_resume!r}")
        if (self.group is None) != (self.help is None):
            raise TypeError("an option has a group and a help text; a setting on no command line neither")


def option(group: str, help: str, *, default: Any = None, choices: Sequence[Any] = (),
           words: Sequence[str] = (), byte_count: bool = False, ge: float | None = None,
           gt: float | None = None, le: float | None = None, lt: float | None = None, exclusive: str | None = None,
           also: Sequence[tuple[str, Any, str]] = (), metavar: str | None = None, required: bool = False,
           flag: str | None = None, parse: Callable[[str], Any] | None = None, field_default: bool = False,
           added_later: Any = UNSET, on_resume: str = RESUME_SAY) -> Any:
    """A dataclass field that is also the option ``--NAME`` in argument group ``group``.

    ``help`` says what the option does, never its default: the help shown
    appends ``default`` (None: no default to show; the help then says in words
    what happens without it, e.g. the value is taken from the machine or the
    data); ``choices`` the names allowed; ``byte_count``: an integer given as
    bytes with an optional unit (``200G``, ``512M``: ``parse_bytes``, as every
    command takes them); ``words`` what the command line takes besides a number
    (``auto``, which the owner interprets); ``ge``/``gt``/``le``/``lt`` the
    bounds of a number; options of one ``exclusive`` name are given at most one
    at a time; ``also`` extra flags that store a constant (flag, value, help);
    ``flag`` the command line's name when it is not ``--`` + the field's;
    ``parse`` the command line's reader when the text is no plain number or
    name (its ArgumentTypeError is the usage error). ``field_default``: the
    dataclass field defaults to ``default`` too (a settings object built
    without it gets the command line's default); otherwise the field is
    required. ``added_later``: the setting is newer than some checkpoints, which
    load with this value (the one that does what runs before it did).
    ``on_resume``: what ``--resume`` does when the checkpoint has another value
    (``RESUME_SHAPE``, ``RESUME_DATA``, ``RESUME_SAY`` (the default) or
    ``RESUME_FREE``; see ``RESUME_RULES``).
    """
    declared = Option(group=group, help=help, default=default, choices=tuple(choices),
                      words=tuple(words), byte_count=byte_count, ge=ge, gt=gt, le=le, lt=lt,
                      exclusive=exclusive, also=tuple(also), metavar=metavar, required=required, flag=flag,
                      parse=parse, added_later=added_later, on_resume=on_resume)
    if field_default:
        return dataclasses.field(default=default, metadata={_KEY: declared})
    return dataclasses.field(metadata={_KEY: declared})


def option_from(cls: type, name: str, *, group: str, more: str = "", added_later: Any = UNSET,
                on_resume: str = RESUME_SAY) -> Any:
    """A dataclass field whose option is the one ``cls`` declares as its field ``name``, reused by another
    settings class: its flag, metavar, default, kind of value and bounds are that declaration's, so every
    command offering the option takes and refuses the same values, and the words are written once.

    What belongs to the reusing class is given here: its argument ``group``,
    ``more`` (words appended to the declaration's help, after "; ": what the
    option does there besides), and for the trainer's checkpoints
    ``added_later`` and ``on_resume`` (as for ``option``). The field is
    required (the reusing class's builder gives it); ``settings`` of the
    reusing class has it under this field's name, with the declaration it
    reuses as ``option.base``.
    """
    base = settings(cls).get(name)
    if base is None or base.option.group is None:
        raise TypeError(f"{cls.__name__} declares no option {name!r} to reuse")
    if base.option.base is not None:
        raise TypeError(f"{cls.__name__}.{name} reuses a declaration itself; reuse that one")
    declared = dataclasses.replace(base.option, group=group, help=f"{base.option.help}; {more}" if more else
                                   base.option.help, added_later=added_later, on_resume=on_resume, base=base.option)
    return dataclasses.field(metadata={_KEY: declared})


def derived(*, ge: float | None = None, added_later: Any = UNSET, flag: str | None = None,
            factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field on no command line (the run derives it, or a library caller gives it), checked like
    one: ``ge`` bounds an integer; ``added_later`` as for ``option``, and also the field's default, so that code
    building a config without knowing the setting gets what runs did before it; ``factory`` makes the field's
    default (a fresh dict). A resume does not compare it (what it follows from is compared)."""
    declared = Option(group=None, help=None, ge=ge, flag=flag, added_later=added_later, on_resume=RESUME_FREE)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={_KEY: declared})
    if added_later is UNSET:
        return dataclasses.field(metadata={_KEY: declared})
    return dataclasses.field(default=added_later, metadata={_KEY: declared})


def flag(name: str) -> str:
    """The command-line option of a setting: ``crop_size`` -> ``--crop-size``."""
    return "--" + name.replace("_", "-")


def _number(value: float) -> str:
    return f"{value:g}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setting:
    """A declared field with what its annotation says: ``kind`` (int, float, str, bool or another type, which
    is checked elsewhere) and whether it may be None (``optional``)."""

    name: str
    kind: type
    optional: bool
    option: Option

    @property
    def flag(self) -> str:
        return self.option.flag or flag(self.name)

    @property
    def numeric(self) -> bool:
        """Whether the command line gives it as a number (or a byte count)."""
        return self.kind in (int, float)

    def _bound(self, value: float) -> str:
        return in_units(int(value)) if self.option.byte_count else _number(value)

    def _bounds(self) -> str:
        o = self.option
        if self.kind is int and o.gt is None and o.lt is None and (o.le is None or o.le == MAX_BYTES):
            return "" if o.ge is None else f" >= {self._bound(o.ge)}"
        low = f"[{self._bound(o.ge)}, " if o.ge is not None else f"({self._bound(o.gt)}, " if o.gt is not None \
            else "(-inf, "
        high = f"{self._bound(o.le)}]" if o.le is not None else f"{self._bound(o.lt)})" if o.lt is not None \
            else "inf)"
        return f" in {low}{high}"

    def _in_bounds(self, value: float) -> bool:
        o = self.option
        # isfinite only for floats: a huge integer (--seed 1e400 written out) would overflow the conversion.
        finite = not isinstance(value, float) or math.isfinite(value)
        return (finite and (o.ge is None or value >= o.ge) and (o.gt is None or value > o.gt)
                and (o.le is None or value <= o.le) and (o.lt is None or value < o.lt))

    def allowed(self) -> str:
        """What a value must be, after "must be" (``an integer >= 1``, ``in [0, 1)``, ``a byte count >= 1``)."""
        if self.kind is int:
            return ("a byte count" if self.option.byte_count else "an integer") + self._bounds()
        if self.kind is float:
            return self._bounds().strip()
        return {bool: "true or false", str: "a string"}.get(self.kind, f"a {self.kind.__name__}")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this setting, after its flag; None when nothing is."""
        if value is None and self.optional:
            return None
        if self.option.choices:
            if value in self.option.choices:
                return None
            shown = ", ".join(["unset"] * self.optional + [str(c) for c in self.option.choices])
            return f"{value!r}: expected one of {shown}"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind is int:
            ok = number and isinstance(value, int) and self._in_bounds(value)
        elif self.kind is float:
            ok = number and self._in_bounds(value)
            if isinstance(value, float) and not math.isfinite(value):  # nan is in no range; say why it is refused
                return f"must be a finite number {self.allowed()}, got {value!r}"
        elif self.kind in (bool, str):
            ok = isinstance(value, self.kind)
        else:
            return None  # a structured value (the LR plan, a frame size), checked by its owner
        return None if ok else f"must be {self.allowed()}, got {value!r}"

    def check(self, value: Any, error: type[Exception] = OptionError) -> None:
        """A one-line ``error`` (the caller's type) naming the option when ``value`` is not allowed."""
        problem = self.problem(value)
        if problem is not None:
            raise error(f"{self.flag} {problem}")

    def parse(self, text: str) -> Any:
        """The command line's text as the value (argparse's ``type``): a word, a checked number, or a name."""
        o = self.option
        if text in o.words:
            return text
        if o.parse is not None:
            return o.parse(text)
        if self.kind not in (int, float):
            return text
        words = "".join(f" or {w!r}" for w in o.words)
        try:
            value = parse_bytes(text) if o.byte_count else int(text) if self.kind is int else float(text)
        except ValueError:
            if o.byte_count:
                raise argparse.ArgumentTypeError(f"expected a byte count like 512M or 200G{words}, got "
                                                 f"{text!r}") from None
            raise argparse.ArgumentTypeError(f"expected {'an integer' if self.kind is int else 'a number'}{words}, "
                                             f"got {text!r}") from None
        problem = self.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem.replace(", got ", f"{words}, got ", 1))
        return value

    def shown(self, value: Any) -> str | None:
        """``value`` as the help shows a default (``16``, ``0.003``, ``256M``, ``c3d``); None for no default."""
        if value is None or isinstance(value, bool):
            return None  # a switch is off unless given; None: the help says in words what happens
        if self.option.byte_count:
            return in_units(value)
        return _number(value) if isinstance(value, float) else str(value)

    def help_text(self, help: str | None = None, default: Any = UNSET) -> str:
        """The help shown: the declared (or given) text, then the default from the declaration (or the one
        given), so no help text states a default by hand."""
        text = self.option.help if help is None else help
        shown = self.shown(self.option.default if default is UNSET else default)
        return str(text) if shown is None else f"{text} (default {shown.replace('%', '%%')})"

    def add_to(self, container: Any, *, flags: Sequence[str] = (), help: str | None = None, default: Any = UNSET,
               choices: Sequence[Any] | None = None, dest: str | None = None) -> None:
        """Add this setting's option to an argparse parser or group; a command other than the setting's owner
        may give it other ``flags``, ``help``, ``default``, ``choices`` or ``dest`` (the checks stay the
        declaration's, and the help shows the default it is given)."""
        o = self.option
        value = o.default if default is UNSET else default
        kw: dict[str, Any] = {"dest": dest or self.name, "help": self.help_text(help, value), "default": value}
        if self.kind is bool:
            kw["action"] = argparse.BooleanOptionalAction if kw["default"] else "store_true"
        else:
            kw.update(type=self.parse, required=o.required)
            if choices is not None:
                kw["choices"] = tuple(choices)
            elif o.choices:
                kw["choices"] = o.choices
            if o.metavar:
                kw["metavar"] = o.metavar
            elif (flags or o.flag) and "choices" not in kw:  # argparse would name the value after dest
                kw["metavar"] = (flags or [self.flag])[0].lstrip("-").replace("-", "_").upper()
        container.add_argument(*(flags or [self.flag]), **kw)
        for extra, const, text in o.also:
            container.add_argument(extra, dest=kw["dest"], action="store_const", const=const, help=text)


_SETTINGS: dict[type, dict[str, Setting]] = {}


def settings(cls: type) -> dict[str, Setting]:
    """The declared fields of dataclass ``cls`` by name, in declaration order (read once per class)."""
    if cls in _SETTINGS:
        return _SETTINGS[cls]
    hints = typing.get_type_hints(cls)
    found: dict[str, Setting] = {}
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_KEY)
        if declared is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with convert.format.options.option or "
                            f"derived")
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        kinds = [typing.get_origin(a) or a for a in args if a is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"{cls.__name__}.{f.name}: annotate one type, or one type | None")
        found[f.name] = Setting(name=f.name, kind=kinds[0], optional=len(kinds) < len(args), option=declared)
    _SETTINGS[cls] = found
    return found


def check_settings(config: Any, error: type[Exception] = OptionError) -> None:
    """Every declared value of ``config`` checked, then the ``exclusive`` options (at most one of each given);
    the first problem is a one-line ``error`` (the caller's type) naming the option."""
    declared = settings(type(config))
    for s in declared.values():
        s.check(getattr(config, s.name), error)
    groups: dict[str, list[Setting]] = {}
    for s in declared.values():
        if s.option.exclusive:
            groups.setdefault(s.option.exclusive, []).append(s)
    for members in groups.values():
        if sum(getattr(config, s.name) is not None for s in members) > 1:
            raise error(f"{' and '.join(s.flag for s in members)}: give one of them")


def on_resume(cls: type, rule: str) -> tuple[str, ...]:
    """The settings of dataclass ``cls`` declared with ``on_resume=rule``, in declaration order."""
    if rule not in RESUME_RULES:
        raise TypeError(f"rule is one of {', '.join(RESUME_RULES)}, not {rule!r}")
    return tuple(name for name, s in settings(cls).items() if s.option.on_resume == rule)


def added_later(cls: type) -> dict[str, Any]:
    """The settings newer than some checkpoints, with the values such checkpoints load with."""
    return {s.name: s.option.added_later for s in settings(cls).values() if s.option.added_later is not UNSET}


def add_options(parser: argparse.ArgumentParser, cls: type) -> dict[str, Any]:
    """Every option declared on dataclass ``cls``, in its argument groups, in declaration order; returns the
    groups by name (a command may add options of its own to one)."""
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    for s in settings(cls).values():
        group = s.option.group
        if group is None:
            continue
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        target = groups[group]
        if s.option.exclusive:
            if s.option.exclusive not in exclusive:
                exclusive[s.option.exclusive] = target.add_mutually_exclusive_group()
            target = exclusive[s.option.exclusive]
        s.add_to(target)
    return groups


def byte_count(lo: int, hi: int = MAX_BYTES) -> Callable[[str], int]:
    """An argparse type: a byte count (``parse_bytes``) within ``lo..hi``, checked as a declared one is."""
    return Setting(name="bytes", kind=int, optional=False,
                   option=Option(group=None, help=None, byte_count=True, ge=lo, le=hi)).parse


__all__ = ["RESUME_DATA", "RESUME_FREE", "RESUME_RULES", "RESUME_SAY", "RESUME_SHAPE", "UNSET", "OneLineParser",
           "Option", "OptionError", "Setting", "add_options", "added_later", "byte_count", "check_settings",
           "derived", "flag", "on_resume", "option", "option_from", "settings"]
