"""Helpers shared by the Typer commands."""
from __future__ import annotations

import contextlib
import inspect
import math
import os
import signal
import threading
from functools import lru_cache
from typing import Any, Iterable, List, Optional

import typer
from typer.core import TyperCommand, TyperGroup
from typer.models import DefaultPlaceholder

# click's UsageError as Typer raises and catches it: recent Typer releases carry their own copy
# of click, whose exceptions are not click's; typer.BadParameter derives from it either way
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def given(ctx: typer.Context, *names: str) -> List[str]:
    """The options among ``names`` (parameter names) that the command line gives, spelled as in
    --help (``"--kinds"``): "was it given", never "does it differ from its default"."""
    opts = {p.name: p.opts[0] for p in ctx.command.params}
    # by name: recent Typer releases carry their own copy of click, whose ParameterSource is not click's
    return [opts[n] for n in names if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]


def refuse_given(ctx: typer.Context, names: List[str], why: str) -> None:
    """Exit 2 naming the options among ``names`` that the command line gives, as in
    ``--rails applies to the RDMA bed only (add --rdma)`` (``why``: "to the RDMA bed only (add
    --rdma)"): an option is never ignored without a word. A usage error, not "Invalid value for
    <option>": the option refused is the one given, not the one whose absence refuses it."""
    g = given(ctx, *names)
    if g:
        raise _UsageError(f"{', '.join(g)} appl{'ies' if len(g) == 1 else 'y'} {why}", ctx=ctx)


def refuse_combined(ctx: typer.Context, name: str, others: List[str], why: str) -> None:
    """Exit 2 when the command line gives option ``name`` together with any of ``others``
    (parameter names) that contradicts it, naming them all, as in ``--json cannot be combined
    with --markdown: <why>``: neither is dropped without a word."""
    if given(ctx, name):
        g = given(ctx, *others)
        if g:
            raise typer.BadParameter(f"{', '.join(g)} cannot be combined with {given(ctx, name)[0]}: {why}")


#: exit statuses of a run ended by a signal that unwinds (128 + the signal's number)
SIGNAL_EXITS = {128 + signal.SIGHUP: "SIGHUP", 128 + signal.SIGINT: "SIGINT", 128 + signal.SIGTERM: "SIGTERM"}


@contextlib.contextmanager
def signals_unwind():
    """While inside: SIGTERM and SIGHUP (a closed SSH session) raise ``SystemExit(128 + sig)``
    in the main thread, as SIGINT raises KeyboardInterrupt, so ``with``/``finally`` blocks run
    and a long command can keep what it measured, between test beds as well as inside one (a
    test bed installs the same while it is up). Only where the signal has its default action;
    the previous handlers are restored on exit. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    pid = os.getpid()

    def unwind(sig: int, frame: Any) -> None:
        if os.getpid() != pid:
            # a forked child (pyroute2 forks helpers and stops them with SIGTERM) inherited the
            # handler: unwinding would run the parent's cleanup in the child; die as by default
            os._exit(128 + sig)
        raise SystemExit(128 + sig)
    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            old[sig] = signal.signal(sig, unwind)
    try:
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)


def finite(value: Optional[float]) -> Optional[float]:
    """Typer callback of a float option: refuses nan and inf (exit 2, naming the option), which
    a range (``min=``) lets through; None (not given) passes."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number.")
    return value


def positive(value: Optional[float]) -> Optional[float]:
    """Typer callback of a float option that must be finite and > 0 (a duration): the open
    bound that ``min=`` (x >= min) cannot express. None (not given) passes."""
    if finite(value) is not None and value <= 0:
        raise typer.BadParameter(f"{value:g} is not in the range x>0.")
    return value


def out_dir_problem(out: "os.PathLike[str] | str") -> Optional[str]:
    """Creates the output directory ``out`` (parents too) if missing and says what keeps a
    command from writing its results there: a path that exists and is not a directory, one that
    cannot be created (e.g. under /proc), one that is read-only or not writable. None when it
    can be used. Checked before a test bed is built, so that a bad ``--out`` costs no bed and
    ends in no traceback."""
    from pathlib import Path
    out = Path(out)
    if out.exists() and not out.is_dir():
        return f"{out} exists and is not a directory; give a directory (it is created if missing)"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot create the output directory {out}: {e.strerror or e} (give a directory; it is created if missing)"
    if not os.access(out, os.W_OK | os.X_OK):
        try:
            ro = bool(os.statvfs(out).f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        return f"cannot write into {out}: {'read-only file system' if ro else 'permission denied'}"
    return None


def csv_list(value: str, option: str) -> List[str]:
    """A comma-list option's items (blanks dropped); typer.BadParameter naming ``option`` when
    none is left (``""``, ``",,"``): an empty list is refused, never read as "all" or "none"."""
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise typer.BadParameter(f"{value!r}: empty list; give a comma list of one or more values", param_hint=option)
    return items


def plugin_range(variable: str):
    """Typer callback of an int option that the run passes to the plugin as ``variable``
    (``RAILOVER_HOLD_DOWN_MS``): refuses (exit 2, naming the option) a value outside the
    range of the plugin's parameter table (``railover env --list``), before anything is built.
    Passes when the plugin cannot be loaded (the run reports that itself)."""
    def check(value: Optional[int]) -> Optional[int]:
        if value is None:
            return value
        try:
            from railover import params
            p = next((x for x in params.params() if x["name"] == variable), None)
        except (OSError, ValueError):
            return value
        if p is not None and "lo" in p and "hi" in p and not p["lo"] <= value <= p["hi"]:
            raise typer.BadParameter(f"{value} is not in the range {p['lo']}..{p['hi']} of {variable} "
                                     "(railover env --list)")
        return value
    return check


def _reflow(doc: str) -> str:
    """A docstring as help text: each paragraph joined into one line (the terminal wraps it;
    rich keeps the docstring's line breaks in every paragraph but the first), except a
    paragraph that starts with ``\\b`` (click's "keep as written")."""
    paras = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
                       for p in paras)


def _tidy_params(params: Iterable[Any]) -> None:
    """How --help shows each option: a flag (it takes no value) without a type, where recent
    Typer releases show ``<bool>``; a default that is a comma list as that list with spaces
    after the commas (``a, b``: it wraps in a narrow terminal instead of being cut with an
    ellipsis), without the parentheses of a descriptive default, which read as a Python tuple
    (``(a, b)``)."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        d = getattr(p, "default", None)
        if getattr(p, "show_default", None) is True and isinstance(d, str) and "," in d:
            shown = ", ".join(x.strip() for x in d.split(","))
            # Typer's hook for the text of a default (its rich help and its plain help use it)
            p._get_default_string = lambda *a, _shown=shown, **k: _shown


class _TidyHelp:
    """Mixin of railover's Typer commands and groups: their --help shows the options as
    :func:`_tidy_params` says."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _tidy_params(self.get_params(ctx))  # type: ignore[attr-defined]
        return super().format_help(ctx, formatter)  # type: ignore[misc]


@lru_cache(maxsize=None)
def _tidy_class(base: type) -> type:
    return base if issubclass(base, _TidyHelp) else type(f"Tidy{base.__name__}", (_TidyHelp, base), {})


def _tidy_cls(cls: Any, default: type) -> type:
    return _tidy_class(default if cls is None or isinstance(cls, DefaultPlaceholder) else cls)


def tidy_help(app: typer.Typer) -> None:
    """Prepare the --help of ``app``, its commands and its sub-apps: docstrings reflowed
    (:func:`_reflow`), options shown as :func:`_tidy_params` says."""
    app.info.cls = _tidy_cls(app.info.cls, TyperGroup)
    for info in app.registered_commands:
        info.cls = _tidy_cls(info.cls, TyperCommand)
        cb = info.callback
        if cb is not None and info.help is None and cb.__doc__:
            info.help = _reflow(cb.__doc__)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            tidy_help(group.typer_instance)
