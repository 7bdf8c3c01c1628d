"""The shared cell runner: every cell magic of the package runs its cell through here.

It takes a namespace and a :class:`Compiler`, never a shell: a magic passes what its shell
gives (:class:`ShellCompiler`: IPython's transforms, parser and compiler, the shell's
namespace), a script passes plain Python's (:class:`PythonCompiler`, a dict). What it
guarantees for a magic's cell, so that the cell behaves exactly as it would without the magic:

* IPython syntax inside the cell works: the body goes through ``shell.transform_cell``
  (``!cmd``, ``%line`` magics) and the shell's AST transformers.
* Tracebacks show the cell's own source and the line numbers the notebook shows: the
  code is compiled under a name from ``shell.compile.cache(...)`` whose text starts with
  the magic's own line, so the magic line is line 1 and the body starts at line 2.
* The last expression's value is returned, so ``Out[n]`` and a trailing ``;`` behave as
  usual (the magic is decorated with ``output_can_be_silenced``).
* Variables land in ``shell.user_ns``; nothing of the runner's is left there: the probe
  hooks live in ``builtins`` under per-run names for the duration of the run only.
* Errors stop the cell where they stop a plain cell, and are shown as IPython shows them
  (see :func:`install_syntax_error_display`). IPython parses the whole cell, then compiles
  and runs it one top-level statement at a time (``InteractiveShell.run_ast_nodes``): a
  parse error (``print(3``) or an AST transformer's ``InputRejected`` stops the cell before
  its first line; a statement that parses but does not compile (``return``, ``yield``,
  ``break``, ``continue`` outside their blocks, ``nonlocal`` at top level) stops it when
  it is reached, after the statements before it ran. So here too (see :func:`prepare`).
  One difference remains: with IPython's ``autoawait`` a plain cell may ``await`` at top
  level, as IPython runs the whole cell as a coroutine; a magic is called synchronously
  (inside the kernel's running event loop), so its cell's ``await`` is the compile error
  it is in plain Python and in a plain cell with ``%autoawait off``. IPython's own
  ``%%time`` does the same.

A measured run (``%%memtrace``, ``%%gpuprofile``): :func:`run_measured` takes the cell
through one lifecycle, start, a probe before each statement, stop, finish, show (see
:class:`MeasuredRun`). Everything a run acquires is acquired inside the region that releases
it, and Ctrl-C outside the cell's own code waits until the run's resources are released.

Instrumentation (``%%memtrace``): a probe call before each statement of the cell,
including statements inside ``for``/``while``/``if``/``with``/``try``/``match`` bodies.
There is deliberately no ``sys.settrace``: library code the cell calls runs at full speed
and a debugger keeps working. One hook, ``enter(i)``, marks "statement ``i`` starts now";
the probe closes whichever statement was running at that moment. Because a compound
statement's header is closed by the first statement of its body, and a loop's iteration
re-enters the loop's own row, at most one statement is open at any instant, and work is
never counted twice. Function and class bodies are not instrumented: a call is charged to
the statement that made it.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import functools
import itertools
import linecache
import operator
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Protocol, TypeVar

from gpumagic.instrument import SOURCE_LIMIT, Instrumenter, Statement, source_lines, units
from gpumagic.interrupts import HeldInterrupts, interruptible
from gpumagic.tracebacks import as_the_cells, hidden_hook

__all__ = [
    "SOURCE_LIMIT",
    "Compiler",
    "MeasuredRun",
    "PreparedCell",
    "Presenter",
    "Probe",
    "PythonCompiler",
    "ShellCompiler",
    "Statement",
    "error_text",
    "execute",
    "install_syntax_error_display",
    "interruptible",
    "prepare",
    "run_measured",
]

_run_ids = itertools.count(1)


class Probe(Protocol):
    """What the instrumented code calls: ``enter(i)`` when statement ``i`` starts."""

    def enter(self, index: int) -> None: ...


@dataclass
class PreparedCell:
    """A cell compiled and ready to run (see :func:`prepare`)."""

    filename: str
    statements: list[Statement]
    # every statement but a trailing expression: one code object per top-level statement,
    # compiled and run one after another as IPython runs a plain cell (see prepare)
    body: list[CodeType]
    last_expr: CodeType | None  # the trailing expression, evaluated for Out[n]
    hook_names: dict[str, str] = field(default_factory=dict)  # role -> builtins name
    # the error of the first statement that parsed but does not compile ('return' outside
    # function): raised by execute when the cell reaches it, as IPython does. ``body``
    # then ends with that statement's probe call, so a report charges the failure to it.
    compile_error: Exception | None = None


# ---------------------------------------------------------------------------------------------
# Compilers: what prepare asks of the place a cell comes from


class Compiler(Protocol):
    """The services :func:`prepare` needs to turn a cell's text into code: IPython's for a
    magic's cell (:class:`ShellCompiler`), plain Python's for a script (:class:`PythonCompiler`)."""

    @property
    def interactivity(self) -> str:
        """Which value the cell shows, as IPython's ``ast_node_interactivity`` says."""
        ...

    def transform_cell(self, cell: str) -> str:
        """The cell's text as the parser reads it (IPython syntax rewritten)."""
        ...

    def transform_ast(self, tree: ast.Module) -> ast.Module:
        """The parsed cell after the AST transformers."""
        ...

    def cache(self, shown: str, raw: str) -> str:
        """Keep ``shown`` where tracebacks and debuggers read source (linecache); the name
        to compile under. ``raw`` is what the user typed."""
        ...

    def parse(self, source: str, filename: str) -> ast.Module:
        """``source`` parsed; ``SyntaxError`` as the place's own parser reports it."""
        ...

    def compile(self, node: ast.Module | ast.Expression, filename: str, mode: str) -> CodeType:
        """``node`` compiled, under the ``__future__`` imports seen so far (and remembering
        new ones, as IPython and ``codeop`` do)."""
        ...


class ShellCompiler:
    """IPython's services, as a plain cell of ``shell`` gets them: its ``transform_cell``,
    ``transform_ast``, ``ast_node_interactivity``, and its ``compile`` (the cell cached
    under the "Cell In[n]" name, parsed and compiled under the shell's ``__future__``
    flags). Duck-typed: nothing of IPython is imported here."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    @property
    def interactivity(self) -> str:
        return str(getattr(self.shell, "ast_node_interactivity", "last_expr"))

    def transform_cell(self, cell: str) -> str:
        return str(self.shell.transform_cell(cell))

    def transform_ast(self, tree: ast.Module) -> ast.Module:
        return self.shell.transform_ast(tree)

    def cache(self, shown: str, raw: str) -> str:
        return str(self.shell.compile.cache(shown, _cell_number(self.shell), raw_code=raw))

    def parse(self, source: str, filename: str) -> ast.Module:
        return self.shell.compile.ast_parse(source, filename=filename)

    def compile(self, node: ast.Module | ast.Expression, filename: str, mode: str) -> CodeType:
        return self.shell.compile(node, filename, mode)


_FUTURE_FLAGS = functools.reduce(
    operator.or_, (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
)


class PythonCompiler:
    """Plain Python's services, for a cell given as a script's string: no IPython syntax, no
    AST transformers, the trailing expression's value returned. Code is compiled with none
    of the caller's ``__future__`` flags and remembers the cell's own (``codeop.Compile``'s
    rule: the statements are compiled one by one). The source is kept in linecache under
    ``<name-N>``, so tracebacks show its lines."""

    interactivity = "last_expr"
    _numbers = itertools.count(1)

    def __init__(self, name: str = "cell") -> None:
        self.name = name
        self.flags = 0  # the __future__ features the cell imported so far

    def transform_cell(self, cell: str) -> str:
        return cell

    def transform_ast(self, tree: ast.Module) -> ast.Module:
        return tree

    def cache(self, shown: str, raw: str) -> str:
        filename = f"<{self.name}-{next(self._numbers)}>"
        linecache.cache[filename] = (len(shown), None, shown.splitlines(keepends=True), filename)
        return filename

    def parse(self, source: str, filename: str) -> ast.Module:
        return compile(source, filename, "exec", self.flags | ast.PyCF_ONLY_AST, dont_inherit=True)

    def compile(self, node: ast.Module | ast.Expression, filename: str, mode: str) -> CodeType:
        code = compile(node, filename, mode, self.flags, dont_inherit=True)
        self.flags |= code.co_flags & _FUTURE_FLAGS
        return code


# ---------------------------------------------------------------------------------------------
# Syntax errors: show them as IPython shows a plain cell's


_SYNTAX_MARK = "_gpumagic_cell_syntax_error"


class _CellSyntaxTB:
    """Wraps the shell's SyntaxTB: for syntax errors in a magic's cell, drop the stack.

    IPython prints a plain cell's syntax error without any frames (it never ran). A cell
    magic's syntax error is raised from inside the magic, so IPython would list the magic
    machinery's frames above it. Errors we raise are marked; for those the stack is
    dropped and IPython's own formatter does the rest, so the display is identical.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def structured_traceback(
        self, etype: Any, value: Any, elist: Any, *args: Any, **kw: Any
    ) -> Any:
        if getattr(value, _SYNTAX_MARK, False):
            elist = []
        return self._inner.structured_traceback(etype, value, elist, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install_syntax_error_display(shell: Any) -> Callable[[], None]:
    """Install the syntax-error display on ``shell``; returns the function that undoes it."""
    current = getattr(shell, "SyntaxTB", None)
    if current is None or isinstance(current, _CellSyntaxTB):
        return lambda: None
    shell.SyntaxTB = _CellSyntaxTB(current)

    def undo() -> None:
        if isinstance(shell.SyntaxTB, _CellSyntaxTB):
            shell.SyntaxTB = shell.SyntaxTB._inner

    return undo


# ---------------------------------------------------------------------------------------------
# Preparing a cell


def prepare(
    compiler: Compiler,
    cell: str,
    header: str | None,
    *,
    instrument: bool = False,
    raise_compile_errors: bool = False,
) -> PreparedCell:
    """Transform, parse and compile ``cell``, with a probe hook before each statement if
    ``instrument``. ``header`` is the magic's own first line (without its newline) for a
    cell magic, whose body then starts at line 2; ``None`` for a line magic's statement or
    a script, which is line 1.

    A parse error raises ``SyntaxError`` here, pointing at the cell's own lines: nothing of
    the cell runs, as for a plain cell. A statement that parses but does not compile is
    kept for :func:`execute` to raise when the cell reaches it (``PreparedCell.compile_error``),
    as IPython does; ``raise_compile_errors`` raises it here instead (a dry run, which
    only predicts, has nothing to gain from running the statements before it).
    """
    __tracebackhide__ = True
    transformed = compiler.transform_cell(cell)
    prefix = "" if header is None else header + "\n"
    raw_source = prefix + cell
    raw_lines = source_lines(cell)
    code_lines = source_lines(transformed)
    # Tracebacks and the debugger read the cell from linecache. Show what the user typed
    # when the transform kept one line per line (it does for magics and !commands), else
    # the transformed text so that line numbers stay right.
    same_lines = len(raw_lines) == len(code_lines)
    filename = compiler.cache(raw_source if same_lines else prefix + transformed, raw_source)
    try:
        # A blank first line for the magic's own line: every node then carries the
        # line number the notebook shows.
        # The compiler's own parser: for a shell, the same flags (and __future__ imports of
        # earlier cells), so a syntax error reads exactly as it would in a plain cell.
        tree = compiler.parse("\n" * prefix.count("\n") + transformed, filename)
    except SyntaxError as err:
        setattr(err, _SYNTAX_MARK, True)
        raise
    tree = compiler.transform_ast(tree)

    statements: list[Statement] = []
    hook_names: dict[str, str] = {}
    if instrument:
        run_id = next(_run_ids)
        hook_names = {"enter": f"_gpumagic_enter_{run_id}", "loop": f"_gpumagic_loop_{run_id}"}
        instrumenter = Instrumenter(
            raw_lines, code_lines, hook_names, statements, first_line=1 + prefix.count("\n")
        )
        tree.body = instrumenter.block(tree.body, depth=0)

    body_nodes = list(tree.body)
    last_expr_node = _split_result(body_nodes, compiler.interactivity)
    body, last, error = _compile_units(
        compiler, filename, units(body_nodes, hook_names.get("enter")), last_expr_node
    )
    if error is not None and raise_compile_errors:
        raise error
    return PreparedCell(filename, statements, body, last, hook_names, error)


def _compile_units(
    compiler: Compiler,
    filename: str,
    unit_nodes: Iterable[list[ast.stmt]],
    last_expr: ast.expr | None,
) -> tuple[list[CodeType], CodeType | None, Exception | None]:
    """The code of each top-level statement (with its probe call), compiled one at a time as
    IPython's ``run_ast_nodes`` compiles a plain cell: a docstring before ``from __future__
    import ...``, or ``global x`` after ``x = 1``, compile alone but not as one module. The
    first that does not compile ends the list with its probe calls alone, and its error is
    returned (marked, to be shown as IPython shows a syntax error) instead of raised."""
    body: list[CodeType] = []
    unit: list[ast.stmt] = []
    try:
        for unit in unit_nodes:
            body.append(compiler.compile(ast.Module(body=unit, type_ignores=[]), filename, "exec"))
        unit = []
        last = (
            compiler.compile(ast.Expression(body=last_expr), filename, "eval")
            if last_expr is not None
            else None
        )
    # IPython catches anything here (a bad AST from a transformer fails with TypeError);
    # only a SyntaxError gets the plain cell's display
    except Exception as err:
        if isinstance(err, SyntaxError):
            setattr(err, _SYNTAX_MARK, True)
        probes = unit[:-1]  # the probe calls before the statement: see instrument.units
        if probes:
            body.append(compiler.compile(ast.Module(body=probes, type_ignores=[]), filename, "exec"))
        return body, None, err.with_traceback(None)
    return body, last, None


def _split_result(body: list[ast.stmt], interactivity: str) -> ast.expr | None:
    """Take off ``body`` the expression whose value the cell shows, as IPython's
    ``ast_node_interactivity`` says: the trailing expression by default, nothing for
    ``none``, the last assignment's target for ``last_expr_or_assign``. (``all`` shows
    only the last value here: a magic returns one value.)"""
    if not body or interactivity == "none":
        return None
    last = body[-1]
    if isinstance(last, ast.Expr):
        body.pop()
        return last.value
    if interactivity == "last_expr_or_assign":
        target = None
        if isinstance(last, ast.Assign) and len(last.targets) == 1:
            target = last.targets[0]
        elif isinstance(last, (ast.AugAssign, ast.AnnAssign)) and last.value is not None:
            target = last.target
        if isinstance(target, ast.Name):
            return ast.copy_location(ast.Name(id=target.id, ctx=ast.Load()), last)
    return None


def running_cell_number(shell: Any) -> int | None:
    """The ``In[n]`` number of the cell running now, read off the calling cell's code name
    (where IPython keeps it); None outside a cell (a script, a thread).

    ``shell.execution_count`` cannot say: IPython 9 increments it before a cell runs,
    8.x after.
    """
    names = getattr(shell.compile, "_filename_map", {})
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        number = names.get(frame.f_code.co_filename)
        if number is not None:
            return int(number)
        frame = frame.f_back
    return None


def _cell_number(shell: Any) -> int:
    """The number tracebacks show as "Cell In[n]" for the magic's cell."""
    number = running_cell_number(shell)
    return number if number is not None else int(getattr(shell, "execution_count", 0))


# ---------------------------------------------------------------------------------------------
# Running a prepared cell


def _loop_hook(enter: Callable[[int], None]) -> Callable[[int, Iterable[Any]], Iterator[Any]]:
    @hidden_hook
    def loop(index: int, iterable: Iterable[Any]) -> Iterator[Any]:
        it = iter(iterable)  # row ``index`` is open: enter() ran while evaluating the argument
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            yield item
            enter(index)

    return loop


def execute(
    namespace: dict[str, Any],
    prepared: PreparedCell,
    probe: Probe | None = None,
    *,
    local_ns: Mapping[str, Any] | None = None,
) -> Any:
    """Run ``prepared`` with ``namespace`` as its globals (and ``local_ns`` as its locals,
    when they differ, as in an embedded shell: IPython's ``user_global_ns`` and
    ``user_ns``); return the trailing expression's value.

    Exceptions from the cell propagate unchanged (the caller shows its partial report,
    then re-raises), and so does a statement's compile error once the statements before it
    ran. The probe hooks exist in ``builtins`` only while the cell runs.
    """
    __tracebackhide__ = True
    installed: list[str] = []
    try:
        if prepared.hook_names:
            if probe is None:
                raise ValueError("an instrumented cell needs a probe")
            hooks = {"enter": probe.enter, "loop": _loop_hook(probe.enter)}
            for role, name in prepared.hook_names.items():
                installed.append(name)  # first: the finally removes it whatever comes next
                setattr(builtins, name, hooks[role])
        glob, loc = namespace, namespace if local_ns is None else local_ns
        for code in prepared.body:
            exec(code, glob, loc)
        if prepared.compile_error is not None:
            # a fresh traceback each time: a cell may run more than once (--repeat)
            raise prepared.compile_error.with_traceback(None)
        if prepared.last_expr is not None:
            return eval(prepared.last_expr, glob, loc)
        return None
    finally:
        for name in installed:
            builtins.__dict__.pop(name, None)


# ---------------------------------------------------------------------------------------------
# A measured run: the one lifecycle of every magic that measures its cell

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
R_contra = TypeVar("R_contra", contravariant=True)


class MeasuredRun(Protocol[R_co]):
    """One cell measured from start to finish (``%%memtrace``, ``%%gpuprofile``); the order
    of the calls is :func:`run_measured`'s.

    * ``start()`` acquires what the measurement needs (open files, a temporary folder,
      torch's profiler, hooks) and returns the probe whose ``enter(i)`` runs before each
      statement (None for a cell prepared without instrumentation). It returns the probe
      rather than being one so that a statement boundary costs one call, not two. It may
      fail or be interrupted part way: what it acquired by then is released by ``stop`` and
      ``close``, which run all the same.
    * ``stop()`` ends the measuring the moment the cell ends (profiler off, hooks removed,
      the open statement closed), after a failure of ``start`` too; a failure of its own
      becomes a note of the result, never an exception.
    * ``finish(error)`` builds the result to show from what was measured; ``error`` is the
      cell's exception, or None. Not called when ``start`` failed: there is nothing to show.
      A failure of its own is said in the result; only an interrupt (see
      :func:`~gpumagic.interrupts.interruptible`) leaves it.
    * ``close()`` releases everything still held; always called, last.
    """

    def start(self) -> Probe | None: ...

    def stop(self) -> None: ...

    def finish(self, error: BaseException | None) -> R_co: ...

    def close(self) -> None: ...


class Presenter(Protocol[R_contra]):
    """The front end of a measured run: ``start()`` once the run started (a live view that
    draws the run's status), ``show(result)`` always, last (None when the run has nothing to
    show: its start failed, or its finishing was interrupted)."""

    def start(self) -> object: ...

    def show(self, result: R_contra | None) -> None: ...


def run_measured(
    namespace: dict[str, Any],
    prepared: PreparedCell,
    run: MeasuredRun[R],
    presenter: Presenter[R],
    *,
    local_ns: Mapping[str, Any] | None = None,
) -> Any:
    """Run ``prepared`` in ``namespace`` (and ``local_ns``) under ``run``, show the result
    with ``presenter``, return the cell's value (see :func:`execute`).

    * Every acquisition (``run.start``, ``presenter.start``) happens inside the region whose
      ``finally`` releases it (``run.stop``, ``run.close``, ``presenter.show``): an
      exception at any point of the run leaks nothing.
    * Ctrl-C: while the cell's own code runs it interrupts the cell, as without the magic.
      Around it, while resources change hands, it is held (a Python-level SIGINT handler
      that only records it: :class:`~gpumagic.interrupts.HeldInterrupts`) and delivered
      at the first safe point: as the cell starts, or once everything is released;
      ``finish`` may open :func:`~gpumagic.interrupts.interruptible` windows (a long
      analysis).
    * After the cell's error the partial result is shown, then the cell's exception
      propagates once, unchanged (its traceback, its line numbers; a Ctrl-C held meanwhile
      is dropped: the cell has ended already). When ``start`` fails, nothing is shown and
      its exception propagates once the run is released.
    """
    __tracebackhide__ = True
    error: BaseException | None = None
    value: Any = None
    result: R | None = None
    ran = False
    with HeldInterrupts() as held:
        try:
            try:
                try:
                    probe = run.start()
                    presenter.start()
                    ran = True
                    with held.let_through():
                        value = execute(namespace, prepared, probe, local_ns=local_ns)
                finally:
                    run.stop()
            except BaseException as exc:  # the cell's, or an interrupt of the run's start
                error = exc
            if ran:
                try:
                    result = run.finish(error)
                except BaseException as exc:  # interrupted while finishing
                    error = exc if error is None else error
        finally:
            try:
                run.close()
            finally:
                try:
                    presenter.show(result)
                except BaseException as exc:  # never in place of the cell's own error
                    error = exc if error is None else error
    if error is not None:
        # the traceback a plain cell would show: none of the runner's or the probe's frames
        raise as_the_cells(error, prepared.filename)
    try:
        held.deliver()
    except KeyboardInterrupt as exc:  # raised here, by the runner: no frame of it is the cell's
        raise exc.with_traceback(None) from None
    return value


def error_text(exc: BaseException, limit: int = 300) -> str:
    """``"ValueError: first line of its message"`` for a report. Never raises: a user's
    exception whose ``__str__`` raises (or returns a non-string) is named by its type. A
    syntax error gives its message alone, as IPython shows it: its ``str()`` adds the
    cell's internal file name, and the report names the line already."""
    name = type(exc).__name__
    try:
        msg = exc.msg if isinstance(exc, SyntaxError) else None
        text = (msg if isinstance(msg, str) and msg else str(exc)).strip()
    except Exception:
        return name
    first = text.splitlines()[0] if text else ""
    return (f"{name}: {first}" if first else name)[:limit]
