"""deploys/__init__.py: what it changes of pyinfra's CLI process, and that pyinfra still sees the
same call stack (file names and line numbers order every operation of a run)."""

from __future__ import annotations

import inspect
import sys


def test_pyinfra_reads_the_stack_without_source_lines() -> None:
    from pyinfra.api import util

    import deploys  # noqa: F401  (the package's import does it)

    ours, plain = util.stack(), inspect.stack()  # one line: the same line numbers
    assert [(f.filename, f.lineno, f.function) for f in ours] == [
        (f.filename, f.lineno, f.function) for f in plain
    ]
    assert all(f.code_context is None for f in ours)  # no source looked up
    assert plain[0].code_context is not None
    frame = sys._getframe()
    info, full = util.getframeinfo(frame), inspect.getframeinfo(frame)
    assert (info.filename, info.lineno) == (full.filename, full.lineno)
    assert info.code_context is None


def test_pyinfra_orders_operations_by_the_same_line_numbers() -> None:
    from pyinfra.api import util

    import deploys  # noqa: F401

    class State:
        current_deploy_filename = __file__
        current_op_file_number = 0

    def order() -> list[int]:
        return util.get_operation_order_from_stack(State())  # type: ignore[arg-type]

    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    numbers = order()
    assert numbers[-2:] == [line, line - 3]  # this test's line, then order()'s
